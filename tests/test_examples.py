"""examples/: every command examples/README.md gives, run as written, ends as it says.

Each command is `agenttest-demo run ...` called in-process from the repository root:
it serves the demo agents on a free port and runs agenttest-submit against them over
real HTTP, embedded (conftest removes every AGENTTEST_ variable, so there is no broker,
and points AGENTTEST_HOME at the test's tmp_path, so the SQLite store is the test's
own). The case statuses come from the `-o` JSONL records.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from agenttest_submit.commands.demo_command import main as demo_main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
README = EXAMPLES / "README.md"
CONFIG = "--config examples/agenttest.yaml"

# What examples/README.md promises for each file: every case passes.
EXPENSE = dict.fromkeys(
    [
        "greeting",
        "greeting-fr",
        "submit-travel",
        "large-asks-for-po",
        "large-with-po",
        "simulated-dinner",
        "echo-metadata",
    ],
    "passed",
)
TDX_FLAT = dict.fromkeys(
    ["greeting_test", "asks_for_expense_type", "large_expense_needs_approval"], "passed"
)
TDX_ROUNDS = dict.fromkeys(["expense_submission", "large_expense_approval"], "passed")
TDX_MIXED = dict.fromkeys(["simple_query", "context_memory"], "passed")
GENERATED = dict.fromkeys(["G001", "G002", "G003"], "passed")

# (command as README writes it, expected status per case id)
COMMANDS = [
    pytest.param(f"agenttest-demo run -i examples/expense.jsonl {CONFIG}", EXPENSE, id="jsonl"),
    pytest.param(f"agenttest-demo run -i examples/tdx-flat.yaml {CONFIG}", TDX_FLAT, id="flat"),
    pytest.param(
        f"agenttest-demo run -i examples/tdx-rounds.yaml {CONFIG}", TDX_ROUNDS, id="rounds"
    ),
    pytest.param(f"agenttest-demo run -i examples/tdx-mixed.yaml {CONFIG}", TDX_MIXED, id="mixed"),
    pytest.param(
        f"agenttest-demo run -i examples/ {CONFIG}",
        {**EXPENSE, **TDX_FLAT, **TDX_ROUNDS, **TDX_MIXED},
        id="folder",
    ),
    pytest.param(
        f'agenttest-demo run -i "agents:workers.test.generator?count=3" {CONFIG}',
        GENERATED,
        id="generator",
    ),
]
REEVAL = f"agenttest-demo run --reeval -i examples/tdx-rounds.yaml {CONFIG}"


@pytest.fixture
def repo_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory README's commands assume; returns the test's tmp_path."""
    monkeypatch.chdir(ROOT)
    # `agenttest-demo run` sets AGENTTEST_DEMO_URL for its server: restored afterwards.
    monkeypatch.setenv("AGENTTEST_DEMO_URL", "http://127.0.0.1:9/v1")
    return tmp_path


def run(command: str, output: Path) -> tuple[int, dict[str, str]]:
    """Run a README command with `-o output`: (exit code, {case id: status})."""
    argv = shlex.split(command)
    assert argv[:2] == ["agenttest-demo", "run"], command
    code = demo_main([*argv[1:], "-o", str(output)])
    records: list[dict[str, Any]] = [
        json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()
    ]
    statuses = {r["id"]: r["status"] for r in records}
    assert len(statuses) == len(records), "case ids must be unique"
    return code, statuses


def exit_code_for(statuses: dict[str, str]) -> int:
    return 1 if "failed" in statuses.values() else 0


@pytest.mark.parametrize(("command", "expected"), COMMANDS)
def test_example_ends_as_the_readme_says(
    command: str, expected: dict[str, str], repo_root: Path
) -> None:
    code, statuses = run(command, repo_root / "results.jsonl")
    assert statuses == expected
    assert code == exit_code_for(expected)
    # Embedded: the run was stored in this test's own SQLite file.
    assert (repo_root / ".agenttest" / "agenttest.db").is_file()


def test_reeval_rejudges_the_stored_rounds(
    repo_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, _ = run(f"agenttest-demo run -i examples/tdx-rounds.yaml {CONFIG}", repo_root / "a")
    assert first == 0
    capsys.readouterr()
    code, statuses = run(REEVAL, repo_root / "b")
    assert (code, statuses) == (0, TDX_ROUNDS)
    # Both conversations come from the store, not from the target.
    assert "re-judging 2 stored conversation(s)" in capsys.readouterr().err


def test_readme_gives_every_command() -> None:
    text = README.read_text(encoding="utf-8")
    for param in [*COMMANDS, pytest.param(REEVAL)]:
        command = param.values[0]
        assert isinstance(command, str)
        assert command in text, f"examples/README.md no longer shows: {command}"


def test_every_case_file_has_a_command() -> None:
    """A new example file needs its own expectations here."""
    case_files = {
        p.name for p in EXAMPLES.iterdir() if p.suffix in (".jsonl", ".json", ".yaml", ".yml")
    } - {"agenttest.yaml"}
    commands = " ".join(str(p.values[0]) for p in COMMANDS)
    assert {name for name in case_files if f"examples/{name}" not in commands} == set()


def test_ci_examples_use_the_action_and_the_gate() -> None:
    workflow = yaml.safe_load(
        (EXAMPLES / "ci" / ".github" / "workflows" / "agenttest.yml").read_text()
    )
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    steps = workflow["jobs"]["agents"]["steps"]
    used = [s for s in steps if str(s.get("uses", "")).startswith("your-org/agenttest@")]
    assert len(used) == 2
    for step in used:
        assert set(step["with"]) <= set(action["inputs"]), "inputs action.yml does not take"
        assert "cases" in step["with"]
    gitlab = yaml.safe_load((EXAMPLES / "ci" / ".gitlab-ci.yml").read_text())
    job = gitlab["agenttest"]
    assert job["artifacts"]["reports"]["junit"] == "results.xml"
    script = " ".join(job["script"])
    assert "--format junit -o results.xml" in script and "--format markdown" in script
