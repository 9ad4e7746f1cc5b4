"""What `agenttest-submit` writes to a terminal: untrusted text escaped, the question an
agent asked, prompts the progress line leaves alone, colour as the environment says,
`--version` and `--only-failures`.

Runs are real: the embedded default in-process (`cli.main`) or as a process under a
pseudo-terminal, against a scripted agent or the demo agents over HTTP; the
`--only-failures` promise is checked on a one-worker fleet too.
"""

from __future__ import annotations

import importlib.metadata
import io
import json
import os
import pty
import re
import select
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import pytest
import yaml
from fleet import Fleet, fleet_on
from scripted_agent import Body, Reply, ScriptedAgent, by_last_user, call, say
from terminal_kit import reap

from agenttest_submit.cli.main import main

SUITE = Path(__file__).resolve().parents[1] / "agenttest_worker" / "demo" / "suite"
SUITE_CASES = str(SUITE / "expense-suite.jsonl")
SUITE_CONFIG = str(SUITE / "agenttest.yaml")

# Set the terminal's title; erase the screen (C1 CSI); reverse the text that follows.
TITLE = "\x1b]0;pwned\x07"
ERASE = "\x9b2J"
REVERSE = "\u202e"
# What may reach a terminal raw: our own colours, nothing else.
OUR_COLOR = re.compile(r"\x1b\[\d+m")
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


# -- helpers -------------------------------------------------------------------------------


