"""Re-evaluation: `--reeval RUN` and `--reeval -i FILE` judge stored conversations again
without calling any target agent, as a new run linked to the old one (tdx "--reeval").

Real HTTP throughout: the target is the demo expense agent behind a WatchingAgent, which
counts every request it forwards (by the `[case X]` tag of the conversation's first
message); the judge is the demo validator, which checks the quoted phrases of the
criteria, so editing a criterion flips a verdict deterministically.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fleet import WORKER_ENV, WORKER_HEADER, Fleet, WatchingAgent, fleet_on

from agenttest_submit.cli.main import main
from agenttest_worker.settings import get_settings
from agenttest_worker.store.sql import runs

RUN_ID = re.compile(r"ℹ Run: (\S+)")

ROUNDS = """\
tests:
  - name: flow
    rounds:
      - user_input: I want to submit an expense [case flow]
        criteria: Must ask about the "type of expense"
      - user_input: Hello there
        criteria: {second}
  - name: greet
    user_input: {greet_input}
    criteria: Must greet with "Hello"
{extra}"""
PASSING = 'Must offer help with "expense reports"'
FAILING = 'Must offer help with "expense reports" and mention a "refund"'
FRESH = """\
  - name: fresh
    user_input: Hello [case fresh]
    criteria: Must mention "expense reports"
"""


def write_tests(
    path: Path, second: str = PASSING, greet_input: str = "Hello [case greet]", extra: str = ""
) -> Path:
    path.write_text(
        ROUNDS.format(second=second, greet_input=greet_input, extra=extra), encoding="utf-8"
    )
    return path


def write_config(directory: Path, target_url: str, judge_url: str) -> Path:
    config = {
        "agents": {
            "assistants.expense": {
                "base_url": target_url,
                "model": "expense",
                "max_retries": 0,
                # Which process called: workers send their name (fleet.py), others "none".
                "headers": {WORKER_HEADER: "${" + WORKER_ENV + ":-none}"},
            },
            "workers.test.validator": {"base_url": judge_url, "model": "validator"},
        },
        "defaults": {"judge": "workers.test.validator", "agent": "assistants.expense"},
    }
    path = directory / "agenttest.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@pytest.fixture
def target(demo_url: str) -> Iterator[WatchingAgent]:
    with WatchingAgent(demo_url) as watching:
        yield watching


@pytest.fixture
def project(
    target: WatchingAgent, demo_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    monkeypatch.chdir(tmp_path)
    write_config(tmp_path, target.base_url, demo_url)
    write_tests(tmp_path / "tests.yml")
    return tmp_path


def submit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str, str]:
    """main(argv) in-process: (exit code, run id, stdout, stderr)."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    found = RUN_ID.search(out)
    assert found, f"no run id in:\n{out}\n{err}"
    return code, found.group(1), out, err


def records(path: Path) -> dict[str, dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}


def calls(target: WatchingAgent) -> Counter[str | None]:
    return Counter(s.case for s in target.seen())


def verdicts(record: dict[str, Any]) -> list[list[bool]]:
    return [[a["passed"] for a in t["assertions"]] for t in record["turns"]]


def outputs(record: dict[str, Any]) -> list[Any]:
    return [(t["input"], t["output"], t["input_source"]) for t in record["turns"]]


def url() -> str:
    return get_settings().effective_database_url()


# -- embedded ----------------------------------------------------------------------------------


