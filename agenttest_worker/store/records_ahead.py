"""Case records parsed while an embedded run goes on, for its aggregation at the end.

An embedded run's aggregation (fleet/aggregate.py, in the run's store process) reads
every record back and parses it to render the console report: for 1,000 single-turn
cases ~20 ms of the ~50 ms the run's end waited for its report (benchmarks/embedded.py).
The store's process is otherwise idle between two flushes: each flush's ended
conversations are parsed there once the flush's reply is out (store_child.after_reply),
and the aggregation takes them by their text (`take`), so that only a record read back
exactly as it was written is taken parsed; any other is parsed as before.

Only in a store's process (elsewhere the parsing would be the conversations' loss), and
at most LIMIT_CHARS of record text at a time: a large run's records are parsed at its
end as they always were, not held as objects (report/model.py StoredResults says why).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from agenttest_worker.results import CaseResult
from agenttest_worker.store.store_child import after_reply

# Record text kept parsed, all runs together (the objects take a few times as much).
LIMIT_CHARS = 8 << 20

_ahead: dict[str, dict[str, CaseResult]] = {}
_kept_chars = 0


def parse_later(run_id: str, texts: Iterable[str]) -> None:
    """In a store's process: parse the records `texts` of `run_id` once the current
    call's reply is out, as far as LIMIT_CHARS allows."""
    after_reply(functools.partial(_parse, run_id, list(texts)))


def _parse(run_id: str, texts: list[str]) -> None:
    global _kept_chars
    kept = _ahead.setdefault(run_id, {})
    for text in texts:
        if _kept_chars + len(text) > LIMIT_CHARS:
            return
        if text in kept:
            continue
        try:
            kept[text] = CaseResult.model_validate_json(text)
        except ValueError:
            continue  # (the aggregation reports it as it reads it)
        _kept_chars += len(text)


def take(run_id: str) -> dict[str, CaseResult]:
    """The records of `run_id` parsed so far, by their text; given once."""
    global _kept_chars
    kept = _ahead.pop(run_id, {})
    _kept_chars -= sum(len(text) for text in kept)
    return kept
