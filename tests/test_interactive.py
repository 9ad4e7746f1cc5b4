"""Interactive mode on a fleet: a conversation that awaits input with no static turn and
no simulator parks in Postgres; the attached `agenttest-submit --interactive` asks the
person at its terminal (the agent's question and input_hint) and the reply resumes the
conversation on a worker. Real processes: a `celery worker`, Redis, Postgres, and the
submitter under a pseudo-terminal that the test types into.

The target is a scripted agent behind a WatchingAgent, which records for every request
the case (`[case X]` tag), the turn and the process that sent it: workers send their name
in a header, the submitter sends "none".
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from fleet import WORKER_ENV, WORKER_HEADER, Fleet, WatchingAgent, fleet_on
from scripted_agent import Body, Reply, ScriptedAgent, last_user_text, say
from terminal_kit import reap

QUESTION = "Which PO number should I use?"
HINT = "e.g. PO-12345"
PROMPT = re.compile(r"► \[([\w.-]+)\] the agent is waiting for input\n(.*?)Your reply", re.S)


def asker(body: Body) -> Reply:
    """Asks for a PO number (explicitly awaiting input, with a hint) until it gets one."""
    text = last_user_text(body)
    if "PO-" in text:
        return say(f"Recorded {text}. Done.", awaiting_input=False)
    return say(QUESTION, awaiting_input=True, input_hint=HINT)


def case(case_id: str, **fields: Any) -> dict[str, Any]:
    """One static turn only: what comes after the agent's question is up to the run."""
    return {"id": case_id, "turns": [{"input": f"Buy a laptop [case {case_id}]"}], **fields}


@dataclass
class Session:
    code: int
    text: str
    prompts: list[tuple[str, str]] = field(default_factory=list)  # (case id, prompt body)


