"""An empty case file is an input error that names the file, alone or next to other
inputs (files, folders, messages): a truncated file must not pass CI quietly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agenttest_submit.cli.main import main

CONFIG = """\
agents:
  assistants.expense:
    base_url: http://127.0.0.1:1/v1
    model: expense
"""
GOOD = json.dumps({"id": "ok", "input": "Hello"}) + "\n"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "agenttest.yaml").write_text(CONFIG, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def submit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "-n", "assistants.expense", "--dry-run"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, err
    return code, out, err


def problems(err: str) -> list[str]:
    lines = err.splitlines()
    assert lines[0].endswith("; nothing was run:"), err
    return [line.strip() for line in lines[1:]]


EMPTY_FILES = {
    "zero.jsonl": "",
    "blank.jsonl": "\n  \n\n",
    "zero.json": "",
    "list.json": "[]",
    "cases.json": '{"cases": []}',
    "zero.yaml": "",
    "comments.yaml": "# nothing here yet\n",
    "no-tests.yaml": "tests: []\n",
}


@pytest.mark.parametrize("name", sorted(EMPTY_FILES))
def test_an_empty_case_file_alone_names_the_file(
    project: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    (project / name).write_text(EMPTY_FILES[name], encoding="utf-8")
    code, out, err = submit(capsys, "-i", name)
    assert code == 2
    assert out == ""
    [problem] = problems(err)
    assert problem.startswith(f"{name}: no test cases in this file"), problem


def test_a_zero_byte_file_says_it_is_empty(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "empty.jsonl").write_text("", encoding="utf-8")
    code, _, err = submit(capsys, "-i", "empty.jsonl")
    assert code == 2
    assert problems(err) == ["empty.jsonl: no test cases in this file (it is empty)"]


def test_an_empty_file_next_to_a_good_one_is_an_error_too(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "good.jsonl").write_text(GOOD, encoding="utf-8")
    (project / "empty.jsonl").write_text("", encoding="utf-8")
    code, out, err = submit(capsys, "-i", "good.jsonl", "-i", "empty.jsonl")
    assert code == 2
    assert out == ""
    assert problems(err) == ["empty.jsonl: no test cases in this file (it is empty)"]


def test_an_empty_file_next_to_a_message_is_an_error_too(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "empty.yaml").write_text("", encoding="utf-8")
    code, _, err = submit(capsys, "-i", "empty.yaml", "-i", "Hello there")
    assert code == 2
    assert problems(err) == ["empty.yaml: no test cases in this file (it is empty)"]


def test_an_empty_file_in_a_folder_is_an_error_too(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "suite").mkdir()
    (project / "suite" / "a.jsonl").write_text(GOOD, encoding="utf-8")
    (project / "suite" / "b.json").write_text("[]", encoding="utf-8")
    code, _, err = submit(capsys, "-i", "suite")
    assert code == 2
    assert problems(err) == [f"{Path('suite') / 'b.json'}: no test cases in this file"]


def test_a_real_run_with_an_empty_file_stores_and_calls_nothing(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "good.jsonl").write_text(GOOD, encoding="utf-8")
    (project / "empty.jsonl").write_text("", encoding="utf-8")
    code = main(["-i", "good.jsonl", "-i", "empty.jsonl", "-n", "assistants.expense"])
    _, err = capsys.readouterr()
    assert code == 2, err
    assert "empty.jsonl: no test cases in this file (it is empty)" in err
    assert not (project / ".agenttest" / "agenttest.db").exists(), "nothing ran"
