"""Traces on a fleet: two Celery workers over Redis and Postgres play the turns of
three-turn conversations; each conversation is one trace whatever worker played which
turn (its turn spans all children of its conversation span), exported to an OTLP
receiver built from opentelemetry-proto. An agent instrumented with the official SDK
sends its spans to the receiver of one worker alone, and the trace assertions of turns
played by the other read them from the store. The embedded runs are
tests/test_otel_export.py and tests/test_otel_receive.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fleet import Fleet, fleet_on, free_port
from instrumented_agent import InstrumentedAgent, Step
from otlp_collector import Collector

pytestmark = pytest.mark.fleet

PLAN: dict[str, list[Step]] = {
    "look up the order": [("lookup_order", {"order_id": "A1"}, False)],
    "refund it": [("issue_refund", {"order_id": "A1"}, False)],
    "thanks": [],
}
TURNS = ["look up the order", "refund it", "thanks"]


def _case(case_id: str, wrong: bool = False) -> dict[str, Any]:
    second = "lookup_order" if wrong else "issue_refund"
    return {
        "id": case_id,
        "turns": [
            {
                "input": TURNS[0],
                "assertions": [{"type": "trace_tool_called", "name": "lookup_order"}],
            },
            {"input": TURNS[1], "assertions": [{"type": "trace_tool_called", "name": second}]},
            {"input": TURNS[2], "assertions": [{"type": "trace_span_count", "max": 1}]},
        ],
    }


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def test_a_conversation_is_one_trace_across_workers_and_its_spans_come_back(
    fleet: Fleet, tmp_path: Path
) -> None:
    port = free_port()
    with (
        Collector() as collector,
        InstrumentedAgent(f"http://127.0.0.1:{port}/v1/traces", PLAN, "protobuf") as agent,
    ):
        fleet.env.update(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"}
        )
        for name in ("a", "b"):
            fleet.env["OTEL_RESOURCE_ATTRIBUTES"] = f"agenttest.test.worker={name}"
            receiving = {"otlp_receiver_port": str(port)} if name == "a" else {}
            fleet.start(name, concurrency=1, wait=False, trace_wait="8", **receiving)
        for worker in fleet.workers:
            worker.wait_ready()
        config = {
            "agents": {
                "bot": {"protocol": "openai", "base_url": agent.base_url, "model": "refund-bot"}
            }
        }
        (tmp_path / "agenttest.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        # A conversation alone: the idle worker takes each next turn the other publishes.
        alone = _submit(fleet, tmp_path, [_case("alone")], "alone.jsonl")
        assert alone.returncode == 0, alone.stderr + fleet.logs()[-4000:]
        cases = [_case(f"c{n}") for n in range(4)] + [_case("wrong", wrong=True)]
        done = _submit(fleet, tmp_path, cases, "out.jsonl")
        assert done.returncode == 1, done.stderr + fleet.logs()[-4000:]
        conversations = collector.wait_for("agenttest.conversation", 6)
        turns = collector.wait_for("agenttest.turn", 18)
        assert len(collector.wait_for("agenttest.run", 2)) == 2
    out = tmp_path / "out.jsonl"

    records = {r["id"]: r for r in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    for case_id in (f"c{n}" for n in range(4)):
        assert records[case_id]["status"] == "passed", records[case_id]
    wrong = records["wrong"]
    assert [[a["passed"] for a in t["assertions"]] for t in wrong["turns"]] == [
        [True],
        [False],
        [True],
    ]

    assert len(conversations) == 6 and len(turns) == 18
    by_trace = {c["trace_id"]: c for c in conversations}
    assert len(by_trace) == 6
    played_by: dict[str, set[str]] = {}
    for turn in turns:
        conversation = by_trace[turn["trace_id"]]
        assert turn["parent_span_id"] == conversation["span_id"]
        worker = turn["resource"]["agenttest.test.worker"]
        played_by.setdefault(conversation["attributes"]["agenttest.case.id"], set()).add(worker)
    # Turns of one conversation played by both workers: still one trace.
    assert played_by["alone"] == {"a", "b"}, played_by


def _submit(fleet: Fleet, tmp_path: Path, cases: list[dict[str, Any]], out: str) -> Any:
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    args = ["-i", str(path), "-n", "bot", "--config", str(tmp_path / "agenttest.yaml")]
    return fleet.submit([*args, "-o", str(tmp_path / out), "--format", "jsonl"], timeout=180)
