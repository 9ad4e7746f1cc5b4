"""The process that checks the second half of a large case file (see split_check.py).

    python -m agenttest_submit.check_part SPOOL_FD EVENTS_FD  < pickled PartJob

It writes the spool lines of the cases it keeps to SPOOL_FD and, to EVENTS_FD, its
events in input order (pickled lists of at most EVENT_BATCH), then its `PartTotals`.
Exit 0 when it did its part; any other code (and no output worth reading) when not,
and the submitter then checks the part itself. It prints nothing: its problems are
reported by the submitter, in the user's terms.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

from agenttest_submit.split_check import EVENT_BATCH, Event, PartJob, PartTotals
from agenttest_submit.spool_lines import SpoolWriter
from agenttest_worker.assertions import assertion_types
from agenttest_worker.cases.files import iter_line_cases
from agenttest_worker.errors import InputProblem
from agenttest_worker.heap import settle

# Exit codes: it did its part; it does not know every assertion type the submitter does.
DONE, UNLIKE = 0, 3


def check_part(job: PartJob, spool_fd: int, events_fd: int) -> int:
    if job.assertion_types != assertion_types():
        return UNLIKE
    with os.fdopen(spool_fd, "wb") as spool, os.fdopen(events_fd, "wb") as events:
        writer = SpoolWriter(spool, job.shape)
        check = job.checker.check
        batch: list[Event] = []
        for item in iter_line_cases(Path(job.path), job.start, None, job.first_line):
            if isinstance(item, InputProblem):
                batch.append(item)
            else:
                problems: list[InputProblem] = []
                warnings: list[str] = []
                case = check(item, problems, warnings)
                if case is not None:
                    writer.add(case)
                line = item.source_line or 0
                if problems or warnings:
                    batch.append((item.id, line, case is not None, problems, warnings))
                else:
                    batch.append((item.id, line, case is not None))
            if len(batch) == EVENT_BATCH:
                pickle.dump(batch, events, pickle.HIGHEST_PROTOCOL)
                batch = []
        pickle.dump(batch, events, pickle.HIGHEST_PROTOCOL)
        totals = PartTotals(writer.cases, writer.conversations, writer.repeated)
        pickle.dump(totals, events, pickle.HIGHEST_PROTOCOL)
    return DONE


def main() -> int:
    settle()  # start-up is over: see heap.py
    try:
        job = pickle.load(sys.stdin.buffer)
        return check_part(job, int(sys.argv[1]), int(sys.argv[2]))
    except BaseException:  # the submitter checks the part itself: see the module's note
        return 1


if __name__ == "__main__":
    sys.exit(main())
