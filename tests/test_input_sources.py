"""The -i argument: file, folder, direct message, agents:/scripts: generators with query
parameters, a mistyped path, and a message without -n (through the CLI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agenttest_submit.cli.main import main
from agenttest_submit.inputs.sources import FileInput, GeneratorInput, MessageInput, parse_input
from agenttest_worker.agents.refs import Ref, parse_ref
from agenttest_worker.cases.case_model import Case
from agenttest_worker.errors import InputError, InputProblem

CONFIG = """\
agents:
  assistants.expense: {base_url: "http://127.0.0.1:9/v1"}
  assistants.chat: {base_url: "http://127.0.0.1:9/v1"}
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "agenttest.yaml").write_text(CONFIG, encoding="utf-8")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "expense.jsonl").write_text(
        '{"id": "T001", "input": "Hello"}\n', encoding="utf-8"
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


def input_problem(arg: str) -> InputProblem:
    with pytest.raises(InputError) as caught:
        parse_input(arg)
    [problem] = caught.value.problems
    return problem


# -- each source kind -------------------------------------------------------------------


def test_file_path(project: Path) -> None:
    source = parse_input("./tests/expense.jsonl")
    assert source == FileInput(Path("./tests/expense.jsonl"))
    assert source.describe() == "tests/expense.jsonl"  # as the user knows it, not absolute
    assert parse_input("tests/expense.jsonl") == FileInput(Path("tests/expense.jsonl"))
    assert parse_input(f"  {project / 'tests' / 'expense.jsonl'}  ") == FileInput(
        project / "tests" / "expense.jsonl"
    )


def test_folder(project: Path) -> None:
    assert parse_input("./tests") == FileInput(Path("tests"))
    assert parse_input("tests/") == FileInput(Path("tests"))
    assert parse_input(".") == FileInput(Path("."))


def test_an_existing_file_wins_over_a_message(project: Path) -> None:
    (project / "Hello").write_text('{"id": "x", "input": "y"}\n', encoding="utf-8")
    assert parse_input("Hello") == FileInput(Path("Hello"))


@pytest.mark.parametrize(
    "text",
    [
        "Hello, how are you?",
        "Help me file an expense",
        "Hello",
        "Please read notes.jsonl and summarize",  # a sentence, not a path
        "Note: the meeting is at 10:30",  # a colon that is not agents:/scripts:
        "What does scripts mean?",
    ],
)
def test_direct_message(project: Path, text: str) -> None:
    source = parse_input(text)
    assert source == MessageInput(text)


def test_message_describe_is_short(project: Path) -> None:
    long = "Hello " * 20
    assert parse_input(long).describe() == repr(long.strip()[:59] + "…")
    assert parse_input("Hi there").describe() == "'Hi there'"


@pytest.mark.parametrize(
    ("arg", "kind", "ident", "params"),
    [
        ("agents:workers.test.generator", "agents", "workers.test.generator", {}),
        (
            "agents:workers.test.generator?count=10&focus=edge-cases",
            "agents",
            "workers.test.generator",
            {"count": "10", "focus": "edge-cases"},
        ),
        (
            "agents:workers.test.generator?count=20&focus=edge-cases&complexity=medium",
            "agents",
            "workers.test.generator",
            {"count": "20", "focus": "edge-cases", "complexity": "medium"},
        ),
        ("scripts:tests.generate", "scripts", "tests.generate", {}),
        (
            "scripts:tests.expense.generate?scenario=approval-flow",
            "scripts",
            "tests.expense.generate",
            {"scenario": "approval-flow"},
        ),
        ("scripts:gen?scenario=x", "scripts", "gen", {"scenario": "x"}),
        # query strings are decoded; blank values are kept
        (
            "agents:gen?focus=edge%20cases&note=a+b&empty=",
            "agents",
            "gen",
            {"focus": "edge cases", "note": "a b", "empty": ""},
        ),
        ("  agents:gen?count=3  ", "agents", "gen", {"count": "3"}),
    ],
)
def test_generator_references_with_query_parameters(
    arg: str, kind: str, ident: str, params: dict[str, str]
) -> None:
    source = parse_input(arg)
    assert source == GeneratorInput(Ref(kind=kind, id=ident, params=params))
    assert str(source.ref) == f"{kind}:{ident}"


def test_generator_describe() -> None:
    assert parse_input("agents:gen?count=10&focus=edge-cases").describe() == (
        "agents:gen?count=10&focus=edge-cases"
    )
    assert parse_input("scripts:tests.generate").describe() == "scripts:tests.generate"


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("agents:", "'agents:': '' is not a valid name (letters, digits, '.', '-', '_'; no paths)"),
        (
            "agents:?count=1",
            "'agents:?count=1': '' is not a valid name (letters, digits, '.', '-', '_'; no paths)",
        ),
        (
            "scripts:../etc/passwd",
            "'scripts:../etc/passwd': '../etc/passwd' is not a valid name "
            "(letters, digits, '.', '-', '_'; no paths)",
        ),
        (
            "scripts:/abs/gen",
            "'scripts:/abs/gen': '/abs/gen' is not a valid name (letters, "
            "digits, '.', '-', '_'; no paths)",
        ),
        (
            "agents:a..b",
            "'agents:a..b': 'a..b' is not a valid name (letters, digits, '.', '-', '_'; no paths)",
        ),
    ],
)
def test_bad_generator_reference(arg: str, message: str) -> None:
    assert input_problem(arg) == InputProblem(message, field="-i")