@pytest.fixture
def agent() -> Iterator[ScriptedAgent]:
    with ScriptedAgent() as served:
        yield served


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in ("NO_COLOR", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    return tmp_path


def write_project(directory: Path, agent: ScriptedAgent, *models: str) -> Path:
    agents = {model: agent.entry(model, max_retries=0) for model in models}
    path = directory / "agenttest.yaml"
    path.write_text(yaml.safe_dump({"agents": agents}), encoding="utf-8")
    return path


def write_cases(path: Path, *cases: dict[str, Any]) -> str:
    path.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def case_block(console: str, case_id: str) -> str | None:
    match = re.search(rf"^► \[{re.escape(case_id)}\].*?(?=^\s*$)", console, re.M | re.S)
    return match.group(0) if match else None


def records(path: Path) -> dict[str, dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}


END_MARK = b"<end of what the run wrote>"


class Terminal:
    """A pseudo-terminal standing in for sys.stdout (and sys.stderr) of an in-process
    run: what is written is collected by a thread, so a long report never blocks."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        self.stream: TextIO = open(  # noqa: SIM115 - closed in close()
            self.slave, "w", encoding="utf-8", closefd=False, buffering=1
        )
        self.chunks: list[bytes] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.chunks.append(data)

    def close(self) -> str:
        self.stream.flush()
        # The terminal keeps order: once this mark has been read, so has all before it.
        os.write(self.slave, END_MARK)
        deadline = time.monotonic() + 10
        while not b"".join(self.chunks).endswith(END_MARK):
            assert time.monotonic() < deadline, "the terminal's output was not all read"
            time.sleep(0.005)
        self.stream.close()
        os.close(self.slave)
        self.reader.join(timeout=5)
        os.close(self.master)
        written = b"".join(self.chunks)[: -len(END_MARK)]
        return written.decode("utf-8", "replace").replace("\r\n", "\n")


def on_terminal(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], *, stderr_too: bool = False
) -> tuple[int, str]:
    """main(argv) with stdout (and, with `stderr_too`, stderr) on a pseudo-terminal."""
    terminal = Terminal()
    with monkeypatch.context() as patch:
        patch.setattr(sys, "stdout", terminal.stream)
        if stderr_too:
            patch.setattr(sys, "stderr", terminal.stream)
        code = main(argv)
    return code, terminal.close()


def under_pty(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    on_output: Callable[[str, int], None],
    timeout: float = 40.0,
) -> tuple[int, str]:
    """`agenttest-submit ARGV` as a process on a pseudo-terminal; `on_output(text, fd)` is
    called with everything written so far each time more arrives (it may type into fd)."""
    command = [sys.executable, "-m", "agenttest_submit.cli", *argv]
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child process
        try:
            os.chdir(cwd)
            os.execve(command[0], command, env)
        finally:
            os._exit(127)
    raw = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    data = os.read(fd, 4096)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                raw += data
            on_output(raw.decode("utf-8", "replace"), fd)
    finally:
        code = reap(pid, fd, 5 if time.monotonic() < deadline else 0)
    return code, raw.decode("utf-8", "replace")


def child_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")}
    env.pop("NO_COLOR", None)
    env.pop("FORCE_COLOR", None)
    return env | {"AGENTTEST_HOME": str(home), "TERM": "xterm-256color"}


# -- 15: control characters from cases and replies are escaped -----------------------------


def hostile(body: Body) -> Reply | str:
    text = json.dumps(body.get("messages"))
    if "ask me" in text:
        return say(f"Which one{TITLE}?", awaiting_input=True, input_hint=f"a {ERASE} hint")
    return Reply(
        content=f"Reply {TITLE} {ERASE} {REVERSE}done",
        tool_calls=[{"name": f"look{TITLE}", "args": {"q": f"v{ERASE}"}}],
    )


def test_console_output_escapes_control_characters_from_cases_and_replies(
    workdir: Path,
    agent: ScriptedAgent,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent.script("target", hostile)
    agent.script("broken", [Reply(status=400, raw=f"refused {TITLE}")] * 4)
    config = write_project(workdir, agent, "target", "broken")
    cases = write_cases(
        workdir / "hostile.jsonl",
        {
            "id": f"T{TITLE}1",
            "name": f"Name {ERASE}{REVERSE}",
            "input": f"Hi {TITLE} {ERASE}",
            "assertions": [
                {"type": "contains", "value": f"x{TITLE}", "description": f"d {ERASE}"},
                {"type": "regex", "pattern": f"y{ERASE}"},
            ],
        },
        {"id": "ERR", "agent": "broken", "input": "hello"},
        {"id": "ASK", "input": "ask me", "type": "multi_turn"},
    )
    argv = ["-i", cases, "-n", "target", "--config", str(config)]
    for extra in ([], ["-v"]):
        code, out, err = run(capsys, *argv, *extra)
        assert code == 1, out + err
        assert not RAW_CONTROL.search(out.replace("\n", "")), repr(out)
        assert not RAW_CONTROL.search(err.replace("\n", "")), repr(err)
        assert "► [T\\x1b]0;pwned\\x071] Name \\x9b2J\\u202e (1 turn)" in out, out
        assert "refused \\u001b]0;pwned\\u0007" in (case_block(out, "ERR") or ""), out
        assert "Agent asked:" in (case_block(out, "ASK") or ""), out
        assert "Which one\\u001b]0;pwned\\u0007?" in (case_block(out, "ASK") or ""), out
        assert "Input hint: a \\x9b2J hint" in (case_block(out, "ASK") or ""), out

    # With colour forced, our colour codes are the only escape sequences.
    monkeypatch.setenv("FORCE_COLOR", "1")
    code, out, _ = run(capsys, *argv, "-v")
    assert OUR_COLOR.search(out), "colour was forced"
    assert not RAW_CONTROL.search(OUR_COLOR.sub("", out).replace("\n", "")), repr(out)


def test_the_interactive_prompt_escapes_what_the_agent_said(
    agent: ScriptedAgent, tmp_path: Path
) -> None:
    agent.script("target", lambda body: say(f"Which one{TITLE}?", input_hint=f"a {ERASE}"))
    config = write_project(tmp_path, agent, "target")
    cases = write_cases(tmp_path / "ask.jsonl", {"id": f"A{TITLE}", "input": "hi"})
    typed: list[str] = []

    def answer(text: str, fd: int) -> None:
        if "Your reply" in text and not typed:
            typed.append(text)
            os.write(fd, b"\n")  # an empty line: skipped

    argv = ["-i", cases, "-n", "target", "--config", str(config), "--interactive"]
    code, text = under_pty(argv, child_env(tmp_path / "home"), tmp_path, answer)
    assert typed, text
    prompt = typed[0]
    assert "► [A\\x1b]0;pwned\\x07] the agent is waiting for input" in prompt, prompt
    assert "Which one\\x1b]0;pwned\\x07?" in prompt and "a \\x9b2J" in prompt, prompt
    assert TITLE not in text and ERASE not in text, repr(text)
    assert code == 0, text


# -- 19: the question the agent asked, or nothing -------------------------------------------


ASKING = by_last_user(
    {
        "[NOTED]": say("Noted", awaiting_input=True),
        "[TOOL]": call("ask_user", {"question": "Which cost center should I bill?"}),
        "[LAST]": say("Got it. Please provide the PO number. Thanks!", awaiting_input=True),
    }
)


def test_a_skipped_turn_shows_the_question_the_agent_asked_or_nothing(
    workdir: Path, agent: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    agent.script("target", ASKING)
    config = write_project(workdir, agent, "target")
    cases = write_cases(
        workdir / "asked.jsonl",
        # Multi-turn: a single-turn case ends after its turn, question or not.
        *(
            {"id": name, "input": f"hi [{name}]", "type": "multi_turn"}
            for name in ("NOTED", "TOOL", "LAST")
        ),
    )
    code, out, err = run(capsys, "-i", cases, "-n", "target", "--config", str(config))
    assert code == 0, out + err
    noted = case_block(out, "NOTED") or ""
    assert "Reason: Agent awaiting input" in noted and "Agent asked" not in noted, out
    assert 'Agent asked: "Which cost center should I bill?"' in (case_block(out, "TOOL") or "")
    assert 'Agent asked: "Please provide the PO number"' in (case_block(out, "LAST") or ""), out


def test_the_prompt_shows_the_question_of_an_ask_user_tool_call(
    agent: ScriptedAgent, tmp_path: Path
) -> None:
    agent.script("target", ASKING)
    config = write_project(tmp_path, agent, "target")
    cases = write_cases(tmp_path / "tool.jsonl", {"id": "TOOL", "input": "hi [TOOL]"})
    typed: list[str] = []

    def answer(text: str, fd: int) -> None:
        if "Your reply" in text and not typed:
            typed.append(text)
            os.write(fd, b"\n")

    argv = ["-i", cases, "-n", "target", "--config", str(config), "--interactive"]
    code, text = under_pty(argv, child_env(tmp_path / "home"), tmp_path, answer)
    assert typed, text
    assert "Agent: Which cost center should I bill?" in typed[0], typed[0]
    assert code == 0, text


# -- 20: prompts and the progress line ------------------------------------------------------


# A reply ends this long after it was sent (the end of a delayed reply) before the prompt
# that was up meanwhile is answered: time enough for a draw over it to reach the screen.
SETTLE = 0.25  # well over the progress line's 0.1 s between draws


class ParkedThenSlow:
    """A and B ask for a PO number; SLOW answers late. Notes when each delayed reply is
    sent: SLOW's while the first prompt is up, a PO reply's while the next one is."""

    def __init__(self) -> None:
        self.slow_sent: list[float] = []
        self.po_sent: list[float] = []

    def __call__(self, body: Body) -> Reply | str:
        text = json.dumps(body.get("messages"))
        if "PO-" in text:
            self.po_sent.append(time.monotonic() + 0.3)
            return say("Recorded. Done.", delay=0.3)  # ends while the next prompt is up
        if "[SLOW]" in text:
            self.slow_sent.append(time.monotonic() + 0.5)
            return say("Done.", delay=0.5)  # ends while the first prompt is up
        return say("Which PO number?", awaiting_input=True)

    def ended_while_up(self, prompt: int) -> float | None:
        """When the reply that ends while prompt `prompt` (0, 1) is up was sent."""
        sent = self.slow_sent if prompt == 0 else self.po_sent
        return sent[0] if sent else None


def test_the_progress_line_never_overwrites_a_prompt(agent: ScriptedAgent, tmp_path: Path) -> None:
    rule = ParkedThenSlow()
    agent.script("target", rule)
    config = write_project(tmp_path, agent, "target")
    cases = write_cases(
        tmp_path / "parked.jsonl",
        *({"id": name, "input": f"hi [{name}]"} for name in ("A", "B", "SLOW")),
    )
    seen: list[tuple[float, int]] = []  # (when the prompt was first seen, its offset)
    while_up: list[str] = []
    ended: list[float] = []  # when the reply that ended while each prompt was up was sent

    def answer(text: str, fd: int) -> None:
        prompts = [m.end() for m in re.finditer(r"Your reply \([^)]*\): ", text)]
        if len(prompts) > len(seen):
            seen.append((time.monotonic(), prompts[-1]))
        if len(seen) > len(while_up):
            sent = rule.ended_while_up(len(while_up))
            if sent is not None and time.monotonic() > sent + SETTLE:
                ended.append(sent)
                while_up.append(text[seen[-1][1] :])  # what was written while it waited
                os.write(fd, b"PO-1\n")

    argv = ["-i", cases, "-n", "target", "--config", str(config), "--interactive"]
    argv += ["--parallel", "3", "-o", "out.jsonl"]
    code, text = under_pty(argv, child_env(tmp_path / "home"), tmp_path, answer)
    assert code == 0, text
    assert len(while_up) == 2, text
    for (shown, _), sent in zip(seen, ended, strict=True):
        assert shown < sent, "a reply meant to end while a prompt was up ended before it"
    for written in while_up:
        assert written == "", f"written over the prompt: {written!r}"
    out = records(tmp_path / "out.jsonl")
    assert {k: r["status"] for k, r in out.items()} == {
        "A": "passed",
        "B": "passed",
        "SLOW": "passed",
    }


def test_interactive_without_a_terminal_warns(
    workdir: Path,
    demo_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENTTEST_DEMO_URL", demo_url)
    monkeypatch.setattr(sys, "stdin", io.StringIO("PO-1\n"))  # a pipe, not a person
    argv = ["-i", SUITE_CASES, "-n", "assistants.expense", "--config", SUITE_CONFIG]
    code, _, err = run(capsys, *argv, "--id", "T002", "--interactive")
    assert code == 0
    assert "warning: --interactive: stdin is not a terminal" in err, err
    code, _, err = run(capsys, *argv, "--id", "T002")
    assert "warning" not in err, err


# -- 23: colour, --version, --only-failures ---------------------------------------------------

GREEN_PASSED = "\x1b[32mPASSED\x1b[0m"


def test_colour_follows_the_terminal_no_color_force_color_and_term_dumb(
    workdir: Path,
    demo_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("AGENTTEST_DEMO_URL", demo_url)
    argv = ["-i", SUITE_CASES, "-n", "assistants.expense", "--config", SUITE_CONFIG]
    argv += ["--id", "T004"]  # one turn, fails: coloured words in the case and the summary

    def colored(env: dict[str, str], *, tty: bool = True) -> bool:
        with monkeypatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            if tty:
                _, text = on_terminal(patch, argv)
            else:
                _, text, _ = run(capsys, *argv)
        assert "► [T004]" in text, text
        return "\x1b[" in text

    assert colored({}), "a terminal gets colour"
    assert not colored({}, tty=False), "a pipe gets none"
    assert not colored({"NO_COLOR": "1"})
    assert colored({"NO_COLOR": ""}), "an empty NO_COLOR is not set"
    assert not colored({"TERM": "dumb"})
    assert colored({"FORCE_COLOR": "1"}, tty=False)
    assert colored({"FORCE_COLOR": "1", "TERM": "dumb"})
    assert not colored({"FORCE_COLOR": "0"})
    assert not colored({"NO_COLOR": "1", "FORCE_COLOR": "1"}), "NO_COLOR wins"

    # `report RUN` follows the same rules.
    with monkeypatch.context() as patch:
        patch.setenv("NO_COLOR", "1")
        _, text = on_terminal(patch, ["report", "last"])
    assert "► [T004]" in text and "\x1b[" not in text, repr(text)

    # TERM=dumb: no cursor movement for the progress line either.
    with monkeypatch.context() as patch:
        patch.setenv("TERM", "dumb")
        _, text = on_terminal(patch, argv, stderr_too=True)
    assert "\x1b" not in text and "\r" not in text, repr(text)


def test_version_prints_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--version")
    assert code == 0, err
    assert out.strip() == f"agenttest-submit {importlib.metadata.version('agenttest')}"


def only_failures_check(out: str, outfile: Path) -> None:
    """The suite's report with --only-failures: T002 (skipped) and T004 (failed) shown,
    T001 and T003 (passed) not; the summary counts all four; -o keeps every record."""
    assert case_block(out, "T001") is None and case_block(out, "T003") is None, out
    assert "Result: SKIPPED" in (case_block(out, "T002") or ""), out
    assert "Result: FAILED" in (case_block(out, "T004") or ""), out
    assert "2 passed cases not shown (--only-failures)" in out, out
    summary = out.split("  Summary\n", 1)[1]
    for line in ("Total:   4 tests", "Passed:  2", "Failed:  1", "Skipped: 1"):
        assert line in summary, out
    assert sorted(records(outfile)) == ["T001", "T002", "T003", "T004"]


def test_only_failures_shows_failed_and_skipped_cases_and_the_whole_summary(
    workdir: Path,
    demo_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENTTEST_DEMO_URL", demo_url)
    argv = ["-i", SUITE_CASES, "-n", "assistants.expense", "--config", SUITE_CONFIG]
    code, out, err = run(capsys, *argv, "--only-failures", "--format", "console")
    assert code == 1, err
    assert case_block(out, "T001") is None, out
    code, out, err = run(capsys, *argv, "--only-failures", "-o", "all.jsonl")
    assert code == 1, err
    only_failures_check(out, workdir / "all.jsonl")


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


@pytest.mark.fleet
def test_only_failures_and_the_interactive_warning_on_a_fleet(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start("w1", concurrency=2)
    argv = ["-i", SUITE_CASES, "-n", "assistants.expense", "--config", SUITE_CONFIG]
    done = fleet.submit([*argv, "--only-failures", "--interactive", "-o", "fleet.jsonl"])
    assert done.returncode == 1, done.stderr
    only_failures_check(done.stdout, tmp_path / "fleet.jsonl")
    assert "warning: --interactive: stdin is not a terminal" in done.stderr, done.stderr
