"""A conversation has a bound on its size (max_conversation_bytes, AGENTTEST_MAX_CONVERSATION_BYTES,
32 MiB by default): the turn whose input and reply take it past the bound fails its case
with a reason naming the bound, and the turns before it are kept. Embedded, against a
scripted agent over HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from scripted_agent import ScriptedAgent, say

SUBMIT = [sys.executable, "-m", "agenttest_submit.cli"]


def run_six_turns(tmp_path: Path, reply: str, **env: str) -> dict[str, Any]:
    with ScriptedAgent() as agent:
        agent.script("big", lambda _: say(reply))
        config = tmp_path / "agenttest.yaml"
        entry = agent.entry("big", max_retries=0, timeout=60)
        config.write_text(json.dumps({"agents": {"big": entry}}), encoding="utf-8")
        turns = [{"input": f"turn {n}"} for n in range(1, 7)]
        case = {"id": "B", "type": "multi_turn", "turns": turns}
        cases = tmp_path / "cases.jsonl"
        cases.write_text(json.dumps(case) + "\n", encoding="utf-8")
        out = tmp_path / "out.jsonl"
        done = subprocess.run(
            [*SUBMIT, "-i", str(cases), "-n", "big", *["--config", str(config), "-o", str(out)]],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
            env={**os.environ, **env},
        )
    assert done.returncode == 1, done.stderr[-3000:]
    record: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return record


def test_the_turn_past_the_bound_fails_its_case(tmp_path: Path) -> None:
    # 400-byte replies and 6-byte inputs: 406, 812, then 1,218 bytes at turn 3.
    record = run_six_turns(tmp_path, "x" * 400, AGENTTEST_MAX_CONVERSATION_BYTES="1000")
    assert record["status"] == "failed"
    assert [t["status"] for t in record["turns"]] == ["passed", "passed", "failed"]
    reason = "the conversation passed its bound of 1,000 bytes (max_conversation_bytes) at turn 3"
    assert record["turns"][2]["error"].startswith(reason), record["turns"][2]
    assert reason in record["error"], record["error"]


def test_the_default_bound_stops_a_conversation_of_large_replies(tmp_path: Path) -> None:
    # 15 MB replies (under the 16 MiB reply bound): past 32 MiB at the third.
    record = run_six_turns(tmp_path, "y" * 15_000_000)
    assert [t["status"] for t in record["turns"]] == ["passed", "passed", "failed"]
    assert "bound of 33,554,432 bytes" in record["error"], record["error"][:300]
