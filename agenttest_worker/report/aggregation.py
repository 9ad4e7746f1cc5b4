"""The aggregator: once every conversation of a run has ended, build its reports once.

Claimed with a guarded UPDATE, so two conversations finishing at the same moment (or a
redelivered aggregation task) still produce exactly one aggregation.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from agenttest_worker.observe import tracing
from agenttest_worker.report.formats import render_chunks
from agenttest_worker.report.report_model import Budget, RunReport, StoredResults
from agenttest_worker.store.sql import run_results as results
from agenttest_worker.store.sql import runs
from agenttest_worker.store.sql.agent_spans import spans_of_run
from agenttest_worker.store.sql.judge_labels import unstable_criteria
from agenttest_worker.store.sql.usage import stored_usage

# What every run keeps; any other format (`report RUN --format ...`) is rendered from
# the stored records when asked for.
STORED_FORMATS = ("jsonl", "console")


def build_report(url: str, run_id: str, *, verbose: bool = False, color: bool = False) -> RunReport:
    run = runs.get_run(url, run_id)
    if run is None:
        raise LookupError(f"no run {run_id}")
    # Read again from the store by each pass over them: never held whole.
    records = StoredResults(
        lambda: results.iter_result_texts(url, run_id),
        results.count_results(url, run_id),
        results.flaky_cases(url, run_id),
        # Read once per run: what its newest audit of the judges found unstable.
        frozenset(u.criterion for u in unstable_criteria(url, run_id)),
    )
    started = run.started_at or run.created_at
    finished = run.finished_at or datetime.now(UTC)
    if started is not None and started.tzinfo is None:
        started = started.replace(tzinfo=UTC)
    if finished.tzinfo is None:
        finished = finished.replace(tzinfo=UTC)
    duration = (finished - started).total_seconds() if started else 0.0
    return RunReport(
        results=records,
        agent=run.agent,
        input_label=run.input_label or "",
        # --repeat auto counts what was played: its run's total counts chains of
        # repetitions (store/repetition_chain.py).
        total_cases=run.passed + run.failed + run.skipped
        if (run.options or {}).get("repeat_auto")
        else run.total_cases,
        duration_s=max(duration, 0.0),
        verbose=verbose,
        run_id=run_id,
        color=color,
        budget=_budget(run.options or {}, run.total_tokens, run.total_cost),
        pass_rule=(run.options or {}).get("pass_rule") or "all",
        pass_k=(run.options or {}).get("pass_k"),
        distinct_cases=(run.options or {}).get("distinct_cases"),
        # No case of the run repeats: nothing lists each case's verdict.
        keep_once=(run.options or {}).get("distinct_cases") is not None,
        repeat_auto=bool((run.options or {}).get("repeat_auto")),
        # What the run used outside its conversations (its records hold the rest).
        run_usage=stored_usage(run.usage),
        agent_spans=spans_of_run(url, run_id),
    )


def _budget(options: dict[str, Any], tokens: int | None, cost: float | None) -> Budget | None:
    """The run's budget and what it used, when it had one: a budgeted run's totals are
    counted per turn (driver/budget_counting.py), so they are its use."""
    max_tokens, max_cost = options.get("max_tokens"), options.get("max_cost")
    if max_tokens is None and max_cost is None:
        return None
    return Budget(max_tokens, max_cost, tokens or 0, cost or 0.0)


def aggregate(url: str, run_id: str, *, lease_seconds: float | None = None) -> RunReport | None:
    """Build and store the run's reports if this caller wins the claim.

    Returns the report built (the caller that waited for the run may print it without
    reading the results again), or None when another aggregator has the claim.
    `lease_seconds` is how long another aggregator's claim is respected (see
    `results.claim_aggregation`); `resume`, run by a person who knows the run stopped,
    passes 0 to take over an aggregation that died at once.
    """
    if not results.claim_aggregation(url, run_id, lease_seconds=lease_seconds):
        return None
    report = build_report(url, run_id)
    # Rendered as they are stored, in parts: a large run's reports are never held whole
    # (store/sql/report_copy.py). A caller printing one with the stored defaults reads
    # it back (results.report_parts) instead of rendering it again.
    results.complete_run(url, run_id, {fmt: render_chunks(fmt, report) for fmt in STORED_FORMATS})
    _run_span(run_id, report)
    return report


def _run_span(run_id: str, report: RunReport) -> None:
    """The run's span (observe/tracing.py), emitted once, by the aggregation that won."""
    ended_ns = time.time_ns()
    attributes = {
        "agenttest.run.cases": report.total_cases,
        "agenttest.run.agent": report.agent or "",
    }
    tracing.end_run(run_id, ended_ns - int(report.duration_s * 1e9), attributes)
