"""On a fleet, an unexpected exception while calling an agent fails that turn with its
reason, and the conversation ends at once: the submitter waiting with `--wait` returns
with the run's report, never left for the stall sweep. The embedded run is
tests/test_agent_call_failures.py.

The refusing protocol reaches every process of the fleet (the workers and the
submitter) the way a site's own code would: a `sitecustomize` module on PYTHONPATH,
imported by each interpreter at start, registers it through the public registry.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet import Fleet, fleet_on

pytestmark = pytest.mark.fleet

REFUSAL = "Cannot combine AUTHORIZATION header with AUTH argument or credentials encoded in URL"

SITECUSTOMIZE = f'''
from agenttest_worker.agents import AgentReply, AgentRequest, protocol


@protocol("refusing")
class RefusingClient:
    """Raises what aiohttp raises for such a request: not an AgentError."""

    def __init__(self, name, config, project):
        pass

    async def complete(self, request: AgentRequest) -> AgentReply:
        raise ValueError({REFUSAL!r})
'''


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    for made in fleet_on(redis_db, pg_database, demo_url, tmp_path):
        made.env["PYTHONPATH"] = str(site)
        yield made


def test_an_unexpected_exception_fails_the_turn_on_a_worker(fleet: Fleet, tmp_path: Path) -> None:
    config = tmp_path / "agenttest.yaml"
    config.write_text("agents:\n  r:\n    protocol: refusing\n", encoding="utf-8")
    cases = tmp_path / "cases.jsonl"
    two_turns = {"id": "C", "turns": [{"input": "one"}, {"input": "two"}]}
    cases.write_text(json.dumps(two_turns) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    fleet.start("a", concurrency=2)
    started = time.monotonic()
    done = fleet.submit(
        ["-i", str(cases), "-n", "r", "--config", str(config), "-o", str(out)], timeout=90
    )
    assert time.monotonic() - started < 60, "left for the stall sweep"
    assert done.returncode == 1, done.stderr + fleet.logs()[-4000:]
    assert "Traceback" not in done.stderr
    [record] = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert record["status"] == "failed"
    assert record["turns"][0]["error"] == f"calling r failed: ValueError: {REFUSAL}"
    assert len(record["turns"]) == 1  # the conversation ended at its failed turn
