"""People's labels of judged verdicts, and judge audits, in the store.

A label is kept once per person and spot: labelling again replaces the earlier one
(the newest counts), so that a person who changes their mind is not counted twice.
An audit keeps the document `audit-judges --format json` prints; the newest audit of a
run says which of its criteria were unstable (`unstable_criteria`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select

from agenttest_worker.store.sql.db import session_scope
from agenttest_worker.store.sql.models import JudgeAuditRow, JudgeLabelRow


@dataclass(frozen=True)
class StoredLabel:
    case_id: str
    turn: int  # 0: the conversation's final assertions
    position: int  # the assertion's position among its turn's, from 1
    criterion: str
    judge_verdict: bool
    label: bool
    note: str | None = None
    labelled_by: str | None = None
    created_at: datetime | None = None


def add_label(url: str, run_id: str, label: StoredLabel) -> None:
    """Keep `label`, replacing the same person's earlier label of the same spot."""
    with session_scope(url) as session:
        session.execute(
            delete(JudgeLabelRow).where(
                JudgeLabelRow.run_id == run_id,
                JudgeLabelRow.case_id == label.case_id,
                JudgeLabelRow.turn == label.turn,
                JudgeLabelRow.position == label.position,
                JudgeLabelRow.labelled_by.is_(None)
                if label.labelled_by is None
                else JudgeLabelRow.labelled_by == label.labelled_by,
            )
        )
        session.add(
            JudgeLabelRow(
                run_id=run_id,
                case_id=label.case_id,
                turn=label.turn,
                position=label.position,
                criterion=label.criterion,
                judge_verdict=label.judge_verdict,
                label=label.label,
                note=label.note,
                labelled_by=label.labelled_by,
            )
        )


def labels_of(url: str, run_id: str) -> list[StoredLabel]:
    """Every label of the run, oldest first."""
    query = (
        select(JudgeLabelRow)
        .where(JudgeLabelRow.run_id == run_id)
        .order_by(JudgeLabelRow.created_at, JudgeLabelRow.id)
    )
    with session_scope(url) as session:
        return [
            StoredLabel(
                r.case_id,
                r.turn,
                r.position,
                r.criterion,
                r.judge_verdict,
                r.label,
                r.note,
                r.labelled_by,
                r.created_at,
            )
            for r in session.scalars(query)
        ]


def save_audit(url: str, run_id: str, times: int, result: dict[str, Any]) -> None:
    with session_scope(url) as session:
        session.add(JudgeAuditRow(run_id=run_id, times=times, result=result))


def latest_audit(url: str, run_id: str) -> dict[str, Any] | None:
    """The newest audit of the run, as it was printed in JSON (None: never audited)."""
    query = (
        select(JudgeAuditRow.result)
        .where(JudgeAuditRow.run_id == run_id)
        .order_by(JudgeAuditRow.id.desc())
        .limit(1)
    )
    with session_scope(url) as session:
        found = session.scalar(query)
    return dict(found) if found is not None else None


@dataclass(frozen=True)
class UnstableCriterion:
    """A criterion whose verdicts the audit saw change on the same transcripts."""

    criterion: str
    flip_rate: float
    # (case id, turn, position) of each judged verdict that flipped; turn 0: final.
    flips: tuple[tuple[str, int, int], ...]


def unstable_criteria(url: str, run_id: str) -> list[UnstableCriterion]:
    """The criteria the newest audit of `run_id` found unstable, with the spots that
    flipped; empty when the run was never audited or nothing flipped enough."""
    found = latest_audit(url, run_id)
    if found is None:
        return []
    return [
        UnstableCriterion(
            str(c["name"]),
            float(c["flip_rate"]),
            tuple((str(f["case_id"]), int(f["turn"]), int(f["position"])) for f in c["flips"]),
        )
        for c in found.get("unstable", [])
    ]
