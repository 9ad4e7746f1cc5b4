"""The rest of what `agenttest-submit` writes from untrusted text, escaped: warnings about
case files and generated cases, `--dry-run`'s JSONL, `status`; and `report RUN
--only-failures`.

Real runs through `cli.main`: a dry run needs no agent, the others play the demo agents.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agenttest_submit.cli.main import main

SUITE = Path(__file__).resolve().parents[1] / "agenttest_worker" / "demo" / "suite"
SUITE_CASES = str(SUITE / "expense-suite.jsonl")
SUITE_CONFIG = str(SUITE / "agenttest.yaml")

# Set the terminal's title (OSC); erase the screen (C1 CSI); reverse the text that follows.
HOSTILE = "\x1b]0;pwned\x07" + "\x9b2J" + "\u202e"
# What a terminal would obey; this test's runs print no colour (stdout is not a tty).
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

GENERATOR = f"""
def generate(params):
    hostile = {HOSTILE!r}
    return {{"cases": [
        {{"id": "G1" + hostile, "input": "hi", "assertions": [{{"type": "nope" + hostile}}]}},
        {{"id": "G2" + hostile, "input": "hello" + hostile}},
    ]}}
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo_url: str) -> Iterator[Path]:
    """cwd = tmp_path: the demo suite's agents (served on `demo_url`) and a scripts folder
    whose generator writes control characters into ids, inputs and assertion types."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AGENTTEST_DEMO_URL", demo_url)
    config = yaml.safe_load(Path(SUITE_CONFIG).read_text(encoding="utf-8"))
    config["scripts_dir"] = "scripts"
    (tmp_path / "agenttest.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "gen.py").write_text(GENERATOR, encoding="utf-8")
    yield tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_nothing_raw(*texts: str) -> None:
    for text in texts:
        assert not RAW_CONTROL.search(text), repr(text)


def write_cases(path: Path, *cases: dict[str, Any]) -> str:
    path.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    return str(path)


def test_warnings_and_dry_run_jsonl_escape_case_data_and_generator_output(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A connector that is no agent is a warning quoting the case's id.
    cases = write_cases(
        project / "cases.jsonl",
        {"id": "C1" + HOSTILE, "input": "hi" + HOSTILE, "options": {"connector": "nobody"}},
    )
    argv = ["-i", cases, "-i", "scripts:gen", "-n", "assistants.expense", "--dry-run"]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert_nothing_raw(out, err)
    # The warnings are there, their control characters written out.
    assert "warning: case C1\\x1b]0;pwned\\x07\\x9b2J\\u202e: connector 'nobody'" in err, err
    assert "warning: generated case 1 (G1\\x1b]0;pwned\\x07\\x9b2J\\u202e) left out" in err, err
    # The JSONL stays valid and reads back to the very strings the cases hold.
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(r["id"], r["turns"][0]["input"]) for r in lines] == [
        ("C1" + HOSTILE, "hi" + HOSTILE),
        ("G2" + HOSTILE, "hello" + HOSTILE),
    ], out

    # Written with -o, the file is as safe to `cat` and reads back the same.
    code, out, err = run(capsys, *argv, "-o", "cases-out.jsonl")
    assert code == 0, err
    written = (project / "cases-out.jsonl").read_text(encoding="utf-8")
    assert_nothing_raw(written, err)
    assert [json.loads(line)["id"] for line in written.splitlines()] == [
        "C1" + HOSTILE,
        "G2" + HOSTILE,
    ]


def test_status_escapes_the_input_a_run_was_given(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The run's input label names the case file, whatever its name holds.
    cases = write_cases(
        project / f"cases{HOSTILE}.jsonl",
        {"id": "S1", "input": "Hello", "assertions": [{"type": "contains", "value": "expense"}]},
    )
    code, out, err = run(capsys, "-i", cases, "-n", "assistants.expense")
    assert code in (0, 1), err
    assert_nothing_raw(out, err)
    code, out, err = run(capsys, "status", "last")
    assert code == 0, err
    assert_nothing_raw(out, err)
    assert "cases\\x1b]0;pwned\\x07\\x9b2J\\u202e.jsonl" in out, out


def case_block(console: str, case_id: str) -> str | None:
    match = re.search(rf"^► \[{re.escape(case_id)}\].*?(?=^\s*$)", console, re.M | re.S)
    return match.group(0) if match else None


def test_report_only_failures_shows_failed_and_skipped_cases_and_the_whole_summary(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["-i", SUITE_CASES, "-n", "assistants.expense", "-o", "all.jsonl"]
    code, _, err = run(capsys, *argv)
    assert code == 1, err

    code, out, err = run(capsys, "report", "last", "--only-failures")
    assert code == 1, err
    assert case_block(out, "T001") is None and case_block(out, "T003") is None, out
    assert "Result: SKIPPED" in (case_block(out, "T002") or ""), out
    assert "Result: FAILED" in (case_block(out, "T004") or ""), out
    assert "2 passed cases not shown (--only-failures)" in out, out
    summary = out.split("  Summary\n", 1)[1]
    for line in ("Total:   4 tests", "Passed:  2", "Failed:  1", "Skipped: 1"):
        assert line in summary, out

    # Without the flag every case is shown; other formats and -o keep every case.
    code, out, _ = run(capsys, "report", "last")
    assert case_block(out, "T001") is not None and "not shown" not in out, out
    code, out, err = run(capsys, "report", "last", "--only-failures", "--format", "jsonl")
    assert sorted(json.loads(line)["id"] for line in out.splitlines()) == [
        "T001",
        "T002",
        "T003",
        "T004",
    ], out
    code, _, err = run(capsys, "report", "last", "--only-failures", "-o", "again.jsonl")
    assert code == 1, err
    again = (project / "again.jsonl").read_text(encoding="utf-8").splitlines()
    assert sorted(json.loads(line)["id"] for line in again) == ["T001", "T002", "T003", "T004"]
