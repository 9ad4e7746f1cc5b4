"""--deadline with many cases: an embedded run of 2,000 cases against an agent that takes
a minute per turn ends within seconds of its deadline, every case with a record (the
turns in flight cancelled, the cases not started skipped together, not one by one)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from scripted_agent import ScriptedAgent, say

CASES = 2000
DEADLINE = 5.0

SUBMIT = [sys.executable, "-m", "agenttest_submit.cli"]


def test_a_deadline_ends_a_run_of_thousands_of_cases_in_seconds(tmp_path: Path) -> None:
    with ScriptedAgent() as agent:
        agent.script("slow", lambda _: say("Hello there.", delay=60.0))
        config = tmp_path / "agenttest.yaml"
        entry = agent.entry("slow", max_retries=0, timeout=120)
        config.write_text(json.dumps({"agents": {"slow": entry}}), encoding="utf-8")
        cases = tmp_path / "cases.jsonl"
        lines = (
            json.dumps({"id": f"C{i}", "input": f"Hi #{i}", "assertions": []}) + "\n"
            for i in range(CASES)
        )
        cases.write_text("".join(lines), encoding="utf-8")
        out = tmp_path / "out.jsonl"
        started = time.monotonic()
        done = subprocess.run(
            [
                *SUBMIT,
                "-i",
                str(cases),
                "-n",
                "slow",
                *["--config", str(config), "-o", str(out), "--deadline", f"{DEADLINE}s"],
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        took = time.monotonic() - started
    assert done.returncode == 1, done.stderr[-3000:]
    # From the process's start: its start-up, the deadline, and ending every case.
    assert took < DEADLINE + 10.0, (took, done.stderr[-2000:])
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert sorted(r["id"] for r in records) == sorted(f"C{i}" for i in range(CASES))
    assert {r["status"] for r in records} <= {"failed", "skipped"}, records[:3]
    assert all("deadline" in (r.get("error") or "") for r in records), records[:3]
