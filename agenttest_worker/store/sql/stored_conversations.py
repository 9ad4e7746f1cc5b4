"""Stored conversations looked up by case id: what re-evaluation re-judges."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from agenttest_worker.store.sql.db import session_scope
from agenttest_worker.store.sql.models import CaseRow, RunRow

# Ids per query: well under every driver's limit on bound parameters.
CHUNK = 500


@dataclass(frozen=True)
class StoredConversation:
    run_id: str
    case_id: str
    case: dict[str, Any]
    agent: str | None
    state: dict[str, Any]
    seq: int


def stored_conversations(
    url: str, case_ids: Iterable[str] | None = None, run_id: str | None = None
) -> dict[str, StoredConversation]:
    """Finished conversations by case id: those of `run_id`, or the newest of each id.

    With `case_ids`, only those; without, every conversation of `run_id`. The newest of
    each id is picked by the database, so a case run every night for a year costs one
    row here, not one per night.
    """
    wanted = list(dict.fromkeys(case_ids)) if case_ids is not None else None
    if wanted is not None and not wanted:
        return {}
    finished = (CaseRow.phase == "done", CaseRow.state.is_not(None))
    found: dict[str, StoredConversation] = {}
    chunks: list[list[str] | None] = (
        [wanted[i : i + CHUNK] for i in range(0, len(wanted), CHUNK)] if wanted else [None]
    )
    for chunk in chunks:
        if run_id is not None:
            query = select(CaseRow).where(CaseRow.run_id == run_id, *finished)
            if chunk is not None:
                query = query.where(CaseRow.case_id.in_(chunk))
        else:
            # Rank each id's conversations newest run first; keep rank 1.
            rank = (
                func.row_number()
                .over(
                    partition_by=CaseRow.case_id,
                    order_by=(RunRow.created_at.desc(), RunRow.id.desc()),
                )
                .label("rank")
            )
            ranked = (
                select(CaseRow.run_id, CaseRow.case_id, rank)
                .join(RunRow, RunRow.id == CaseRow.run_id)
                .where(*finished)
            )
            if chunk is not None:
                ranked = ranked.where(CaseRow.case_id.in_(chunk))
            newest = ranked.subquery()
            query = select(CaseRow).join(
                newest,
                (newest.c.run_id == CaseRow.run_id)
                & (newest.c.case_id == CaseRow.case_id)
                & (newest.c.rank == 1),
            )
        with session_scope(url) as session:
            for row in session.scalars(query):
                assert row.state is not None  # filtered above
                found[row.case_id] = StoredConversation(
                    row.run_id, row.case_id, row.case, row.agent, row.state, row.seq
                )
    return found
