"""Reports over a run's results, on both paths (embedded and fleet).

- `formats`: the registry of report formats (`--format`), one module per format:
  `console`, `json`, `jsonl`, `table`, `tsv`, `junit`, `html`, `markdown` (with `html_page/`, the
  conversation pages the viewer shares);
- `report_model`: what every format renders (`RunReport`), `common` what they share;
- `aggregation`: once a run's conversations have ended, its reports built once and
  stored, streamed from the store;
- `verdicts` (repeated cases), `judges` (judge agreement), `audit_stats` (a judge
  audit's flip rates and agreement, and Cohen's kappa against people's labels),
  `usage_tally` (calls, tokens and cost by role), `diff` and `diff_formats` (what
  changed between two runs), `target_columns` and `target_comparison` (a run of several
  targets: each case's verdict on each, and two of them compared), `significance`
  (the noise-aware gate's statistics), `causes` (why cases failed),
  `wording` (the words pages show for the codes records carry).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from agenttest_worker.report.audit_stats import (
    FINAL_TURN,
    UNSTABLE_FLIP_RATE,
    Audit,
    Judged,
    Label,
    Spot,
    audit,
    cohen_kappa,
    judged_at,
    judged_spots,
)
from agenttest_worker.report.causes import (
    FLAKES,
    audited_cause,
    causes_line,
    flake_cause,
    in_order,
    read_cause,
)
from agenttest_worker.report.common import (
    asked_question,
    case_count,
    counted,
    counted_cases,
    format_ms,
    one_line,
    printable,
    problems,
)
from agenttest_worker.report.console import case_text
from agenttest_worker.report.diff import (
    CATEGORIES,
    TITLES,
    CaseChange,
    Definitions,
    RunDiff,
    RunInfo,
    category,
    difference,
    gated_category,
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
from agenttest_worker.report.html_page.waterfall import trace_notes
from agenttest_worker.report.repeat_stopping import START_WIDTH, next_repetition, wilson_interval
from agenttest_worker.report.report_model import DEFAULT_TITLE, RunReport, Summary
from agenttest_worker.report.significance import (
    DEFAULT_CONFIDENCE,
    PassRates,
    confidence_problem,
    drop_p_value,
)
from agenttest_worker.report.target_columns import TargetRow, target_rows
from agenttest_worker.report.target_comparison import played_targets, target_diff
from agenttest_worker.report.usage_tally import ROLE_ORDER, UsageTally
from agenttest_worker.report.verdicts import case_verdict, grouped, pass_rule_problem
from agenttest_worker.report.wording import WORDS, worded_diff, worded_label, words

if TYPE_CHECKING:
    from agenttest_worker.report.aggregation import STORED_FORMATS, aggregate, build_report


# The aggregation reads and writes the store: imported when asked for, so that rendering
# a report needs no database library.
_LAZY = {
    "STORED_FORMATS": "agenttest_worker.report.aggregation",
    "aggregate": "agenttest_worker.report.aggregation",
    "build_report": "agenttest_worker.report.aggregation",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CATEGORIES",
    "DEFAULT_CONFIDENCE",
    "DEFAULT_TITLE",
    "DIFF_FORMATS",
    "FINAL_TURN",
    "FLAKES",
    "REPORTERS",
    "ROLE_ORDER",
    "START_WIDTH",
    "STORED_FORMATS",
    "TITLES",
    "UNSTABLE_FLIP_RATE",
    "WORDS",
    "Audit",
    "CaseChange",
    "ChunkedReporter",
    "Definitions",
    "Judged",
    "Label",
    "PassRates",
    "Reporter",
    "RunData",
    "RunDiff",
    "RunInfo",
    "RunReport",
    "Spot",
    "Summary",
    "TargetRow",
    "UsageTally",
    "aggregate",
    "asked_question",
    "audit",
    "audited_cause",
    "build_report",
    "case_count",
    "case_row",
    "case_text",
    "case_verdict",
    "category",
    "causes_line",
    "cohen_kappa",
    "confidence_problem",
    "counted",
    "counted_cases",
    "difference",
    "drop_p_value",
    "flake_cause",
    "format_ms",
    "gated_category",
    "grouped",
    "in_order",
    "judged_at",
    "judged_spots",
    "next_repetition",
    "one_line",
    "page_end",
    "page_start",
    "pass_rule_problem",
    "played_targets",
    "policy",
    "printable",
    "problems",
    "read_cause",
    "record_notes",
    "register",
    "render",
    "render_chunks",
    "render_diff",
    "search_text",
    "sort_rows",
    "tally_verdict",
    "target_diff",
    "target_rows",
    "trace_notes",
    "wilson_interval",
    "worded_diff",
    "worded_label",
    "words",
]
