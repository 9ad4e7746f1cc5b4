"""Traces out: an embedded run with OTEL_EXPORTER_OTLP_ENDPOINT set exports a trace per
conversation over OTLP/HTTP, to a receiver built here from the official protobuf
definitions (opentelemetry-proto): the run, conversation, turn and agent-call spans,
their parents, the GenAI attributes, message content only with
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true, and no secret anywhere. Every
call to the target carries the W3C trace context of its turn, tracing on or off.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from otlp_collector import Collector
from scripted_agent import ScriptedAgent, judge_verdict

SECRET = "sk-otel-secret-value-4242"


@pytest.fixture
def agent() -> Iterator[ScriptedAgent]:
    with ScriptedAgent() as served:
        served.script("target-model", lambda body: "an answer about refunds")
        served.script("judge-model", lambda body: judge_verdict(True, "it answers"))
        yield served


def _project(tmp_path: Path, agent: ScriptedAgent) -> list[str]:
    config = {
        "agents": {
            "bot": agent.entry(
                "target-model", api_key_env="OTEL_TEST_KEY", headers={"X-Token": "${OTEL_TEST_KEY}"}
            ),
            "grader": agent.entry("judge-model"),
        },
        "defaults": {"judge": "agents:grader"},
    }
    config_path = tmp_path / "agenttest.yaml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    case = {
        "id": "refunds",
        "turns": [
            {"input": "first question", "assertions": [{"type": "contains", "value": "answer"}]},
            {
                "input": "second question",
                "assertions": [{"type": "agent", "options": {"metadata": {"criteria": "ok"}}}],
            },
        ],
        "final_assertions": [{"type": "contains", "value": "refunds"}],
    }
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps(case) + "\n", encoding="utf-8")
    return ["-i", str(cases), "-n", "bot", "--config", str(config_path)]


def _submit(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    run_env.update({"OTEL_TEST_KEY": SECRET, "OTEL_BSP_SCHEDULE_DELAY": "200", **env})
    return subprocess.run(
        [sys.executable, "-m", "agenttest_submit.cli", *args],
        env=run_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _traceparent(header: str) -> tuple[str, str, str]:
    version, trace_id, parent_id, flags = header.split("-")
    assert version == "00" and len(trace_id) == 32 and len(parent_id) == 16
    return trace_id, parent_id, flags


def test_a_conversation_is_exported_as_one_trace(agent: ScriptedAgent, tmp_path: Path) -> None:
    with Collector() as collector:
        done = _submit(
            _project(tmp_path, agent), tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint
        )
        assert done.returncode == 0, done.stderr
        [run] = collector.wait_for("agenttest.run", 1)
        [conversation] = collector.wait_for("agenttest.conversation", 1)
        turns = collector.wait_for("agenttest.turn", 2)
        calls = collector.wait_for("chat target-model", 2) + collector.wait_for(
            "chat judge-model", 1
        )
        raw = b"".join(collector.bodies)

    assert run["service"] == "agenttest"
    assert run["attributes"]["agenttest.run.cases"] == 1
    # The conversation is the root of its trace, and links to the run's span.
    trace_id = conversation["trace_id"]
    assert conversation["parent_span_id"] == ""
    assert conversation["links"] == [(run["trace_id"], run["span_id"])]
    assert conversation["attributes"]["agenttest.case.id"] == "refunds"
    assert conversation["attributes"]["agenttest.case.status"] == "passed"
    assert conversation["attributes"]["agenttest.case.turns"] == 2
    final = [attrs for name, attrs in conversation["events"] if name == "agenttest.assertion"]
    assert final == [
        {
            "agenttest.assertion.type": "contains",
            "agenttest.assertion.passed": True,
            "agenttest.assertion.final": True,
            "agenttest.assertion.reason": final[0]["agenttest.assertion.reason"],
        }
    ]
    assert conversation["start"] <= min(t["start"] for t in turns)
    assert conversation["end"] >= max(t["end"] for t in turns)
    # Each turn, a child of the conversation, with its assertions as events.
    assert sorted(t["attributes"]["agenttest.turn.number"] for t in turns) == [1, 2]
    for turn in turns:
        assert turn["trace_id"] == trace_id
        assert turn["parent_span_id"] == conversation["span_id"]
        assert turn["attributes"]["agenttest.turn.status"] == "passed"
        types = [a["agenttest.assertion.type"] for _, a in turn["events"]]
        assert types == (
            ["contains"] if turn["attributes"]["agenttest.turn.number"] == 1 else ["agent"]
        )
    turn_ids = {t["span_id"]: t["attributes"]["agenttest.turn.number"] for t in turns}
    # Each agent call, a client span of its turn, with the GenAI attributes.
    by_role = {}
    for call in calls:
        assert call["trace_id"] == trace_id
        assert call["parent_span_id"] in turn_ids
        assert call["kind"] == 3  # SPAN_KIND_CLIENT
        attrs = call["attributes"]
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.provider.name"] == "openai"
        assert attrs["gen_ai.system"] == "openai"
        assert attrs["gen_ai.response.finish_reasons"] == ["stop"]
        assert isinstance(attrs["gen_ai.usage.input_tokens"], int)
        assert isinstance(attrs["gen_ai.usage.output_tokens"], int)
        assert "gen_ai.input.messages" not in attrs and "gen_ai.output.messages" not in attrs
        by_role.setdefault(attrs["agenttest.agent.role"], []).append(call)
    assert {c["attributes"]["gen_ai.request.model"] for c in by_role["target"]} == {"target-model"}
    assert len(by_role["target"]) == 2 and len(by_role["validator"]) == 1
    # The target was sent its call span's context: an instrumented agent's spans join.
    headers = agent.request_headers("target-model")
    sent = sorted(_traceparent(h["traceparent"]) for h in headers)
    expected = sorted((trace_id, c["span_id"], "01") for c in by_role["target"])
    assert sent == expected
    assert sorted(h["tracestate"] for h in headers) == ["agenttest=turn:1", "agenttest=turn:2"]
    # No secret in anything exported (the key and the header from ${VAR}).
    assert SECRET.encode() not in raw


def test_message_content_only_with_the_capture_variable(
    agent: ScriptedAgent, tmp_path: Path
) -> None:
    with Collector() as collector:
        done = _submit(
            _project(tmp_path, agent),
            tmp_path,
            OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint,
            OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true",
            OTEL_SERVICE_NAME="nightly-tests",
        )
        assert done.returncode == 0, done.stderr
        calls = collector.wait_for("chat target-model", 2)
        raw = b"".join(collector.bodies)
    assert {c["service"] for c in calls} == {"nightly-tests"}
    first = min(calls, key=lambda c: c["start"])["attributes"]
    sent = json.loads(first["gen_ai.input.messages"])
    assert sent[-1] == {"role": "user", "parts": [{"type": "text", "content": "first question"}]}
    said = json.loads(first["gen_ai.output.messages"])
    assert said[0]["parts"] == [{"type": "text", "content": "an answer about refunds"}]
    assert said[0]["finish_reason"] == "stop"
    assert SECRET.encode() not in raw


def test_without_an_endpoint_nothing_is_exported_and_targets_still_get_a_traceparent(
    agent: ScriptedAgent, tmp_path: Path
) -> None:
    with Collector() as collector:
        done = _submit(_project(tmp_path, agent), tmp_path)
        assert done.returncode == 0, done.stderr
        time.sleep(0.5)
        assert collector.spans == []
    headers = agent.request_headers("target-model")
    ids = [_traceparent(h["traceparent"]) for h in headers]
    # One trace for the conversation, a parent id per call, sampled.
    assert len({trace_id for trace_id, _, _ in ids}) == 1
    assert len({parent for _, parent, _ in ids}) == 2
    assert {flags for _, _, flags in ids} == {"01"}
    # The judge is not the agent under test: no trace context for it.
    assert all("traceparent" not in h for h in agent.request_headers("judge-model"))
