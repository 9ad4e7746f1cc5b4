"""The result store's tables (SQLAlchemy 2). Postgres at scale, SQLite when embedded.

- runs: one submission: its options, inputs, who/when, counts and status, and what it
  used outside its conversations.
- cases: one conversation: the normalized case, its engine state between turns, its
  final record. `next_turn` is the turn the next task must run; saving a turn moves it
  on only if it still holds the expected value, which is what makes a redelivered or
  duplicated task a no-op.
- turns, assertion_results, agent_calls: one row per turn / assertion / call, keyed by
  (run, case, turn, ...) so that an insert repeated by a retried task does nothing.
- turn_records: a conversation's earlier turns' results while it runs, one row each,
  so that a step rewrites only what is new of its state (driver/state_cache.py).
- run_reports: the aggregator's reports, stored with the run.
- reply_cache: agents' replies kept to be served again, by the sha256 of what
  determines them, shared by every run (store/sql/cached_replies.py).
- judge_labels, judge_audits: people's verdicts on a run's judged assertions, and
  the judge audits of a run (store/sql/judge_labels.py).
- agent_spans: the spans agents sent of their conversations' traces (OTLP, received
  by driver/span_intake.py), read by trace assertions and shown with their turns.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    func,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeEngine


class _Jsonb(TypeDecorator[Any]):
    """Postgres's `jsonb`, named without importing SQLAlchemy's Postgres dialect.

    Importing `sqlalchemy.dialects.postgresql` for its JSONB class loads every Postgres
    driver module, which an embedded run on SQLite would pay for at start-up; the dialect is
    imported only when a Postgres database compiles or binds the type.
    """

    impl = JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        from sqlalchemy.dialects.postgresql import JSONB  # see the docstring

        return dialect.type_descriptor(JSONB())


JsonType = JSON().with_variant(_Jsonb(), "postgresql")
# A conversation's documents (its case, state and result) are `json` on Postgres, not
# jsonb: they are only ever written and read back whole, as text, and `json` keeps that
# text as written: object keys stay in the author's and the agent's order, as an
# embedded run (SQLite) keeps them, and the server does not rebuild each document in
# its binary form at every step (migration 0005).
DocumentType = JSON()


class Base(DeclarativeBase):
    pass


class RunRow(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # pending (storing cases) -> running -> aggregating -> done; or cancelled.
    status: Mapped[str] = mapped_column(String(16), default="pending")
    submitted_by: Mapped[str | None] = mapped_column(String(200))
    agent: Mapped[str | None] = mapped_column(String(200))
    input_label: Mapped[str | None] = mapped_column(Text)
    options: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    config: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    parent_run_id: Mapped[str | None] = mapped_column(String(40))
    total_cases: Mapped[int] = mapped_column(Integer, default=0)
    finished_cases: Mapped[int] = mapped_column(Integer, default=0)
    passed: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    skipped: Mapped[int] = mapped_column(Integer, default=0)
    total_turns: Mapped[int] = mapped_column(Integer, default=0)
    total_tokens: Mapped[int] = mapped_column(Integer, default=0)
    total_cost: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    cancelled: Mapped[bool] = mapped_column(Boolean, default=False)
    cancel_reason: Mapped[str | None] = mapped_column(Text)
    deadline_at: Mapped[float | None] = mapped_column(Float)
    # --parallel on a fleet: conversations in flight at most (None: no cap). They start
    # in `seq` order; the first `started_cases` have started. `claimed_from` is what the
    # last claim moved `started_cases` from (migration 0006, turn_statements.CASE_ENDED).
    parallel: Mapped[int | None] = mapped_column(Integer)
    started_cases: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    claimed_from: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Budgets on a fleet: what the turns running now have reserved, and how many turns'
    # usage is in the totals, whose average is a turn's estimate (budget_reservations.py).
    reserved_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    reserved_cost: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    budget_turns: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The series of runs this one belongs to (--suite, or derived from its inputs and
    # target), for history and diffs (migration 0009).
    suite: Mapped[str | None] = mapped_column(String(200))
    # What the run used outside its conversations (generator agents at submission, a
    # --reporter agent), {role: {calls, ..._tokens, cost}} (migration 0008, store/sql/usage.py).
    usage: Mapped[dict[str, Any] | None] = mapped_column(JsonType)
    # `promote RUN`: when the run was made its suite's baseline (the newest promotion
    # wins); `gate`: "passed" or "failed" when the run was gated (--fail-on), so that a
    # run that failed its gate is never the baseline of its own retry (migration 0013).
    promoted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    gate: Mapped[str | None] = mapped_column(String(8))

    __table_args__ = (Index("ix_runs_suite_created", "suite", "created_at"),)


class CaseRow(Base):
    __tablename__ = "cases"

    run_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    case_id: Mapped[str] = mapped_column(String(300), primary_key=True)
    # A repetition's case id (its case_id is the key "ID#N"); None: case_id is the id.
    test_id: Mapped[str | None] = mapped_column(String(300))
    seq: Mapped[int] = mapped_column(Integer)
    case: Mapped[dict[str, Any]] = mapped_column(DocumentType)
    agent: Mapped[str | None] = mapped_column(String(200))
    # pending (not started) | ready | awaiting_human | done
    phase: Mapped[str] = mapped_column(String(16), default="pending")
    next_turn: Mapped[int] = mapped_column(Integer, default=1)
    state: Mapped[dict[str, Any] | None] = mapped_column(DocumentType)
    status: Mapped[str | None] = mapped_column(String(16))
    result: Mapped[dict[str, Any] | None] = mapped_column(DocumentType)
    deliveries: Mapped[int] = mapped_column(Integer, default=0)
    # Written with each step: a retry after a lost connection finds its own token there
    # when its first attempt did commit (turns.save_step).
    step_token: Mapped[str | None] = mapped_column(String(32))
    # This conversation's share of its run's reservation (budget_reservations.py): a turn run
    # again after its worker died replaces it, and the saved step releases it.
    reserved_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    reserved_cost: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )
    # The case's definition as hashes (case_definitions.py, migration 0012): of its
    # normalized record, and of each assertion ({turns: [[...]], final: [...]}), so that
    # history tells a changed case from a regression. None: stored before.
    definition_hash: Mapped[str | None] = mapped_column(String(40))
    assertion_hashes: Mapped[dict[str, Any] | None] = mapped_column(JsonType)

    __table_args__ = (
        Index("ix_cases_run_seq", "run_id", "seq"),
        Index("ix_cases_run_phase", "run_id", "phase"),
        # The stall sweeper asks each running run when any of its conversations last moved.
        Index("ix_cases_run_updated", "run_id", "updated_at"),
        # A case's rows in a run, a repeated case's repetitions among them (history).
        Index("ix_cases_run_test", "run_id", "test_id"),
    )


class TurnRow(Base):
    __tablename__ = "turns"

    run_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    case_id: Mapped[str] = mapped_column(String(300), primary_key=True)
    turn: Mapped[int] = mapped_column(Integer, primary_key=True)
    input: Mapped[str | None] = mapped_column(Text)
    input_source: Mapped[str | None] = mapped_column(String(16))
    output: Mapped[str | None] = mapped_column(Text)
    tool_calls: Mapped[list[Any]] = mapped_column(JsonType, default=list)
    awaiting_input: Mapped[bool] = mapped_column(Boolean, default=False)
    status: Mapped[str] = mapped_column(String(16))
    duration_ms: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    skip_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class TurnRecordRow(Base):
    """One earlier turn's result (results.TurnResult, as its JSON text) of a conversation
    still running, by its position in the conversation's turns (a skipped turn may share
    a played one's number). The conversation's stored state then holds only the turns
    after the first `earlier_turns` (engine/state.py): a step writes the turns that left
    its state, not every earlier turn again. Written once, by the step whose guarded
    save moved the conversation on; deleted by the step that ends the case, which stores
    the whole state (migration 0010). Text, not JSON: read back exactly as written.
    `messages`: the conversation's messages that left its state with this record (the
    inside of a JSON array; migration 0011), so that a step stores its new messages
    once instead of the whole conversation again."""

    __tablename__ = "turn_records"

    run_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    case_id: Mapped[str] = mapped_column(String(300), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    record: Mapped[str] = mapped_column(Text)
    messages: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        ForeignKeyConstraint(
            ["run_id", "case_id"], ["cases.run_id", "cases.case_id"], ondelete="CASCADE"
        ),
    )


class AssertionResultRow(Base):
    __tablename__ = "assertion_results"

    run_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    case_id: Mapped[str] = mapped_column(String(300), primary_key=True)
    # 0 for final_assertions, else the turn number.
    turn: Mapped[int] = mapped_column(Integer, primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    type: Mapped[str] = mapped_column(String(32))
    passed: Mapped[bool] = mapped_column(Boolean)
    reason: Mapped[str | None] = mapped_column(Text)
    detail: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)


class AgentCallRow(Base):
    __tablename__ = "agent_calls"

    run_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    case_id: Mapped[str] = mapped_column(String(300), primary_key=True)
    turn: Mapped[int] = mapped_column(Integer, primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    agent: Mapped[str] = mapped_column(String(200))
    latency_ms: Mapped[int] = mapped_column(Integer)
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    status_code: Mapped[int | None] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    total_tokens: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    # What was sent and received, minus credentials (headers are never stored).
    request: Mapped[dict[str, Any] | None] = mapped_column(JsonType)
    response: Mapped[dict[str, Any] | None] = mapped_column(JsonType)


class RunReportRow(Base):
    __tablename__ = "run_reports"

    run_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    format: Mapped[str] = mapped_column(String(16), primary_key=True)
    # A report is stored in parts of about a megabyte, in order from 0 (report_copy.py).
    part: Mapped[int] = mapped_column(Integer, primary_key=True, default=0)
    content: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class ReplyCacheRow(Base):
    """A cached reply, or (while `reply` is NULL) a caller's lease on calling for it."""

    __tablename__ = "reply_cache"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    agent: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16))
    reply: Mapped[dict[str, Any] | None] = mapped_column(JsonType)
    size_bytes: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (Index("ix_reply_cache_created_at", "created_at"),)


