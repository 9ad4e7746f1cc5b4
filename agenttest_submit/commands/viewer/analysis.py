"""What the viewer's analysis pages read: each suite's trend, and two runs compared.

A trend point is one finished run: its pass rate (of its conversations: with repeated
cases each repetition is a sample, and the point carries the Wilson score interval of
that rate), its cost (runs.total_cost) and how many of its cases were flaky (their
repetitions disagreed). A comparison is the `diff` command's (report/diff.py) between
any two runs, each case joined with its rows of both runs' case tables (tags, agent,
cause, checks) so that the page can filter it, and labelled "then | now" when both
runs are of one suite and agent, else "A | B" after each run's agent. Two targets of one
run (`-n A -n B`) compare the same way (`diff RUN --targets A B`), labelled "A | B"
after the targets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agenttest_worker.report import (
    CATEGORIES,
    TITLES,
    RunInfo,
    played_targets,
    target_diff,
    wilson_interval,
    worded_diff,
)
from agenttest_worker.store import results, runs
from agenttest_worker.store import run_history as history

if TYPE_CHECKING:
    from agenttest_submit.commands.viewer.queries import RunViews
    from agenttest_worker.store import RunRow

# Runs per suite a trend draws (the newest).
TREND_RUNS = 30


def wilson(passed: int, total: int) -> tuple[float, float]:
    """The Wilson score interval (95%) of `passed` out of `total`, as a trend draws it."""
    low, high = wilson_interval(passed, total)
    # (Rounded: 10 of 10 gives 1 as its upper bound, not 0.9999999999999999.)
    return (round(low, 6), round(high, 6))


def trend_point(url: str, run: RunRow) -> dict[str, Any]:
    """One run of a trend (oldest first in the list the page draws)."""
    total = run.passed + run.failed + run.skipped
    repeated = (run.options or {}).get("distinct_cases") is not None
    flaky = 0
    if repeated:
        flaky = sum(
            1
            for t in history.case_tallies(url, run.id)
            if t.played > 1 and t.passed not in (0, t.played)
        )
    point: dict[str, Any] = {
        "id": run.id,
        "created_at": run.created_at.strftime("%Y-%m-%d %H:%M") if run.created_at else "",
        "agent": run.agent or "",
        "passed": run.passed,
        "total": total,
        "rate": run.passed / total if total else None,
        "cost": float(run.total_cost or 0.0),
        "flaky": flaky,
        "repeated": repeated,
    }
    if repeated and total:
        point["low"], point["high"] = wilson(run.passed, total)
    return point


def trends(url: str, groups: list[dict[str, Any]]) -> None:
    """Each group of the runs page gains its `trend`: its newest finished runs, oldest
    first (the runs listed are already read; only a repeated run's tallies are read)."""
    for group in groups:
        ids = [r["id"] for r in group["runs"] if r["status"] == "done"][:TREND_RUNS]
        found = [runs.get_run(url, run_id) for run_id in reversed(ids)]
        group["trend"] = [trend_point(url, run) for run in found if run is not None]


def labels(a: RunRow, b: RunRow) -> tuple[str, str]:
    """How the two sides are called: then | now for two runs of one suite and agent (the
    older first), else A | B after each run's agent."""
    if a.suite == b.suite and a.agent == b.agent:
        return ("then", "now")
    return (f"A: {a.agent or a.id}", f"B: {b.agent or b.id}")


def pair_labels(url: str, a_id: str, b_id: str) -> dict[str, Any] | None:
    """The two sides' labels and runs (the side-by-side page's heading)."""
    a, b = runs.get_run(url, a_id), runs.get_run(url, b_id)
    if a is None or b is None:
        return None
    return {"labels": list(labels(a, b)), "runs": [_side(a), _side(b)]}


def compare(views: RunViews, a_id: str, b_id: str) -> dict[str, Any] | None:
    """Run `a_id` against run `b_id`, case by case; None: either run does not exist."""
    from agenttest_submit.commands.run_diffs import build_diff

    url = views.url
    a, b = runs.get_run(url, a_id), runs.get_run(url, b_id)
    if a is None or b is None:
        return None
    found = worded_diff(build_diff(url, a, b).as_dict())
    rows_a = {r["id"]: r for r in views.rows(a_id) or []}
    rows_b = {r["id"]: r for r in views.rows(b_id) or []}
    for case in found["cases"]:
        row = rows_b.get(case["id"]) or rows_a.get(case["id"]) or {}
        case["tags"] = row.get("tags", [])
        case["agent"] = row.get("agent", "")
        case["checks"] = row.get("checks", [])
        case["flaky"] = bool(row.get("flaky")) or case["category"] == "flaky"
        if row.get("cause"):
            case["cause"] = row["cause"]
        if not case.get("name"):
            case["name"] = row.get("name") or ""
    left, right = labels(a, b)
    return {
        **found,
        "titles": TITLES,
        "order": list(CATEGORIES),
        "labels": [left, right],
        "runs": [_side(a), _side(b)],
    }


def compare_targets(views: RunViews, run_id: str, a: str, b: str) -> dict[str, Any] | None:
    """Target `a` of run `run_id` against its target `b`, case by case; None: no such
    run; only a `message` when the run played no such target."""
    url = views.url
    run = runs.get_run(url, run_id)
    if run is None:
        return None
    played = played_targets(results.iter_results(url, run_id))
    missing = [t for t in (a, b) if t not in played]
    if missing or a == b:
        said = ", ".join(missing) if missing else a
        return {"message": f"run {run_id} has no two targets {said!r} to compare"}
    info = RunInfo(run.id, run.created_at, run.suite, run.status)
    rule = str((run.options or {}).get("pass_rule") or "all")
    found = worded_diff(target_diff(info, results.iter_results(url, run_id), a, b, rule).as_dict())
    rows = {(r["id"], r["agent"]): r for r in views.rows(run_id) or []}
    for case in found["cases"]:
        row = rows.get((case["id"], b)) or rows.get((case["id"], a)) or {}
        case["tags"] = row.get("tags", [])
        case["agent"] = row.get("agent", "")
        case["checks"] = row.get("checks", [])
        case["flaky"] = bool(row.get("flaky")) or case["category"] == "flaky"
        if not case.get("name"):
            case["name"] = row.get("name") or ""
    side = _side(run)
    return {
        **found,
        "titles": TITLES,
        "order": list(CATEGORIES),
        "labels": [f"A: {a}", f"B: {b}"],
        "runs": [{**side, "agent": a}, {**side, "agent": b}],
    }


def _side(run: RunRow) -> dict[str, Any]:
    return {
        "id": run.id,
        "agent": run.agent or "",
        "suite": run.suite or "",
        "created_at": run.created_at.strftime("%Y-%m-%d %H:%M") if run.created_at else "",
    }
