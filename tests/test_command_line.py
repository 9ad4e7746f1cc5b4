"""The command line as users type and paste it, on the embedded default: one value per
single-valued option, -i values that look like paths, -m, -i -, the help of every
subcommand, what --no-wait prints, and `view` on a port in use. The same on a fleet:
test_command_line_fleet.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agenttest_submit.cli.main import main

SUITE = Path(__file__).resolve().parents[1] / "agenttest_worker" / "demo" / "suite"
SUITE_CASES = str(SUITE / "expense-suite.jsonl")
SUITE_CONFIG = str(SUITE / "agenttest.yaml")

CONFIG = """\
agents:
  assistants.expense: {base_url: "http://127.0.0.1:9/v1"}
  assistants.chat: {base_url: "http://127.0.0.1:9/v1"}
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "agenttest.yaml").write_text(CONFIG, encoding="utf-8")
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "expense.jsonl").write_text(
        '{"id": "T001", "input": "Hello"}\n', encoding="utf-8"
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, err
    return code, out, err


# -- one value per option --------------------------------------------------------------------


def test_two_targets_are_refused_naming_both(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(
        capsys, "-i", "cases", "-n", "assistants.expense", "-n", "assistants.chat", "--dry-run"
    )
    assert (code, out) == (2, "")
    assert err == (
        "agenttest-submit: 1 input problem; nothing was run:\n"
        "  -n/--name: given twice, 'assistants.expense' and 'assistants.chat': give it once\n"
    )


def test_other_single_valued_options_are_refused_twice_too(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(
        capsys, "-i", "cases", "-n", "assistants.chat", "-o", "a.jsonl", "--output", "b.jsonl"
    )
    assert code == 2 and "-o/--output: given twice, 'a.jsonl' and 'b.jsonl'" in err
    code, _, err = run(capsys, "-i", "cases", "--timeout", "5s", "--timeout", "1m")
    assert code == 2 and "--timeout: given twice, 5.0 and 60.0" in err


def test_the_same_value_twice_is_one(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "-i", "cases", "-n", "assistants.chat", "-n", "assistants.chat", "--dry-run"
    )
    assert code == 0 and json.loads(out)["id"] == "T001"