class JudgeLabelRow(Base):
    """A person's pass or fail for one judged verdict of a run, beside the judge's."""

    __tablename__ = "judge_labels"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(40), ForeignKey("runs.id", ondelete="CASCADE"))
    case_id: Mapped[str] = mapped_column(String(300))
    # 0 for final_assertions, else the turn number; the assertion's position from 1.
    turn: Mapped[int] = mapped_column(Integer)
    position: Mapped[int] = mapped_column(Integer)
    criterion: Mapped[str] = mapped_column(Text)
    judge_verdict: Mapped[bool] = mapped_column(Boolean)
    label: Mapped[bool] = mapped_column(Boolean)
    note: Mapped[str | None] = mapped_column(Text)
    labelled_by: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    __table_args__ = (Index("ix_judge_labels_run_id", "run_id"),)


class JudgeAuditRow(Base):
    """A judge audit of a run, as `audit-judges --format json` prints it."""

    __tablename__ = "judge_audits"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(40), ForeignKey("runs.id", ondelete="CASCADE"))
    times: Mapped[int] = mapped_column(Integer)
    result: Mapped[dict[str, Any]] = mapped_column(JsonType)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    __table_args__ = (Index("ix_judge_audits_run_id", "run_id"),)


class AgentSpanRow(Base):
    """A span an agent sent, of a trace of one of the run's conversations (untrusted)."""

    __tablename__ = "agent_spans"

    run_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    trace_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    span_id: Mapped[str] = mapped_column(String(16), primary_key=True)
    parent_span_id: Mapped[str | None] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(256))
    start_ns: Mapped[int] = mapped_column(BigInteger)
    end_ns: Mapped[int] = mapped_column(BigInteger)
    error: Mapped[bool] = mapped_column(Boolean, default=False)
    status_message: Mapped[str | None] = mapped_column(Text)
    turn: Mapped[int | None] = mapped_column(Integer)
    service: Mapped[str | None] = mapped_column(String(256))
    attributes: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)

    __table_args__ = (Index("ix_agent_spans_trace", "trace_id"),)
