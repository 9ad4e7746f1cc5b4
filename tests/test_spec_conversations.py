"""Conversations as the spec means them, embedded and on a fleet: a single-turn case ends
after its turn, a reply cut off by its length awaits nothing, what the simulator is sent,
and a blank first input. Every run here is played twice, by the embedded default and by
a worker fleet (one worker for the module), and both must give the same records.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet import Fleet, fleet_on

from agenttest_submit.cli.main import main as submit_main

Records = dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def module_fleet(
    redis_db: str, pg_database: str, demo_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """One worker for every fleet test of this module (starting one is the slow part)."""
    for fleet in fleet_on(redis_db, pg_database, demo_url, tmp_path_factory.mktemp("fleet")):
        fleet.start("w1", concurrency=2)
        yield fleet


def write_lines(path: Path, cases: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    return path


def read_records(path: Path) -> Records:
    lines = path.read_text(encoding="utf-8").splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}


def run_embedded(args: list[str], out: Path) -> tuple[int, Records]:
    code = submit_main([*args, "-o", str(out)])
    return code, read_records(out)


def run_on_fleet(fleet: Fleet, args: list[str], out: Path) -> tuple[int, Records]:
    done = fleet.submit([*args, "-o", str(out)])
    assert "case(s) enqueued" in done.stderr, done.stderr  # it did run on the fleet
    return done.returncode, read_records(out)


def demo_project(folder: Path, demo_url: str, extra: str = "") -> Path:
    """An agenttest.yaml with the demo's expense assistant as `expense`, plus `extra`."""
    path = folder / "agenttest.yaml"
    path.write_text(
        "agents:\n"
        "  expense:\n"
        "    protocol: openai\n"
        f"    base_url: {demo_url}\n"
        "    model: expense\n"
        "    max_retries: 0\n" + extra,
        encoding="utf-8",
    )
    return path


def statuses(records: Records) -> dict[str, str]:
    return {case: record["status"] for case, record in records.items()}


# -- 1. a single-turn case ends after its turn --------------------------------------------

ASKING_INPUT = "I want to submit an expense"  # the demo assistant asks "What type ...?"
MISSING_INPUT_CASES = [
    {
        "id": "Q1",
        "input": ASKING_INPUT,
        "assertions": [{"type": "contains", "value": "type of expense"}],
    },
    {"id": "Q1-TURNS", "type": "single_turn", "turns": [{"input": ASKING_INPUT}]},
    {"id": "T002", "type": "multi_turn", "input": ASKING_INPUT},
    {"id": "MULTI", "turns": [{"input": ASKING_INPUT}]},
    {"id": "OWN", "input": ASKING_INPUT, "on_missing_input": "fail"},
]


def missing_input_runs(folder: Path, demo_url: str, default: str | None) -> tuple[Path, Path]:
    folder.mkdir()
    extra = f"defaults:\n  on_missing_input: {default}\n" if default else ""
    return (
        write_lines(folder / "cases.jsonl", MISSING_INPUT_CASES),
        demo_project(folder, demo_url, extra),
    )


def check_missing_input(records: Records, default: str | None) -> None:
    # Single-turn cases are over after their turn; multi-turn ones miss their next input.
    single = "passed" if default in (None, "end") else "skipped"
    multi = "passed" if default == "end" else "skipped"
    assert statuses(records) == {
        "Q1": single,
        "Q1-TURNS": single,
        "T002": multi,
        "MULTI": multi,
        "OWN": "failed",  # the case's own value beats the project's default
    }
    q1 = records["Q1"]
    assert q1["turns"][0]["awaiting_input"] is True and q1["turns"][0]["assertions"][0]["passed"]
    if single == "passed":
        assert len(q1["turns"]) == 1 and "skip_reason" not in q1
    assert records["T002"]["total_turns"] == 1
    assert records["OWN"]["error"].endswith("(on_missing_input: fail)")


@pytest.mark.parametrize("default", [None, "skip", "end"])
def test_single_turn_cases_end_after_their_turn_embedded(
    demo_url: str, tmp_path: Path, default: str | None
) -> None:
    cases, config = missing_input_runs(tmp_path / "p", demo_url, default)
    args = ["-i", str(cases), "-n", "expense", "--config", str(config)]
    code, records = run_embedded(args, tmp_path / "out.jsonl")
    assert code == 1  # OWN failed
    check_missing_input(records, default)


@pytest.mark.fleet
def test_single_turn_cases_end_after_their_turn_on_a_fleet(
    module_fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    for default in (None, "skip"):
        folder = tmp_path / f"default-{default}"
        cases, config = missing_input_runs(folder, demo_url, default)
        args = ["-i", str(cases), "-n", "expense", "--config", str(config)]
        code, records = run_on_fleet(module_fleet, args, folder / "out.jsonl")
        assert code == 1
        check_missing_input(records, default)
