"""Reports over a run's results, on both paths (embedded and fleet).

- `formats`: the registry of report formats (`--format`), one module per format:
  `console`, `json`, `jsonl`, `table`, `tsv`, `junit`, `html` (with `html_page/`, the
  conversation pages the viewer shares);
- `report_model`: what every format renders (`RunReport`), `common` what they share;
- `aggregation`: once a run's conversations have ended, its reports built once and
  stored, streamed from the store;
- `verdicts` (repeated cases), `judges` (judge agreement), `usage_tally` (calls, tokens
  and cost by role), `diff` and `diff_formats` (what changed between two runs),
  `wording` (the words pages show for the codes records carry).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from agenttest_worker.report.common import (
    asked_question,
    case_count,
    counted,
    counted_cases,
    format_ms,
    one_line,
    printable,
)
from agenttest_worker.report.diff import (
    CATEGORIES,
    TITLES,
    CaseChange,
    Definitions,
    RunDiff,
    RunInfo,
    category,
    difference,
    tally_verdict,
)
from agenttest_worker.report.diff_formats import DIFF_FORMATS, render_diff
from agenttest_worker.report.formats import (
    REPORTERS,
    ChunkedReporter,
    Reporter,
    register,
    render,
    render_chunks,
)
from agenttest_worker.report.html_page.data import (
    RunData,
    case_row,
    record_notes,
    search_text,
    sort_rows,
)
from agenttest_worker.report.html_page.shell import page_end, page_start, policy
from agenttest_worker.report.report_model import DEFAULT_TITLE, RunReport, Summary
from agenttest_worker.report.usage_tally import ROLE_ORDER, UsageTally
from agenttest_worker.report.verdicts import case_verdict, grouped, pass_rule_problem
from agenttest_worker.report.wording import WORDS, worded_diff, worded_label, words

if TYPE_CHECKING:
    from agenttest_worker.report.aggregation import aggregate, build_report


# The aggregation reads and writes the store: imported when asked for, so that rendering
# a report needs no database library.
_LAZY = {
    "aggregate": "agenttest_worker.report.aggregation",
    "build_report": "agenttest_worker.report.aggregation",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CATEGORIES",
    "DEFAULT_TITLE",
    "DIFF_FORMATS",
    "REPORTERS",
    "ROLE_ORDER",
    "TITLES",
    "WORDS",
    "CaseChange",
    "ChunkedReporter",
    "Definitions",
    "Reporter",
    "RunData",
    "RunDiff",
    "RunInfo",
    "RunReport",
    "Summary",
    "UsageTally",
    "aggregate",
    "asked_question",
    "build_report",
    "case_count",
    "case_row",
    "case_verdict",
    "category",
    "counted",
    "counted_cases",
    "difference",
    "format_ms",
    "grouped",
    "one_line",
    "page_end",
    "page_start",
    "pass_rule_problem",
    "policy",
    "printable",
    "record_notes",
    "register",
    "render",
    "render_chunks",
    "render_diff",
    "search_text",
    "sort_rows",
    "tally_verdict",
    "worded_diff",
    "worded_label",
    "words",
]