def test_reeval_of_a_case_file_rejudges_stored_conversations_and_runs_new_cases(
    project: Path, target: WatchingAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    code, first, _, err = submit(capsys, "-i", "tests.yml", "-o", "first.jsonl")
    assert code == 0, err
    assert calls(target) == {"flow": 2, "greet": 1}
    before = records(project / "first.jsonl")
    assert verdicts(before["flow"]) == [[True], [True]]

    # The criterion of round 2 now asks for what the stored reply never said; a new test.
    write_tests(project / "tests.yml", second=FAILING, extra=FRESH)
    code, second, out, err = submit(capsys, "--reeval", "-i", "tests.yml", "-o", "second.jsonl")
    assert code == 1, err
    assert calls(target) == {"flow": 2, "greet": 1, "fresh": 1}, "only the new case ran"
    assert f"re-judging 2 stored conversation(s), running 1 new case(s) (from run {first})" in err

    after = records(project / "second.jsonl")
    assert list(after) == ["flow", "greet", "fresh"]
    flow = after["flow"]
    assert flow["status"] == "failed"
    assert verdicts(flow) == [[True], [False]]
    judged = flow["turns"][1]["assertions"][0]
    assert judged["options"]["metadata"]["criteria"] == FAILING, "the file's current criterion"
    assert 'missing "refund"' in judged["reason"]
    assert outputs(flow) == outputs(before["flow"]), "the stored conversation, not a new one"
    assert after["greet"]["status"] == "passed"
    assert outputs(after["greet"]) == outputs(before["greet"])
    assert after["fresh"]["status"] == "passed" and after["fresh"]["total_turns"] == 1

    run = runs.get_run(url(), second)
    assert run is not None and run.parent_run_id == first
    assert (run.total_cases, run.passed, run.failed) == (3, 2, 1)
    assert "► [flow]" in out and "Failed:  1" in out

    # A case whose input was edited is not judged on its old conversation: it runs again.
    write_tests(project / "tests.yml", second=FAILING, greet_input="Hello again [case greet]")
    code, third, _, err = submit(capsys, "--reeval", "-i", "tests.yml", "-o", "third.jsonl")
    assert code == 1, err
    assert calls(target) == {"flow": 2, "greet": 2, "fresh": 1}
    assert "greet: its stored conversation" in err and "inputs changed" in err
    assert records(project / "third.jsonl")["greet"]["turns"][0]["input"] == (
        "Hello again [case greet]"
    )
    # flow was re-judged on the newest stored conversation: the re-evaluation's copy.
    assert runs.get_run(url(), third).parent_run_id == second  # type: ignore[union-attr]


def test_reeval_run_rejudges_with_the_stored_case_definitions(
    project: Path, target: WatchingAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    write_tests(project / "tests.yml", second=FAILING)
    code, first, _, err = submit(capsys, "-i", "tests.yml", "-o", "first.jsonl")
    assert code == 1, err
    seen = calls(target)

    # The file is fixed, but --reeval RUN judges with what RUN stored: it still fails.
    write_tests(project / "tests.yml", second=PASSING)
    code, second, out, err = submit(capsys, "--reeval", first, "-o", "second.jsonl")
    assert code == 1, err
    assert calls(target) == seen, "no target call"
    again = records(project / "second.jsonl")
    assert list(again) == ["flow", "greet"]
    assert verdicts(again["flow"]) == [[True], [False]]
    assert outputs(again["flow"]) == outputs(records(project / "first.jsonl")["flow"])
    assert runs.get_run(url(), second).parent_run_id == first  # type: ignore[union-attr]
    assert f"ℹ Input: re-evaluation of {first}" in out

    # --id / --tag pick among the run's cases.
    code, latest, _, err = submit(capsys, "--reeval", first, "--id", "greet", "-o", "greet.jsonl")
    assert code == 0, err
    assert list(records(project / "greet.jsonl")) == ["greet"]
    capsys.readouterr()
    assert main(["--reeval", first, "--tag", "nightly"]) == 2
    assert "matches the --tag/--id selection" in capsys.readouterr().err

    # Named by id or as `last`; an unknown run is an input error.
    code, third, _, _ = submit(capsys, "--reeval", "--format", "jsonl", "-o", "third.jsonl")
    assert runs.get_run(url(), third).parent_run_id == latest  # type: ignore[union-attr]
    assert calls(target) == seen
    capsys.readouterr()
    assert main(["--reeval", "20990101-000000-abcdef"]) == 2
    assert "no run '20990101-000000-abcdef'" in capsys.readouterr().err


def test_reeval_with_a_run_and_a_file_uses_that_runs_conversations(
    project: Path, target: WatchingAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    code, first, _, _ = submit(capsys, "-i", "tests.yml")
    submit(capsys, "-i", "tests.yml", "--id", "greet")
    assert calls(target) == {"flow": 2, "greet": 2}
    write_tests(project / "tests.yml", second=FAILING)
    code, third, _, err = submit(capsys, "--reeval", first, "-i", "tests.yml", "-o", "r.jsonl")
    assert code == 1, err
    assert calls(target) == {"flow": 2, "greet": 2}
    assert runs.get_run(url(), third).parent_run_id == first  # type: ignore[union-attr]
    assert verdicts(records(project / "r.jsonl")["flow"]) == [[True], [False]]


# -- on a fleet --------------------------------------------------------------------------------


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


@pytest.mark.fleet
def test_reeval_on_a_fleet_runs_only_the_new_case_on_a_worker(
    fleet: Fleet, target: WatchingAgent, demo_url: str, tmp_path: Path
) -> None:
    write_config(tmp_path, target.base_url, demo_url)
    write_tests(tmp_path / "tests.yml")
    fleet.start("w1")
    done = fleet.submit(["-i", "tests.yml", "-o", "first.jsonl"])
    assert done.returncode == 0, done.stderr
    first = RUN_ID.search(done.stdout).group(1)  # type: ignore[union-attr]
    assert {s.worker for s in target.seen()} == {"w1"}
    seen = len(target.seen())

    write_tests(tmp_path / "tests.yml", second=FAILING, extra=FRESH)
    done = fleet.submit(["--reeval", "-i", "tests.yml", "-o", "second.jsonl"])
    assert done.returncode == 1, done.stderr
    second = RUN_ID.search(done.stdout).group(1)  # type: ignore[union-attr]
    new = target.seen()[seen:]
    assert [(s.case, s.worker) for s in new] == [("fresh", "w1")], "the worker ran the new case"
    after = records(tmp_path / "second.jsonl")
    assert [after[c]["status"] for c in ("flow", "greet", "fresh")] == [
        "failed",
        "passed",
        "passed",
    ]
    run = runs.get_run(fleet.database_url, second)
    assert run is not None and run.parent_run_id == first and run.status == "done"
    assert "fresh turn 1: case passed" in fleet.logs()