def test_query_parameters_only_on_generator_inputs() -> None:
    with pytest.raises(ValueError, match="query parameters are only allowed on -i generator"):
        parse_ref("agents:sim?count=1")
    with pytest.raises(ValueError, match="query parameters"):
        Case.model_validate({"id": "a", "input": "x", "simulator": {"use": "agents:sim?x=1"}})


# -- mistakes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("./tests/expens.jsonl", "case file not found: ./tests/expens.jsonl"),
        ("tests/expense.json", "case file not found: tests/expense.json"),
        ("cases.yaml", "case file not found: cases.yaml"),
        ("suite.YML", "case file not found: suite.YML"),
        ("./tests/missing/", "case file or folder not found: ./tests/missing/"),
        ("../elsewhere", "case file or folder not found: ../elsewhere"),
        ("missing/", "case file or folder not found: missing/"),
    ],
)
def test_mistyped_path(project: Path, arg: str, message: str) -> None:
    assert input_problem(arg) == InputProblem(message, field="-i")


def test_empty_input() -> None:
    assert input_problem("   ") == InputProblem(
        "-i is empty: give a file, a message or agents:/scripts:ID"
    )


# -- through the CLI ---------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, err
    return code, out, err


def test_message_without_n_is_an_input_error(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "-i", "Hello, how are you?", "--dry-run")
    assert (code, out) == (2, "")
    assert err == (
        "agenttest-submit: 1 input problem; nothing was run:\n"
        "  -i: a direct message needs a target agent: add -n NAME\n"
    )


def test_message_with_n_is_one_single_turn_case(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "-i", "Hello, how are you?", "-n", "assistants.chat", "--dry-run")
    assert code == 0
    assert json.loads(out) == {
        "id": "message",
        "name": "Hello, how are you?",
        "type": "single_turn",
        "turns": [{"input": "Hello, how are you?"}],
    }


def test_message_uses_the_configured_default_agent(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "agenttest.yaml").write_text(
        CONFIG + "defaults:\n  agent: assistants.chat\n", encoding="utf-8"
    )
    code, out, _ = run(capsys, "-i", "Hello", "--dry-run")
    assert code == 0 and json.loads(out)["turns"] == [{"input": "Hello"}]


def test_mistyped_path_through_the_cli(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys, "-i", "./tests/expens.jsonl", "-n", "assistants.expense", "--dry-run"
    )
    assert (code, out) == (2, "")
    assert err == (
        "agenttest-submit: 1 input problem; nothing was run:\n"
        "  -i: case file not found: ./tests/expens.jsonl\n"
    )
    code, _, err = run(capsys, "-i", "./test/", "-n", "assistants.expense", "--dry-run")
    assert code == 2 and err.endswith("  -i: case file or folder not found: ./test/\n")


def test_file_and_folder_through_the_cli(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for arg in ("./tests/expense.jsonl", "tests"):
        code, out, _ = run(capsys, "-i", arg, "-n", "assistants.expense", "--dry-run")
        assert code == 0
        assert json.loads(out)["id"] == "T001"


def test_no_input_at_all(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "-n", "assistants.expense", "--dry-run")
    assert code == 2
    assert err.endswith(
        '  no input: give -i FILE, -m "a message", -i - (cases on standard input) or -i '
        "agents:/scripts:GENERATOR\n"
    )


def test_bad_generator_reference_through_the_cli(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "-i", "agents:../x?count=1", "-n", "assistants.expense")
    assert code == 2
    assert err.endswith(
        "  -i: 'agents:../x?count=1': '../x' is not a valid name (letters, digits, '.', '-', "
        "'_'; no paths)\n"
    )


def test_two_messages_are_two_cases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from agenttest_submit.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "agenttest.yaml").write_text("agents:\n  a:\n    base_url: http://127.0.0.1:9/v1\n")
    assert main(["-i", "Hello", "-i", "Bye", "-n", "a", "--dry-run"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["id"], r["turns"][0]["input"]) for r in records] == [
        ("message", "Hello"),
        ("message-2", "Bye"),
    ]


def test_every_bad_input_value_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from agenttest_submit.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "agenttest.yaml").write_text("agents:\n  a:\n    base_url: http://127.0.0.1:9/v1\n")
    code = main(["-i", "missing.jsonl", "-i", "agents:../x", "-n", "a", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2
    assert "2 input problems" in err
    assert "case file not found: missing.jsonl" in err
    assert "agents:../x" in err