def terminal_session(
    fleet: Fleet | None,
    argv: list[str],
    answers: dict[str, str],
    timeout: float = 40.0,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Session:
    """`agenttest-submit ARGV` (against the fleet, if given) on a pseudo-terminal; each
    prompt for a case in `answers` is answered by typing that text and Enter, other
    prompts are left alone."""
    command = [sys.executable, "-m", "agenttest_submit.cli", *argv]
    child_env = fleet.env if fleet is not None else env
    child_cwd = fleet.workdir if fleet is not None else cwd
    assert child_env is not None and child_cwd is not None
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child process
        try:
            from fleet import _die_with_parent

            _die_with_parent()
            os.chdir(child_cwd)
            os.execve(command[0], command, child_env)
        finally:
            os._exit(127)
    raw, prompts = b"", []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            try:
                data = os.read(fd, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            raw += data
            text = raw.decode("utf-8", "replace").replace("\r\n", "\n")
            for found in list(PROMPT.finditer(text))[len(prompts) :]:
                prompts.append((found.group(1), found.group(2)))
                if found.group(1) in answers:
                    os.write(fd, answers[found.group(1)].encode())
    finally:
        # It closed the terminal as it exited (or the deadline passed and it hung: then
        # it is killed, and the test fails below).
        code = reap(pid, fd, 5 if time.monotonic() < deadline else 0)
    text = raw.decode("utf-8", "replace").replace("\r\n", "\n")
    return Session(code, text, prompts)


@pytest.fixture
def target() -> Iterator[tuple[ScriptedAgent, WatchingAgent]]:
    with ScriptedAgent() as agent, WatchingAgent(agent.base_url) as watching:
        agent.script("asker", asker)
        yield agent, watching


@pytest.fixture
def fleet(
    redis_db: str,
    pg_database: str,
    demo_url: str,
    tmp_path: Path,
    target: tuple[ScriptedAgent, WatchingAgent],
) -> Iterator[Fleet]:
    config = {
        "agents": {
            "shop.assistant": {
                "base_url": target[1].base_url,
                "model": "asker",
                "max_retries": 0,
                "headers": {WORKER_HEADER: "${" + WORKER_ENV + ":-none}"},
            }
        }
    }
    (tmp_path / "agenttest.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def write_cases(directory: Path, name: str, *cases: dict[str, Any]) -> str:
    (directory / name).write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    return name


def records(path: Path) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in map(json.loads, path.read_text(encoding="utf-8").splitlines())}


@pytest.mark.fleet
def test_interactive_on_a_fleet_asks_at_the_terminal_and_a_worker_resumes(
    fleet: Fleet, target: tuple[ScriptedAgent, WatchingAgent], tmp_path: Path
) -> None:
    agent, watching = target
    fleet.start("w1")
    cases = write_cases(
        tmp_path,
        "ask.jsonl",
        case("ASK", final_assertions=[{"type": "contains", "value": "Recorded PO-777"}]),
        # Nobody answers this one: after its 1s, on_missing_input decides.
        case("WAIT", interactive={"timeout": "1s"}, on_missing_input="fail"),
    )
    session = terminal_session(
        fleet,
        ["-i", cases, "-n", "shop.assistant", "--interactive", "-o", "out.jsonl"],
        answers={"ASK": "PO-777\n"},
    )
    assert session.code == 1, session.text  # WAIT failed, as its on_missing_input says
    assert sorted(c for c, _ in session.prompts) == ["ASK", "WAIT"], session.text
    for _, body in session.prompts:
        assert f"Agent: {QUESTION}\n" in body and f"Hint: {HINT}\n" in body
    assert dict(session.prompts)["WAIT"].count("\n") == 2

    out = records(tmp_path / "out.jsonl")
    ask = out["ASK"]
    assert ask["status"] == "passed", ask
    assert [(t["input"], t["input_source"], t["output"]) for t in ask["turns"]] == [
        ("Buy a laptop [case ASK]", "static", QUESTION),
        ("PO-777", "interactive", "Recorded PO-777. Done."),
    ]
    assert ask["turns"][0]["input_hint"] == HINT
    assert ask["final_assertions"][0]["passed"] is True

    # Turn 2 was played by the worker process, not by the submitter that asked.
    assert [(s.case, s.turn, s.worker) for s in watching.seen("ASK")] == [
        ("ASK", 1, "w1"),
        ("ASK", 2, "w1"),
    ]
    assert "ASK turn 2: case passed" in fleet.logs()
    assert "PO-777" in [last_user_text(body) for body in agent.requests("asker")]

    wait = out["WAIT"]
    assert wait["status"] == "failed" and wait["total_turns"] == 1
    assert wait["error"] == (
        "Agent awaiting input, no interactive reply within 1s (on_missing_input: fail)"
    )
    assert [s.turn for s in watching.seen("WAIT")] == [1]


@pytest.mark.fleet
def test_without_a_person_on_missing_input_decides_on_a_fleet(
    fleet: Fleet, target: tuple[ScriptedAgent, WatchingAgent], tmp_path: Path
) -> None:
    _, watching = target
    fleet.start("w1")

    # --skip-interactive at a terminal: nobody is asked; the JSONL default `skip` applies.
    cases = write_cases(tmp_path, "skip.jsonl", case("SKIPPED"))
    started = time.monotonic()
    session = terminal_session(
        fleet,
        ["-i", cases, "-n", "shop.assistant", "--skip-interactive", "-o", "skip.out"],
        answers={"SKIPPED": "PO-1\n"},
    )
    assert session.code == 0, session.text
    assert session.prompts == [] and "Your reply" not in session.text
    skipped = records(tmp_path / "skip.out")["SKIPPED"]
    assert skipped["status"] == "skipped"
    assert skipped["skip_reason"] == "Agent awaiting input, no next turn defined"

    # --interactive without a terminal (stdin not a tty): the same, at once, no prompt.
    cases = write_cases(
        tmp_path,
        "end.jsonl",
        case("ENDED", on_missing_input="end"),
        case("FAILED", on_missing_input="fail"),
    )
    done = fleet.submit(["-i", cases, "-n", "shop.assistant", "--interactive", "-o", "end.out"])
    assert time.monotonic() - started < 30
    assert done.returncode == 1, done.stderr
    assert "Your reply" not in done.stderr + done.stdout
    out = records(tmp_path / "end.out")
    assert out["ENDED"]["status"] == "passed" and out["ENDED"]["total_turns"] == 1
    assert out["FAILED"]["status"] == "failed"
    assert out["FAILED"]["error"] == (
        "Agent awaiting input, no next turn defined (on_missing_input: fail)"
    )
    assert sorted((s.case, s.turn) for s in watching.seen()) == [
        ("ENDED", 1),
        ("FAILED", 1),
        ("SKIPPED", 1),
    ]


def test_end_of_input_at_the_terminal_answers_every_question_with_none(
    target: tuple[ScriptedAgent, WatchingAgent], tmp_path: Path
) -> None:
    """Embedded: Ctrl-D at the first question means nobody will answer; the next
    conversation is not asked again, and each one's on_missing_input decides."""
    _, watching = target
    config = {"agents": {"shop.assistant": {"base_url": watching.base_url, "model": "asker"}}}
    (tmp_path / "agenttest.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    cases = write_cases(
        tmp_path, "eof.jsonl", case("FIRST", on_missing_input="end"), case("SECOND")
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")}
    env["AGENTTEST_HOME"] = str(tmp_path / "home")
    session = terminal_session(
        None,
        ["-i", cases, "-n", "shop.assistant", "--interactive", "--parallel", "1", "-o", "o.jsonl"],
        answers={"FIRST": "\x04"},  # Ctrl-D on an empty line: the end of input
        env=env,
        cwd=tmp_path,
    )
    assert session.code == 0, session.text
    assert [c for c, _ in session.prompts] == ["FIRST"], session.text
    out = records(tmp_path / "o.jsonl")
    assert (out["FIRST"]["status"], out["FIRST"]["total_turns"]) == ("passed", 1)
    assert out["SECOND"]["status"] == "skipped"
    assert out["SECOND"]["skip_reason"] == "Agent awaiting input, the terminal's input has ended"
