"""The exit codes of `agenttest-submit` (an interrupted run's, 130 and 143, are in stopping.py).

0 nothing failed, 1 a case failed, 2 a usage or input error (nothing was run, or the
results could not be written where asked), 3 the database or the broker out of reach,
or an internal error.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INPUT = 2
EXIT_INTERNAL = 3
