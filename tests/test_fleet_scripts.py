"""On a fleet, `scripts:` names resolve only under the worker's own AGENTTEST_SCRIPTS_DIR.

A run stores its agenttest.yaml as written, `scripts_dir` included, and whoever can
submit a run chooses it: an absolute path there must not make a worker import Python
from wherever it points. Here the run's config names a folder outside the worker's,
holding a script that leaves a mark when it is imported. A worker without a scripts
folder of its own refuses every script, saying how to give it one; a worker with one
plays the scripts found there and nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_kit import write_config
from fleet import Fleet, fleet_on, write_cases

pytestmark = pytest.mark.fleet

INTRUDER = """\
from pathlib import Path

Path({mark!r}).write_text("imported")


def respond(messages, metadata):
    return "the submitter's code ran on the worker"
"""
WORKERS_OWN = """\
def respond(messages, metadata):
    return "the worker's own script"
"""


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def _results(fleet: Fleet, run_id: str) -> dict[str, dict[str, object]]:
    shown = fleet.submit(["report", run_id, "--format", "jsonl"])
    lines = [line for line in shown.stdout.splitlines() if line.startswith("{")]
    records = [json.loads(line) for line in lines]
    return {str(r["id"]): r for r in records}


def test_a_worker_imports_scripts_only_from_its_own_folder(fleet: Fleet, tmp_path: Path) -> None:
    mark = tmp_path / "imported.mark"
    chosen = tmp_path / "elsewhere" / "scripts"  # the submitter's choice, absolute
    chosen.mkdir(parents=True)
    for name in ("intruder", "shared"):
        (chosen / f"{name}.py").write_text(INTRUDER.format(mark=str(mark)), encoding="utf-8")
    own = tmp_path / "worker-scripts"
    own.mkdir()
    (own / "shared.py").write_text(WORKERS_OWN, encoding="utf-8")
    config = write_config(
        tmp_path / "project",
        {
            "intruder": {"protocol": "script", "use": "scripts:intruder"},
            "shared": {"protocol": "script", "use": "scripts:shared"},
        },
        scripts_dir=str(chosen),
    )
    cases = write_cases(
        tmp_path,
        [
            {"id": "S-intruder", "input": "hello", "agent": "intruder"},
            {"id": "S-shared", "input": "hello", "agent": "shared"},
        ],
    )
    args = ["-i", str(cases), "-n", "shared", "--config", str(config)]

    # A worker with no scripts folder of its own plays no script at all.
    bare = fleet.start("bare", concurrency=2)
    run_id = fleet.submit_no_wait(args)
    fleet.wait_done(run_id)
    bare.stop()
    results = _results(fleet, run_id)
    assert {r["status"] for r in results.values()} == {"failed"}
    for record in results.values():
        error = str(record["turns"][0]["error"])  # type: ignore[index]
        assert "AGENTTEST_SCRIPTS_DIR" in error, error
        assert str(chosen) not in error
    assert not mark.exists(), "the worker imported a script from the run's scripts_dir"

    # A worker with its own folder plays what is there, and only that.
    fleet.start("own", concurrency=2, scripts_dir=str(own))
    run_id = fleet.submit_no_wait(args)
    fleet.wait_done(run_id)
    results = _results(fleet, run_id)
    assert results["S-shared"]["status"] == "passed"
    assert results["S-shared"]["turns"][0]["output"] == "the worker's own script"  # type: ignore[index]
    assert results["S-intruder"]["status"] == "failed"
    assert "no script found" in str(results["S-intruder"]["turns"][0]["error"])  # type: ignore[index]
    assert not mark.exists(), "the worker imported a script from the run's scripts_dir"
