"""`agenttest-submit audit-judges RUN [--times N] [--format console|json] [-o FILE]`: ask
every judge of a stored run again, N times, on the same conversations, and say how
often their verdicts change, and how they agree with people's labels.

Each asking is a re-evaluation (driver `reevaluate`, as `--reeval` does): no target
agent is called, the stored replies are judged again with the run's own case
definitions and agenttest.yaml. The judges are called from this process, on an
embedded run's SQLite store and on a fleet's Postgres alike, through an agent pool
with no reply cache: a cached verdict would only repeat the first one. The
statistics are report/audit_stats.py's; the audit is printed and kept in the store
(judge_audits), the newest one of a run read back by `store.unstable_criteria`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from agenttest_submit.cli.request import AuditRequest
from agenttest_submit.cli.stopping import run_async
from agenttest_worker.agents import AgentPool, ProjectConfig, close_session, config_from_stored
from agenttest_worker.cases import Case
from agenttest_worker.driver import reevaluate
from agenttest_worker.engine import ConversationState
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.report import (
    UNSTABLE_FLIP_RATE,
    Audit,
    Judged,
    Label,
    Spot,
    audit,
    judged_spots,
    printable,
)
from agenttest_worker.store import RunRow, StoredConversation, judge_labels, stored_conversations


def audit_command(url: str, run: RunRow, request: AuditRequest) -> int:
    stored = sorted(stored_conversations(url, run_id=run.id).values(), key=lambda s: s.seq)
    if not stored:
        raise InputError(
            InputProblem(f"run {run.id} has no finished conversations to audit", field="RUN")
        )
    config = config_from_stored(run.config or {})
    print(
        f"run {run.id}: asking the judges of {len(stored)} conversation(s) again, "
        f"{request.times} time(s) (no target is called)",
        file=sys.stderr,
        flush=True,
    )
    askings = run_async(_askings(stored, config, request.times, request.parallel))
    if not askings[0]:
        raise InputError(
            InputProblem(f"run {run.id} has no judged (agent) assertion to audit", field="RUN")
        )
    labels = [
        Label(Spot(s.case_id, s.turn, s.position), s.criterion, s.judge_verdict, s.label)
        for s in judge_labels.labels_of(url, run.id)
    ]
    found = audit(run.id, askings, labels)
    document = found.document()
    judge_labels.save_audit(url, run.id, request.times, document)
    if request.format == "json":
        text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    else:
        text = audit_text(found)
    if request.output:
        Path(request.output).write_text(text, encoding="utf-8")
        print(f"audit written to {request.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


async def _askings(
    stored: list[StoredConversation], config: ProjectConfig, times: int, parallel: int
) -> list[dict[Spot, Judged]]:
    """The stored verdicts of every conversation, then `times` fresh askings of them."""
    default_judge = config.defaults.judge
    cases = [Case.model_validate(s.case) for s in stored]
    states = [ConversationState.model_validate(s.state) for s in stored]
    askings: list[dict[Spot, Judged]] = [{} for _ in range(times + 1)]
    # A conversation's key is the stored one: a repetition's (ID#N) is not in its case.
    keys = [s.case_id for s in stored]
    for key, state in zip(keys, states, strict=True):
        askings[0].update(judged_spots(key, state.turns, state.final_assertions, default_judge))
    if not askings[0]:
        return askings[:1]  # nothing judged: nothing to ask again
    # No reply cache (`replies` unset): every judge is called again.
    pool = AgentPool(config)
    work = iter([(i, a) for i in range(len(stored)) for a in range(1, times + 1)])

    async def lane() -> None:
        for index, asking in work:
            again = await reevaluate(cases[index], states[index], pool)
            askings[asking].update(
                judged_spots(keys[index], again.turns, again.final_assertions, default_judge)
            )

    try:
        lanes = max(1, min(parallel, len(stored) * times))
        await asyncio.gather(*(lane() for _ in range(lanes)))
    finally:
        await close_session()
    return askings


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def audit_text(found: Audit) -> str:
    """The audit for people: by criterion, by judge, the unstable criteria with the
    transcripts that flipped, and the agreement with people's labels."""
    lines = [
        f"Judge audit of run {found.run_id}: {found.items} judged verdict(s), each asked "
        f"{found.times} more time(s) on the same transcript",
        "",
    ]
    for title, rows in (("Criterion", found.criteria), ("Judge", found.judges)):
        width = max([len(title), *(len(printable(name)) for name in rows)])
        lines.append(f"{title:<{width}}  items  flipped  flip rate  agreement")
        for name, row in rows.items():
            mark = "  UNSTABLE" if row.unstable else ""
            lines.append(
                f"{printable(name):<{width}}  {row.items:>5}  {row.flipped:>7}  "
                f"{_share(row.flip_rate):>9}  {_share(row.agreement):>9}{mark}"
            )
        lines.append("")
    unanswered = sum(c.unanswered for c in found.criteria.values())
    if unanswered:
        lines += [f"{unanswered} asking(s) gave no verdict: every judge call failed.", ""]
    unstable = found.unstable()
    if unstable:
        lines.append(f"Unstable criteria (verdicts flipped on over {UNSTABLE_FLIP_RATE:.0%}):")
        for row in unstable:
            flips = ", ".join(printable(s.shown()) for s in sorted(row.flips))
            lines.append(f"  {printable(row.name)}: flipped on {flips}")
    else:
        lines.append("No unstable criterion.")
    lines.append("")
    if not found.people_criteria:
        lines.append("No labels yet: agenttest-submit label RUN CASE TURN pass|fail")
        return "\n".join(lines) + "\n"
    for title, labelled in (
        ("Criterion", found.people_criteria),
        ("Judge", found.people_judges),
    ):
        width = max([len(title), *(len(printable(name)) for name in labelled)])
        lines.append(f"{title + ' vs people':<{width + 11}}  labels  agreement  kappa")
        for name, people in labelled.items():
            kappa = "-" if people.kappa is None else f"{people.kappa:.2f}"
            lines.append(
                f"{printable(name):<{width + 11}}  {len(people.pairs):>6}  "
                f"{_share(people.raw):>9}  {kappa:>5}"
            )
        lines.append("")
    return "\n".join(lines)
