"""Reading the spool's lines back as the records a run stores (spool_lines.py writes
them)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO

from agenttest_worker.store.steps import CaseText, StoredCase


def spooled_records(handle: IO[bytes]) -> Iterator[StoredCase]:
    """(conversation key, agent, record as the text a run stores) of each line of
    `handle`, from where it stands."""
    for line in handle:
        head, _, record = line.partition(b"\t")
        case_id, agent, test_id = json.loads(head)
        yield case_id, agent, CaseText(record[:-1].decode("ascii"), test_id)
