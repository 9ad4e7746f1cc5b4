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


def test_two_targets_play_every_case_against_each(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-n is the one option given more than once on purpose (tests/test_two_targets.py)."""
    code, out, err = run(
        capsys, "-i", "cases", "-n", "assistants.expense", "-n", "assistants.chat", "--dry-run"
    )
    assert code == 0, err
    agents = [json.loads(line)["agent"] for line in out.splitlines()]
    assert agents[:2] == ["assistants.expense", "assistants.chat"]
    assert "× 2 targets" in err


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


# -- -i values that look like paths, -m, -i - ---------------------------------------------------


@pytest.mark.parametrize(
    ("arg", "problem"),
    [
        ("cases/expense.jsnl", "-i: case file or folder not found: cases/expense.jsnl"),
        (
            "nosuchdir",
            "-i: no case file or folder named 'nosuchdir'; to send it to the agent as a "
            "message: -m 'nosuchdir'",
        ),
        ("./missing.yaml", "-i: case file not found: ./missing.yaml"),
        ("missing.yaml", "-i: case file not found: missing.yaml"),
        (
            "notes.txt",
            "-i: no case file or folder named 'notes.txt'; to send it to the agent "
            "as a message: -m 'notes.txt'",
        ),
        ("/no/such/place", "-i: case file or folder not found: /no/such/place"),
    ],
)
def test_a_value_that_looks_like_a_path_is_an_input_error(
    project: Path, capsys: pytest.CaptureFixture[str], arg: str, problem: str
) -> None:
    code, out, err = run(capsys, "-i", arg, "-n", "assistants.chat")
    assert (code, out) == (2, "")
    assert err == f"agenttest-submit: 1 input problem; nothing was run:\n  {problem}\n"


def test_a_message_that_does_not_look_like_a_path_still_is_one(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys, "-i", "Hello", "-i", "Hello, how are you?", "-n", "assistants.chat", "--dry-run"
    )
    assert code == 0
    assert [json.loads(line)["turns"][0]["input"] for line in out.splitlines()] == [
        "Hello",
        "Hello, how are you?",
    ]


def test_m_sends_any_text_as_a_message(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "-m",
        "cases/expense.jsnl",
        "--message",
        "nosuchdir",
        "-n",
        "assistants.chat",
        "--dry-run",
    )
    assert code == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert [(r["id"], r["turns"][0]["input"]) for r in records] == [
        ("message", "cases/expense.jsnl"),
        ("message-2", "nosuchdir"),
    ]
    code, _, err = run(capsys, "-m", "hi")
    assert code == 2 and "-m: a direct message needs a target agent: add -n NAME" in err


def submit_process(
    args: list[str], stdin: str, env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agenttest_submit.cli", *args],
        input=stdin,
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def embedded_env(tmp_path: Path, demo_url: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")}
    env.update(AGENTTEST_HOME=str(tmp_path / ".agenttest"), AGENTTEST_DEMO_URL=demo_url)
    return env


def test_cases_from_standard_input_run_embedded(tmp_path: Path, demo_url: str) -> None:
    """`-i -` plays what `-i FILE` plays: the same cases, the same verdicts."""
    lines = Path(SUITE_CASES).read_text(encoding="utf-8")
    env = embedded_env(tmp_path, demo_url)
    common = ["-n", "assistants.expense", "--config", SUITE_CONFIG, "--format", "jsonl"]
    piped = submit_process(["-i", "-", *common], lines, env, tmp_path)
    from_file = submit_process(["-i", SUITE_CASES, *common], "", env, tmp_path)
    assert piped.returncode == from_file.returncode, piped.stderr
    assert "Traceback" not in piped.stderr and "internal error" not in piped.stderr

    def verdicts(out: str) -> list[tuple[str, str]]:
        return [(r["id"], r["status"]) for r in map(json.loads, out.splitlines())]

    assert verdicts(piped.stdout) == verdicts(from_file.stdout)
    assert [i for i, _ in verdicts(piped.stdout)] == [
        json.loads(line)["id"] for line in lines.splitlines()
    ]


def test_bad_cases_on_standard_input_are_located_at_their_line(
    tmp_path: Path, demo_url: str
) -> None:
    done = submit_process(
        ["-i", "-", "-n", "assistants.expense", "--config", SUITE_CONFIG],
        '{"id": "a", "input": "x"}\n{"id": "b", "input": "x"\n',
        embedded_env(tmp_path, demo_url),
        tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert "<stdin>:2" in done.stderr and "Traceback" not in done.stderr
    empty = submit_process(
        ["-i", "-", "-n", "assistants.expense", "--config", SUITE_CONFIG],
        "",
        embedded_env(tmp_path, demo_url),
        tmp_path,
    )
    assert empty.returncode == 2
    assert "<stdin>: no test cases in this input (it is empty)" in empty.stderr


# -- --no-wait: the run id alone on stdout -----------------------------------------------------


def test_no_wait_prints_the_run_id_alone_on_stdout_embedded(tmp_path: Path, demo_url: str) -> None:
    env = embedded_env(tmp_path, demo_url)
    args = ["-i", SUITE_CASES, "-n", "assistants.expense", "--config", SUITE_CONFIG]
    done = submit_process([*args, "--no-wait"], "", env, tmp_path)
    assert done.returncode in (0, 1), done.stderr
    run_id = done.stdout.strip()
    assert done.stdout == f"{run_id}\n" and " " not in run_id
    assert "warning: --no-wait" in done.stderr and "Summary" in done.stderr  # the report
    status = submit_process(["status", run_id], "", env, tmp_path)
    assert status.returncode == 0 and f"run       {run_id}" in status.stdout
    assert "status    done" in status.stdout


# -- view on a port in use -------------------------------------------------------------------


def test_view_on_a_port_in_use_says_so(tmp_path: Path, demo_url: str) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = embedded_env(tmp_path, demo_url)
        for command in (["view"], ["metrics", "--host", "127.0.0.1"]):
            done = submit_process([*command, "--port", str(port)], "", env, tmp_path)
            assert done.returncode == 2, done.stderr
            assert done.stderr == (
                "agenttest-submit: 1 input problem:\n"
                f"  --port: port {port} on 127.0.0.1 is in use (another viewer, or another "
                "program): give another --port, or --port 0 for any free one\n"
            )
    done = submit_process(["view", "--port", "70000"], "", env, tmp_path)
    assert done.returncode == 2 and "a port is 0 (any free one) to 65535" in done.stderr


# -- every subcommand: its help, and the options pasted from a run -----------------------------

SUBCOMMAND_NAMES = [
    "runs",
    "diff",
    "history",
    "metrics",
    "view",
    "status",
    "report",
    "resume",
    "db",
    "schema",
    "cancel",
    "prune",
]


def entries_without_help(help_text: str) -> list[str]:
    """The arguments in an argparse --help text with no description beside or under them."""
    lines = help_text.splitlines()
    missing = []
    in_section = False
    for number, line in enumerate(lines):
        if line.endswith(":") and not line.startswith(" "):
            in_section = line in ("options:", "positional arguments:")
            continue
        if not in_section or not line.startswith("  ") or line.startswith("   "):
            continue
        entry, _, beside = line.strip().partition("  ")
        below = lines[number + 1] if number + 1 < len(lines) else ""
        if not beside.strip() and not below.startswith(" " * 8):
            missing.append(entry)
    return missing


def help_of(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main([*argv, "--help"]) == 0
    return capsys.readouterr().out


def test_help_lists_every_subcommand_and_every_option_says_what_it_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = help_of(capsys)
    listed = text.split("subcommands (", 1)[1].split("examples:", 1)[0]
    for name in SUBCOMMAND_NAMES:
        assert f"\n  {name}" in listed, name
    assert "examples:\n  agenttest-submit -i " in text
    assert entries_without_help(text) == []
    for name in SUBCOMMAND_NAMES:
        sub = help_of(capsys, name)
        assert sub.startswith(f"usage: agenttest-submit {name}")
        assert entries_without_help(sub) == [], name


def test_the_checker_of_help_lines_finds_a_bare_option() -> None:
    bare = "usage: x\n\noptions:\n  -h, --help  show help\n  --bare\n  --ok N      fine\n"
    assert entries_without_help(bare) == ["--bare"]


def test_options_pasted_from_a_run_are_used_or_refused_with_the_reason(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["-i", SUITE_CASES, "-n", "assistants.expense", "--config", SUITE_CONFIG]
    assert main([*args, "--no-wait"]) in (0, 1)
    run_id = capsys.readouterr().out.strip()
    # Used where they mean something.
    assert main(["report", run_id, "--format", "junit", "-o", "junit.xml"]) in (0, 1)
    assert (demo / "junit.xml").read_text(encoding="utf-8").startswith("<?xml")
    assert main(["runs", "--format", "json", "-o", "runs.json"]) == 0
    assert json.loads((demo / "runs.json").read_text(encoding="utf-8"))[0]["run_id"] == run_id
    assert main(["schema", "config", "-o", "config.schema.json"]) == 0
    assert "properties" in json.loads((demo / "config.schema.json").read_text(encoding="utf-8"))
    capsys.readouterr()
    # Refused, with the reason, where they do not.
    for argv, field, why in [
        (["status", run_id, "--config", SUITE_CONFIG], "--config", "status reads the store"),
        (["report", run_id, "--config", SUITE_CONFIG], "--config", "report reads the store"),
        (["status", run_id, "--format", "json"], "--format", "report RUN --format F"),
        (["status", run_id, "-o", "x.txt"], "-o/--output", "redirect it (> FILE)"),
        (["resume", run_id, "--format", "json"], "--format", "report RUN --format F"),
        (["cancel", run_id, "-o", "x"], "-o/--output", "cancel prints only what it did"),
        (["view", "--format", "html"], "--format", "report RUN --format html -o FILE"),
        (["schema", "--format", "json"], "--format", "a JSON Schema document"),
        (["prune", "--older-than", "1d", "--config", "x"], "--config", "not agenttest.yaml"),
    ]:
        code, out, err = run(capsys, *argv)
        assert (code, out) == (2, ""), argv
        assert f"  {field}: not used by {argv[0]}: " in err and why in err, err
