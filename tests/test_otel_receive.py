"""Spans in: an agent instrumented with the official OpenTelemetry SDK continues the
trace agenttest sends it and exports its spans to agenttest's OTLP/HTTP receiver
(AGENTTEST_OTLP_RECEIVER_PORT), as protobuf and as JSON; the trace assertions read the
turn's spans (its internal tool calls) and pass and fail as they should. The receiver
keeps only spans of a run in progress and refuses what it cannot read.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from browser import chromium, open_page
from fleet import free_port, lines_read, wait_until
from instrumented_agent import InstrumentedAgent, Step
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from agenttest_worker.driver.span_intake import SpanIntake
from agenttest_worker.observe.span_receiver import SpanReceiver
from agenttest_worker.store.sql.agent_spans import spans_of_run
from agenttest_worker.store.sql.db import upgrade

_LISTENING = re.compile(r"agenttest viewer: (http://\S+)")
IMG = "<img src=x onerror=window.__pwned=1>"
TRACE_UI = "https://jaeger.example/trace/{trace_id}"
PLAN: dict[str, list[Step]] = {
    "refund order A1": [
        ("lookup_order", {"order_id": "A1"}, False),
        ("issue_refund", {"order_id": "A1", "amount": 20}, False),
    ],
    "look up A2": [("lookup_order", {"order_id": "A2"}, False)],
    "then refund it": [("issue_refund", {"order_id": "A2", "amount": 5}, False)],
    "close my account": [("delete_account", {"user": "u1"}, True), (IMG, {}, False)],
}

CASES: list[dict[str, Any]] = [
    {
        "id": "refund",
        "input": "refund order A1",
        "assertions": [
            {"type": "trace_tool_called", "name": "lookup_order", "args": {"order_id": "A1"}},
            {
                "type": "tool_sequence",
                "source": "trace",
                "calls": [{"name": "lookup_order"}, {"name": "issue_refund"}],
            },
            {"type": "trace_span_count", "name": "execute_tool *", "min": 2, "max": 2},
            {"type": "trace_error_spans", "max": 0},
            {"type": "trace_duration", "name": "execute_tool *", "max": "5s"},
        ],
    },
    {
        "id": "two-turns",
        "turns": [
            {
                "input": "look up A2",
                "assertions": [{"type": "trace_tool_called", "name": "lookup_order"}],
            },
            {
                "input": "then refund it",
                "assertions": [
                    # Turn 2's spans alone: lookup_order was turn 1's.
                    {
                        "type": "tool_sequence",
                        "source": "trace",
                        "calls": [{"name": "issue_refund", "args": {"order_id": "A2"}}],
                    }
                ],
            },
        ],
        "final_assertions": [
            {
                "type": "tool_sequence",
                "source": "trace",
                "calls": [{"name": "lookup_order"}, {"name": "issue_refund"}],
            }
        ],
    },
    {
        "id": "wrong-tool",
        "input": "close my account",
        "assertions": [
            {"type": "trace_tool_called", "name": "lookup_order"},
            {"type": "trace_error_spans"},
            {"type": "trace_tool_called", "name": "delete_account"},
        ],
    },
]


@pytest.fixture(params=["protobuf", "json"])
def encoding(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def agent(port: int, encoding: str) -> Iterator[InstrumentedAgent]:
    with InstrumentedAgent(f"http://127.0.0.1:{port}/v1/traces", PLAN, encoding) as served:
        yield served


def _env(port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["AGENTTEST_OTLP_RECEIVER_PORT"] = str(port)
    env["AGENTTEST_TRACE_WAIT"] = "8"
    env["AGENTTEST_TRACE_URL"] = TRACE_UI
    return env


def _cli(args: list[str], tmp_path: Path, port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agenttest_submit.cli", *args],
        env=_env(port),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _submit(
    tmp_path: Path, agent: InstrumentedAgent, port: int
) -> subprocess.CompletedProcess[str]:
    config = {
        "agents": {"bot": {"protocol": "openai", "base_url": agent.base_url, "model": "refund-bot"}}
    }
    (tmp_path / "agenttest.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    cases = tmp_path / "cases.jsonl"
    cases.write_text("".join(json.dumps(c) + "\n" for c in CASES), encoding="utf-8")
    args = ["-i", str(cases), "-n", "bot", "-o", str(tmp_path / "out.jsonl"), "--format", "jsonl"]
    return _cli(args, tmp_path, port)


def _outcomes(record: dict[str, Any]) -> list[list[tuple[str, bool]]]:
    return [[(a["type"], a["passed"]) for a in turn["assertions"]] for turn in record["turns"]]


def test_trace_assertions_read_the_agents_internal_tool_calls(
    agent: InstrumentedAgent, port: int, tmp_path: Path
) -> None:
    done = _submit(tmp_path, agent, port)
    assert done.returncode == 1, done.stderr  # wrong-tool fails, the others pass
    lines = (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()
    records = {r["id"]: r for r in map(json.loads, lines)}

    refund = records["refund"]
    assert refund["status"] == "passed", json.dumps(refund["turns"], indent=1)
    assert _outcomes(refund) == [
        [
            ("trace_tool_called", True),
            ("tool_sequence", True),
            ("trace_span_count", True),
            ("trace_error_spans", True),
            ("trace_duration", True),
        ]
    ]
    two = records["two-turns"]
    assert two["status"] == "passed", two
    assert _outcomes(two) == [[("trace_tool_called", True)], [("tool_sequence", True)]]
    assert [(a["type"], a["passed"]) for a in two["final_assertions"]] == [("tool_sequence", True)]

    wrong = records["wrong-tool"]
    assert wrong["status"] == "failed"
    assert _outcomes(wrong) == [
        [("trace_tool_called", False), ("trace_error_spans", False), ("trace_tool_called", True)]
    ]
    reasons = [a["reason"] for a in wrong["turns"][0]["assertions"]]
    assert "lookup_order was not called" in reasons[0] and "delete_account" in reasons[0]
    assert "1 spans ended in error" in reasons[1] and "delete_account failed" in reasons[1]

    # Every target call carried a traceparent of its conversation's trace.
    assert len(agent.traceparents) == 4 and all(agent.traceparents)
    sent = {str(header).split("-")[1] for header in agent.traceparents}
    assert sent == {r["trace_id"] for r in records.values()}

    # The HTML report links each conversation to its trace and draws its spans.
    page_file = tmp_path / "report.html"
    report = _cli(["report", "last", "--format", "html", "-o", str(page_file)], tmp_path, port)
    assert report.returncode == 1, report.stderr
    with chromium() as browser:
        page, seen = open_page(browser, f"{page_file.as_uri()}#case=refund")
        page.wait_for_selector("#conversation .waterfall")
        href = page.get_attribute("#conversation a.trace-link", "href")
        assert href == TRACE_UI.replace("{trace_id}", refund["trace_id"])
        page.click("#conversation .waterfall summary")
        drawn = page.inner_text("#conversation .waterfall")
        assert "Agent spans (3)" in drawn
        assert "execute_tool lookup_order" in drawn and "execute_tool issue_refund" in drawn
        page.goto(f"{page_file.as_uri()}#case=wrong-tool")
        page.wait_for_selector("#conversation .waterfall")
        page.click("#conversation .waterfall summary")
        drawn = page.inner_text("#conversation .waterfall")
        assert "Agent spans (3, 1 in error)" in drawn and f"execute_tool {IMG}" in drawn
        assert page.evaluate("() => window.__pwned") is None
        assert page.evaluate("() => document.querySelectorAll('#app img').length") == 0
        assert set(seen) == {page_file.as_uri()}, seen  # nothing fetched from elsewhere

    # The viewer serves the same: the case's notes carry the link and the bars.
    notes = _viewer_notes(tmp_path, port, "refund")
    assert notes["trace_url"] == TRACE_UI.replace("{trace_id}", refund["trace_id"])
    [bars] = notes["spans"]
    assert [(b["name"], b["depth"], b["error"]) for b in bars] == [
        ("POST /v1/chat/completions", 0, False),
        ("execute_tool lookup_order", 1, False),
        ("execute_tool issue_refund", 1, False),
    ]


def _viewer_notes(tmp_path: Path, port: int, case_id: str) -> dict[str, Any]:
    """The notes `agenttest-submit view last` serves with the case's record."""
    viewer = subprocess.Popen(
        [sys.executable, "-m", "agenttest_submit.cli", "view", "last", "--port", "0"],
        env=_env(port),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        lines, _ = lines_read(viewer.stderr)

        def listening() -> str | None:
            found = [m.group(1) for m in map(_LISTENING.search, lines) if m]
            return found[0] if found else None

        url: str = wait_until(listening, 20, "the viewer to listen", step=0.05)
        match = re.match(r"(http://[^/]+)/runs/([^/?#]+)", url)
        assert match, url
        root, run_id = match.groups()
        case = httpx.get(f"{root}/api/runs/{run_id}/case", params={"id": case_id}).json()
        notes: dict[str, Any] = case["records"][0][1]
        return notes
    finally:
        viewer.send_signal(signal.SIGTERM)
        viewer.wait(10)


def _post(port: int, body: bytes, kind: str) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/traces", data=body, headers={"Content-Type": kind}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _json_export(trace_id: str, count: int = 1) -> bytes:
    spans = [
        {
            "traceId": trace_id,
            "spanId": f"{n + 1:016x}",
            "name": "<script>alert(1)</script>",
            "startTimeUnixNano": "1000",
            "endTimeUnixNano": "2000",
            "traceState": "agenttest=turn:1",
            "status": {"code": 2, "message": "boom"},
            "attributes": [{"key": "k", "value": {"stringValue": "v"}}],
        }
        for n in range(count)
    ]
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_the_receiver_keeps_spans_of_runs_in_progress_only(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from agenttest_worker.observe.tracing import run_trace_prefix

    sqlite = f"sqlite:///{tmp_path / 'store.db'}"
    url = sqlite if store == "sqlite" else str(request.getfixturevalue("pg_database"))
    upgrade(url)
    run_id = f"run-{tmp_path.name}"  # the session's Postgres database holds other runs
    receiver = SpanReceiver(SpanIntake(url, expected=[run_id]), "127.0.0.1", 0)
    receiver.start()
    try:
        ours = run_trace_prefix(run_id) + "00000000000000aa"
        status, body = _post(receiver.port, _json_export(ours, 2), "application/json")
        assert (status, json.loads(body)) == (200, {})
        foreign = "ab" * 16
        status, body = _post(receiver.port, _json_export(foreign), "application/json")
        assert status == 200
        assert json.loads(body)["partialSuccess"]["rejectedSpans"] == "1"
        # Protobuf: an empty request is a valid one, answered in protobuf.
        status, body = _post(receiver.port, b"", "application/x-protobuf")
        assert status == 200
        assert ExportTraceServiceResponse.FromString(body).partial_success.rejected_spans == 0
        assert _post(receiver.port, b"{not json", "application/json")[0] == 400
        assert _post(receiver.port, b"\xff\x00garbage", "application/x-protobuf")[0] == 400
        assert _post(receiver.port, b"x", "text/plain")[0] == 415
        bad_id = json.dumps(
            {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "1"}]}]}]}
        ).encode()
        assert _post(receiver.port, bad_id, "application/json")[0] == 400
        # Bounds: spans per request, the body's size, an attribute's length.
        assert _post(receiver.port, _json_export(ours, 5001), "application/json")[0] == 400
        huge = b'{"resourceSpans": "' + b"x" * (9 * 1024 * 1024) + b'"}'
        assert _post(receiver.port, huge, "application/json")[0] == 413
        long = json.loads(_json_export(ours))
        span = long["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        span["spanId"] = "00000000000000ff"
        span["attributes"] = [{"key": "k", "value": {"stringValue": "y" * 10_000}}]
        assert _post(receiver.port, json.dumps(long).encode(), "application/json")[0] == 200
        # Out of the store's range: times past a signed 64-bit, a turn past its column,
        # a parent id that is no span's.
        odd = json.loads(_json_export(ours))
        span = odd["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        span.update(
            spanId="00000000000000ee",
            endTimeUnixNano=str(2**64 - 1),
            traceState="agenttest=turn:99999999999",
            parentSpanId="abcd",
        )
        assert _post(receiver.port, json.dumps(odd).encode(), "application/json")[0] == 200
    finally:
        receiver.stop()
    kept = spans_of_run(url, run_id)
    assert list(kept) == [ours]
    spans = {s.span_id: s for s in kept[ours]}
    odd_span = spans.pop("00000000000000ee")
    assert (odd_span.end_ns, odd_span.turn, odd_span.parent_span_id) == (2**63 - 1, None, None)
    assert [(s.name, s.turn, s.error, s.status_message) for s in spans.values()] == [
        ("<script>alert(1)</script>", 1, True, "boom")
    ] * 3
    assert sorted(len(s.attributes["k"]) for s in spans.values()) == [1, 1, 2048]
    assert spans_of_run(url, f"{run_id}-other") == {}


def test_a_receiver_port_in_use_is_an_input_error_before_anything_runs(tmp_path: Path) -> None:
    config = {"agents": {"bot": {"protocol": "openai", "base_url": "http://127.0.0.1:9/v1"}}}
    (tmp_path / "agenttest.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = _cli(["-m", "hello", "-n", "bot"], tmp_path, taken.getsockname()[1])
    assert done.returncode == 2, done.stderr
    assert "AGENTTEST_OTLP_RECEIVER_PORT: cannot receive spans on port" in done.stderr
    assert "Traceback" not in done.stderr
