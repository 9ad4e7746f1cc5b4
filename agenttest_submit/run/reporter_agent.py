"""`--reporter agents:ID`: a custom reporter agent writes its own account of a run.

The agent gets a system prompt, then one user message holding the run's summary and
its case records as JSON, with `metadata` {test_mode: "reporter", run_id, summary}.
Its reply (any text: a digest, a Slack message, a triage list) is stored with the run
as the report format "reporter" and printed after the standard report; what its call
cost is added to the run's own usage (store/sql/usage.py), for `status RUN` and `report RUN`.
"""

from __future__ import annotations

import json
from typing import Any

from agenttest_submit.cli.stopping import run_async
from agenttest_worker.agents import (
    AgentError,
    AgentPool,
    AgentRequest,
    ProjectConfig,
    close_session,
    parse_ref,
)
from agenttest_worker.engine import usage_by_role
from agenttest_worker.errors import InputProblem
from agenttest_worker.report import RunReport
from agenttest_worker.results import AgentCallRecord

REPORTER_PROMPT = """You write the report of an automated test run of an AI agent.
You receive the run's summary and one JSON record per test case (status, turns, the
agent's replies, each assertion with its verdict and reason). Write a concise report
for the team that owns the agent: what failed, why, and what to look at first."""

# Records are cut to this many characters in total: a reporter is an LLM with a context.
MAX_PAYLOAD_CHARS = 200_000


def reporter_request(report: RunReport) -> AgentRequest:
    summary = report.summary().as_dict()
    records: list[Any] = []
    size = 0
    for result in report.results:
        record = result.model_dump(mode="json", exclude={"turns": {"__all__": {"calls"}}})
        size += len(json.dumps(record))
        if size > MAX_PAYLOAD_CHARS:
            break
        records.append(record)
    payload = {
        "run_id": report.run_id,
        "agent": report.agent,
        "input": report.input_label,
        "summary": summary,
        "results": records,
        "results_included": len(records),
        "results_total": len(report.results),
    }
    metadata = {"test_mode": "reporter", "run_id": report.run_id, "summary": summary}
    # The metadata in the prompt too, as the role prompts carry theirs: an agent behind a
    # hosted API gets no `metadata` field unless its entry asks for it.
    system = f"{REPORTER_PROMPT}\n\nTest metadata: {json.dumps(metadata, ensure_ascii=False)}"
    return AgentRequest(
        role="reporter",
        messages=[
            {"role": "system", "content": system},
            {"role": "user", "content": json.dumps(payload, ensure_ascii=False)},
        ],
        metadata=metadata,
    )


def reporter_problem(config: ProjectConfig, use: str | None) -> InputProblem | None:
    """Why `--reporter use` cannot work, found before the run (not after an hour of it)."""
    if use is None:
        return None
    try:
        ref = parse_ref(use, default_kind="agents")
    except ValueError as exc:
        return InputProblem(str(exc), field="--reporter")
    if ref.kind != "agents":
        return InputProblem(f"{use!r}: a reporter is an agent (agents:NAME)", field="--reporter")
    if ref.id not in config.agents:
        return InputProblem(config.unknown_agent_message(ref.id), field="--reporter")
    return None


def run_reporter(use: str, report: RunReport, config: ProjectConfig, url: str | None = None) -> str:
    """The reporter agent's reply; AgentError when it fails. With `url`, what the call
    cost (failed or not) is added to the usage of the run `report` is of."""
    problem = reporter_problem(config, use)
    if problem is not None:
        raise AgentError("config", problem.message)
    ref = parse_ref(use, default_kind="agents")
    log: list[AgentCallRecord] = []

    async def call() -> str:
        try:
            reply = await AgentPool(config).session(log).call(ref.id, reporter_request(report))
        finally:
            await close_session()
        return reply.content or ""

    try:
        return run_async(call())
    finally:
        if url is not None and report.run_id is not None and log:
            # The store: imported here, as output.py does (see embedded.run_embedded).
            from agenttest_worker.store import add_run_usage

            add_run_usage(url, report.run_id, usage_by_role(log, config))
