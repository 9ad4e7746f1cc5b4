"""`agenttest-submit` and `agenttest-demo run` end to end on the embedded default.

No broker: every run is stored in SQLite under the test's own AGENTTEST_HOME and its
conversations run in-process against the demo agents over real HTTP. Most tests call
`agenttest_submit.cli.main.main` in-process (fast); the quickstart, a terminal session and
the console scripts themselves run as real processes.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import pty
import re
import select
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scripted_agent import Reply, ScriptedAgent, say
from terminal_kit import reap

from agenttest_submit.cli.main import main
from agenttest_worker.results import CaseResult

SUITE = Path(__file__).resolve().parents[1] / "agenttest_worker" / "demo" / "suite"
SUITE_CASES = str(SUITE / "expense-suite.jsonl")
SUITE_CONFIG = str(SUITE / "agenttest.yaml")
BIN = Path(sys.executable).parent
RUN_ID = re.compile(r"ℹ Run: (\S+)")

# The spec's "JSONL Output" record, and what README "Results" documents on top of it.
SPEC_CASE_KEYS = {"id", "name", "status", "turns", "final_assertions", "total_turns", "duration_ms"}
SPEC_TURN_KEYS = {
    "turn",
    "input",
    "input_source",
    "output",
    "tool_calls",
    "awaiting_input",
    "assertions",
    "duration_ms",
}
EXTRA_CASE_KEYS = {
    "error",
    "version",
    "agent",
    "skip_reason",
    "goal_achieved",
    "simulator",
    "tags",
    "usage",
    "file",
    "line",
    # Calls, tokens and cost by role (target, judge, simulator, ...).
    "usage_by_role",
    # Why a failed or skipped case did (agent, judge, simulator, ...).
    "cause",
    # The conversation's trace (docs/opentelemetry.md).
    "trace_id",
}
EXTRA_TURN_KEYS = {
    "error",
    "skip_reason",
    "status",
    "awaiting_reason",
    "finish_reason",
    "input_hint",
    "tool_results",
    "simulator_reasoning",
    "usage",
    "calls",
    "assertion_errors",
    "problems",
}

GREETING = "Hello! I can help you submit expense reports."


# -- helpers -------------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """main(argv) in-process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def suite(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """The bundled suite against the demo agents, plus `argv`."""
    return run(
        capsys, "-i", SUITE_CASES, "-n", "assistants.expense", "--config", SUITE_CONFIG, *argv
    )


def records(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def write_cases(path: Path, cases: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    return path


def slow_config(path: Path, delay_ms: int, model: str = "expense") -> Path:
    """agenttest.yaml with one agent, `slow`: a demo model answering after delay_ms."""
    path.write_text(
        "agents:\n"
        "  slow:\n"
        "    protocol: openai\n"
        "    base_url: ${AGENTTEST_DEMO_URL}\n"
        f"    model: {model}\n"
        f'    headers: {{X-Demo-Delay-Ms: "{delay_ms}"}}\n'
        "    timeout: 30s\n"
        "    max_retries: 0\n",
        encoding="utf-8",
    )
    return path


def case_block(console: str, case_id: str) -> str:
    """The lines of one case in a console report, from its ► line to the blank line."""
    match = re.search(rf"^► \[{re.escape(case_id)}\].*?(?=^\s*$)", console, re.M | re.S)
    assert match, f"case {case_id} not in the report:\n{console}"
    return match.group(0)


def without_times(text: str) -> str:
    """Durations ("(51ms)", "(2.1s)") replaced, so that a report can be compared whole."""
    return re.sub(r"\(\d+(\.\d+)?m?s\)", "(TIME)", text)


def summary_block(console: str) -> list[str]:
    tail = console.split("  Summary\n", 1)[1]
    return [line for line in tail.splitlines() if line.strip() and "─" not in line]


def submit_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")}
    env["AGENTTEST_HOME"] = str(home)
    return env


# -- real processes, started together up front (each pays the interpreter's start-up) -----


class Processes:
    """The console scripts run as real processes, all started at once."""

    def __init__(self, root: Path, demo_url: str) -> None:
        self.root = root
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.results: dict[str, tuple[int, str, str]] = {}
        self.start("quickstart", [str(BIN / "agenttest-demo"), "run"])
        self.start("verbose", [str(BIN / "agenttest-demo"), "run", "-v", "-o", "results.jsonl"])
        self.start(
            "input-error",
            [
                str(BIN / "agenttest-submit"),
                "-i",
                SUITE_CASES,
                "-n",
                "nope",
                "--config",
                SUITE_CONFIG,
            ],
            AGENTTEST_DEMO_URL=demo_url,
        )

    def start(self, name: str, argv: list[str], **env: str) -> None:
        cwd = self.root / name
        cwd.mkdir()
        self.procs[name] = subprocess.Popen(
            argv,
            cwd=cwd,
            env=submit_env(cwd / "home") | env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )

    def result(self, name: str) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) of the process, once it has ended."""
        if name not in self.results:
            out, err = self.procs[name].communicate(timeout=90)
            self.results[name] = (self.procs[name].returncode, out, err)
        return self.results[name]

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


@pytest.fixture(scope="module")
def processes(tmp_path_factory: pytest.TempPathFactory, demo_url: str) -> Iterator[Processes]:
    started = Processes(tmp_path_factory.mktemp("processes"), demo_url)
    try:
        yield started
    finally:
        started.close()


# -- the README's first command, as a real process -------------------------------------------


def test_demo_run_quickstart_reports_every_kind_of_case(processes: Processes) -> None:
    """`agenttest-demo run`: the bundled suite end to end, exit 1 for its failing case."""
    code, out, err = processes.result("quickstart")
    home = processes.root / "quickstart" / "home"
    assert code == 1, err
    assert "Traceback" not in err
    assert "demo agents serving at http://127.0.0.1:" in err
    assert (home / "agenttest.db").is_file(), "the embedded store lives under AGENTTEST_HOME"

    assert out.startswith("═" * 63 + "\n  Agent Test (Multi-Turn)\n")
    assert "ℹ Agent: assistants.expense" in out
    assert "expense-suite.jsonl (4 test cases)" in out
    assert RUN_ID.search(out)
    assert [m.group(1) for m in re.finditer(r"^► \[(\w+)\]", out, re.M)] == [
        "T001",
        "T002",
        "T003",
        "T004",
    ]

    # A static multi-turn case that passed, every turn with its reply and assertions,
    # as in the spec's Console Output.
    t001 = case_block(out, "T001")
    assert t001.startswith("► [T001] Expense Reimbursement Flow (3 turns)\n")
    for line in (
        '├─ Turn 1: "I want to submit an expense" → PASSED',
        'Agent: "What type of expense would you like to submit?"',
        '✓ contains "type of expense"',
        '✓ agent: The reply must mention "$3500" and ask to "confirm"',
        '├─ Turn 3: "Yes, confirm" → PASSED',
        "└─ Final Assertions: PASSED",
        '✓ $.expense.status = "submitted"',
    ):
        assert line in t001, f"{line!r} missing from:\n{t001}"
    # A simulator-driven case.
    assert case_block(out, "T003").startswith(
        "► [T003] Dynamic Expense Flow (simulator: workers.test.user-sim)\n"
    )
    # Skipped: the agent asked for input and nothing can give it.
    assert without_times(case_block(out, "T002")).splitlines() == [
        "► [T002] Large Expense Approval",
        '  ├─ Turn 1: "Submit $100,000 equipment purchase" → PASSED (TIME)',
        '  │          Agent: "This requires manager approval. Please provide PO number."',
        '  │          ✓ contains "manager approval"',
        "  │",
        "  ├─ Turn 2: SKIPPED",
        "  │          Reason: Agent awaiting input, no next turn defined",
        '  │          Agent asked: "Please provide PO number"',
        "  │          Hint: Add more turns, use --interactive, configure simulator,"
        " or set on_missing_input: end",
        "  │",
        "  └─ Result: SKIPPED",
    ]
    # Failed, with the reason.
    failed = case_block(out, "T004")
    assert failed.startswith("► [T004] Greeting mentions refunds (1 turn)\n")
    assert '✗ contains "refund"' in failed
    assert f'reply does not contain "refund"; reply was "{GREETING}"' in failed
    assert failed.rstrip().endswith("└─ Result: FAILED")

    summary = summary_block(out)
    assert summary[:7] == [
        "  Total:   4 tests",
        "  Passed:  2",
        "  Failed:  1",
        "  Skipped: 1",
        "  Total turns: 8",
        "  Avg turns/test: 2.0",
        summary[6],
    ]
    assert re.fullmatch(r"  Total time: \d+(\.\d+)?m?s", summary[6]), summary[6]


def test_demo_run_verbose_shows_every_turn_and_writes_jsonl(processes: Processes) -> None:
    """`agenttest-demo run -v -o results.jsonl`: extra arguments reach agenttest-submit."""
    code, out, err = processes.result("verbose")
    assert code == 1, err
    assert "results written to results.jsonl" in err

    t001 = case_block(out, "T001")
    for line in (
        '├─ Turn 1: "I want to submit an expense" → PASSED',
        'Agent: "What type of expense would you like to submit?"',
        '✓ contains "type of expense"',
        '├─ Turn 2: "Business travel, $3500" → PASSED',
        "[tool: create_expense({amount: 3500,",
        '✓ tool_called "create_expense" with {amount: 3500}',
        '✓ agent: The reply must mention "$3500" and ask to "confirm"',
        '├─ Turn 3: "Yes, confirm" → PASSED',
        'Agent: "Expense submitted. Reference: EXP-2025-001"',
        "└─ Final Assertions: PASSED",
        '✓ $.expense.status = "submitted"',
    ):
        assert line in t001, f"{line!r} missing from:\n{t001}"
    t003 = case_block(out, "T003")
    assert '├─ Turn 1: [Initial] "Help me file an expense" → PASSED' in t003
    assert re.search(r'Turn 2: \[Simulated\] "[^"]+" → PASSED', t003)
    assert "Final Assertions: PASSED" in t003

    lines = (processes.root / "verbose" / "results.jsonl").read_text(encoding="utf-8").splitlines()
    assert [CaseResult.model_validate_json(line).id for line in lines] == [
        "T001",
        "T002",
        "T003",
        "T004",
    ]


# -- -o: the JSONL records -----------------------------------------------------------------


def test_output_jsonl_has_the_spec_record_shape(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = suite(capsys, "-o", "results.jsonl")
    assert code == 1, err
    recs = records(demo / "results.jsonl")
    assert [r["id"] for r in recs] == ["T001", "T002", "T003", "T004"]
    assert [r["status"] for r in recs] == ["passed", "skipped", "passed", "failed"]

    for rec in recs:
        assert rec.keys() >= SPEC_CASE_KEYS, rec["id"]
        assert rec.keys() <= SPEC_CASE_KEYS | EXTRA_CASE_KEYS, rec.keys() - SPEC_CASE_KEYS
        for turn in rec["turns"]:
            assert turn.keys() <= SPEC_TURN_KEYS | EXTRA_TURN_KEYS, turn.keys() - SPEC_TURN_KEYS
            if turn["input"] is not None:  # a turn that ran (not a "Turn N: SKIPPED" entry)
                assert turn.keys() >= SPEC_TURN_KEYS, (rec["id"], turn["turn"])
                assert isinstance(turn["duration_ms"], int) and turn["duration_ms"] >= 0
            for call in turn["tool_calls"]:
                assert {"name", "args"} <= call.keys() <= {"name", "args", "id"}
            for assertion in turn["assertions"]:
                assert isinstance(assertion["passed"], bool) and assertion["type"]
        assert rec["total_turns"] == sum(1 for t in rec["turns"] if t["input"] is not None)
        assert rec["duration_ms"] >= sum(t["duration_ms"] for t in rec["turns"])
        # Parses back as the result model, unchanged.
        parsed = CaseResult.model_validate(rec)
        assert json.loads(parsed.to_json_line()) == rec

    t001 = recs[0]
    assert t001["name"] == "Expense Reimbursement Flow"
    assert t001["total_turns"] == 3
    turns = t001["turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3]
    assert [t["input"] for t in turns] == [
        "I want to submit an expense",
        "Business travel, $3500",
        "Yes, confirm",
    ]
    assert {t["input_source"] for t in turns} == {"static"}
    assert turns[0]["output"] == "What type of expense would you like to submit?"
    assert [t["awaiting_input"] for t in turns] == [True, True, False]
    assert turns[0]["tool_calls"] == []
    assert turns[0]["assertions"] == [
        {
            "type": "contains",
            "value": "type of expense",
            "passed": True,
            "reason": 'reply contains "type of expense"',
        }
    ]
    [tool_call] = turns[1]["tool_calls"]
    assert tool_call["name"] == "create_expense"
    assert tool_call["args"]["amount"] == 3500
    assert turns[1]["assertions"][0] | {"reason": ""} == {
        "type": "tool_called",
        "name": "create_expense",
        "args": {"amount": 3500},
        "passed": True,
        "reason": "",
    }
    judged = turns[1]["assertions"][1]
    assert judged["type"] == "agent" and judged["passed"] is True
    assert judged["use"] == "agents:workers.test.validator"
    assert turns[2]["output"] == "Expense submitted. Reference: EXP-2025-001"
    assert [
        {k: a[k] for k in ("type", "path", "value", "passed")} for a in t001["final_assertions"]
    ] == [{"type": "json_path", "path": "$.expense.status", "value": "submitted", "passed": True}]

    t002 = recs[1]
    assert t002["skip_reason"] == "Agent awaiting input, no next turn defined"
    assert t002["turns"][-1]["status"] == "skipped" and t002["turns"][-1]["input"] is None
    t003 = recs[2]
    assert t003["simulator"] == "agents:workers.test.user-sim"
    assert [t["input_source"] for t in t003["turns"]][:2] == ["static", "simulator"]
    t004 = recs[3]
    assert t004["turns"][0]["assertions"][0]["passed"] is False


# -- exit codes ----------------------------------------------------------------------------


def test_exit_0_when_every_selected_case_passes(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = suite(capsys, "--id", "T001")
    assert code == 0, err
    assert "Total:   1 test\n" in out and "Passed:  1\n" in out


def test_exit_1_when_a_case_fails(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = suite(capsys, "--id", "T004")
    assert code == 1
    assert "Failed:  1\n" in out


def test_skipped_cases_alone_exit_0(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = suite(capsys, "--id", "T002")
    assert code == 0
    assert "Skipped: 1\n" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-i", SUITE_CASES, "-n", "nope", "--config", SUITE_CONFIG], "unknown agent 'nope'"),
        (["-i", "bad.jsonl", "-n", "assistants.expense", "--config", SUITE_CONFIG], "bad.jsonl:2"),
        (["-i", "missing.jsonl", "--config", SUITE_CONFIG], "case file not found: missing.jsonl"),
        (["-i", "./nowhere/", "--config", SUITE_CONFIG], "not found: ./nowhere/"),
        (["-i", "Hello there", "--config", SUITE_CONFIG], "needs a target agent"),
        (["-n", "assistants.expense", "--config", SUITE_CONFIG], "no input"),
        (["-i", SUITE_CASES, "--config", "nope.yaml"], "nope.yaml"),
        (["-i", SUITE_CASES, "--config", SUITE_CONFIG, "--timeout", "soon"], "--timeout"),
        (["-i", SUITE_CASES, "--config", SUITE_CONFIG, "--parallel", "0"], "--parallel"),
        (["-i", SUITE_CASES, "--config", SUITE_CONFIG, "--format", "xml"], "--format"),
        (["-i", SUITE_CASES, "--config", SUITE_CONFIG, "--id", "T999"], "no case matches"),
        (
            ["-i", SUITE_CASES, "--config", SUITE_CONFIG, "--simulator", "agents:nobody"],
            "--simulator: unknown agent 'nobody'",
        ),
        (
            [
                "-i",
                SUITE_CASES,
                "-n",
                "assistants.expense",
                "--config",
                SUITE_CONFIG,
                "-o",
                "no/such/dir/results.jsonl",
            ],
            "no/such/dir",
        ),
        (["-i", "empty.jsonl", "-n", "assistants.expense", "--config", SUITE_CONFIG], "no test"),
        (["status", "last"], "no runs yet"),
        (["report", "20990101-000000-abcdef"], "no run '20990101-000000-abcdef'"),
        (["db", "downgrade"], "invalid choice"),
    ],
)
def test_exit_2_for_input_errors_without_traceback(
    demo: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (demo / "bad.jsonl").write_text(
        '{"id": "OK", "input": "Hello"}\n{"id": "X", "input": \n', encoding="utf-8"
    )
    (demo / "empty.jsonl").write_text("", encoding="utf-8")
    code, out, err = run(capsys, *argv)
    assert code == 2, (out, err)
    assert message in err
    assert "Traceback" not in err
    assert "internal error" not in err
    if argv[0] not in ("status", "report", "db"):
        assert out == ""
        assert not (demo / ".agenttest" / "agenttest.db").exists(), "nothing runs"


def test_bad_settings_are_input_errors_naming_the_variable(
    demo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTTEST_VISIBILITY_TIMEOUT", "an hour")
    monkeypatch.setenv("agenttest_worker_sweeper", "maybe")  # names match in any case
    code, out, err = run(
        capsys, "-i", SUITE_CASES, "-n", "assistants.expense", "--config", SUITE_CONFIG
    )
    assert code == 2, (out, err)
    assert "AGENTTEST_VISIBILITY_TIMEOUT: Input should be a valid integer" in err
    assert "AGENTTEST_WORKER_SWEEPER: Input should be a valid boolean" in err
    assert "Traceback" not in err and "internal error" not in err
    assert not (demo / ".agenttest" / "agenttest.db").exists(), "nothing runs"


def test_a_home_that_cannot_be_a_directory_is_an_input_error(
    demo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (demo / "a-file").write_text("in the way")
    monkeypatch.setenv("AGENTTEST_HOME", str(demo / "a-file" / "home"))
    code, out, err = run(
        capsys, "-i", SUITE_CASES, "-n", "assistants.expense", "--config", SUITE_CONFIG
    )
    assert code == 2, (out, err)
    assert "AGENTTEST_HOME: cannot create the local store's directory" in err
    assert "nothing was run" in err and "Traceback" not in err


@pytest.mark.parametrize("url", ["bogus://x", "not a url", "postgress://me:s3cret@db/x"])
def test_a_database_url_of_no_known_store_is_an_input_error(
    url: str, demo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTTEST_DATABASE_URL", url)
    code, out, err = run(
        capsys, "-i", SUITE_CASES, "-n", "assistants.expense", "--config", SUITE_CONFIG
    )
    assert code == 2, (out, err)
    assert "AGENTTEST_DATABASE_URL: Value error, not a database URL agenttest can use" in err
    assert "nothing was run" in err and "Traceback" not in err and "internal error" not in err
    assert "s3cret" not in err, "a password in a rejected URL is not printed"


def test_database_urls_of_both_stores_are_accepted() -> None:
    from agenttest_worker.settings import Settings

    for url in (
        "postgresql://postgres@127.0.0.1:5432/test",
        "postgres://u:p@h/db",
        "postgresql+psycopg://u@h/db",
        "sqlite:////tmp/x.db",
        "SQLITE:///relative.db",
    ):
        assert Settings.from_environment({"AGENTTEST_DATABASE_URL": url}).database_url == url


def test_settings_convert_environment_strings() -> None:
    from agenttest_worker.settings import Settings

    settings = Settings.from_environment(
        {
            "AGENTTEST_VISIBILITY_TIMEOUT": "120",
            "agenttest_task_events": "yes",
            "AGENTTEST_STALL_SECONDS": "2.5",
            "AGENTTEST_HOME": "/tmp/somewhere",
            "AGENTTEST_SCRIPTS_DIR": "/not/a/setting",  # read elsewhere: ignored here
            "OTHER_QUEUE": "nope",
        }
    )
    assert settings.visibility_timeout == 120
    assert settings.task_events is True
    assert settings.stall_seconds == 2.5
    assert settings.home == Path("/tmp/somewhere")
    assert settings.queue == "agenttest"
    assert not settings.distributed


def test_input_errors_as_a_process_exit_2_without_traceback(processes: Processes) -> None:
    code, out, err = processes.result("input-error")
    assert code == 2
    assert "-n: unknown agent 'nope'" in err
    assert "Traceback" not in err
    assert out == ""


# -- run control ---------------------------------------------------------------------------


def recs_case(case_id: str, expected: str) -> dict[str, object]:
    """A single-turn case whose reply must contain `expected`."""
    check = {"type": "contains", "value": expected}
    return {"id": case_id, "input": "Hello", "assertions": [check]}


def test_fail_fast_reports_the_rest_as_skipped(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = write_cases(
        demo / "ff.jsonl",
        [
            {"id": "F1", "input": "Hello", "assertions": [{"type": "contains", "value": "Hello"}]},
            {"id": "F2", "input": "Hello", "assertions": [{"type": "contains", "value": "nope"}]},
            {"id": "F3", "input": "Hello", "assertions": [{"type": "contains", "value": "Hello"}]},
            {"id": "F4", "input": "Hello", "assertions": [{"type": "contains", "value": "Hello"}]},
        ],
    )
    argv = ["-i", str(cases), "-n", "assistants.expense", "--config", SUITE_CONFIG]
    code, out, _ = run(capsys, *argv, "--fail-fast", "--parallel", "1", "-o", "ff.out.jsonl")
    assert code == 1
    recs = records(demo / "ff.out.jsonl")
    assert [(r["id"], r["status"]) for r in recs] == [
        ("F1", "passed"),
        ("F2", "failed"),
        ("F3", "skipped"),
        ("F4", "skipped"),
    ]
    for rec in recs[2:]:
        assert "--fail-fast" in rec["skip_reason"] and "F2" in rec["skip_reason"]
        assert rec["total_turns"] == 0
    assert "Reason: not run: --fail-fast stopped the run after F2 failed" in case_block(out, "F3")
    assert "Skipped: 2\n" in out

    # A case that fails before its first turn keeps its own reason, cancelled or not.
    empty = write_cases(demo / "ff2.jsonl", [recs_case("F5", "nope"), {"id": "F6", "input": ""}])
    code, _, _ = run(
        capsys, "-i", str(empty), *argv[2:], "--fail-fast", "--parallel", "1", "-o", "ff2.jsonl"
    )
    f6 = records(demo / "ff2.jsonl")[1]
    assert (f6["status"], f6["error"], f6.get("skip_reason")) == (
        "failed",
        "no initial input: the first input is blank (empty or whitespace only)",
        None,
    )

    # Without --fail-fast the same cases all run.
    code, _, _ = run(capsys, *argv, "--parallel", "1", "-o", "all.jsonl")
    assert code == 1
    assert [r["status"] for r in records(demo / "all.jsonl")] == [
        "passed",
        "failed",
        "passed",
        "passed",
    ]


def test_timeout_fails_a_case_whose_agent_is_too_slow(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = slow_config(demo / "agenttest.yaml", delay_ms=3000)
    write_cases(demo / "t.jsonl", [{"id": "SLOW", "input": "Hello"}])
    started = time.monotonic()
    code, out, _ = run(
        capsys,
        "-i",
        "t.jsonl",
        "-n",
        "slow",
        "--config",
        str(config),
        "--timeout",
        "0.2s",
        "-o",
        "t.out.jsonl",
    )
    elapsed = time.monotonic() - started
    assert code == 1
    assert elapsed < 2.5, "the case stops at its timeout, not when the agent answers"
    [rec] = records(demo / "t.out.jsonl")
    assert rec["status"] == "failed"
    assert rec["turns"][0]["error"] == "timeout after 200ms (the case's time limit)"
    assert rec["error"] == "turn 1: timeout after 200ms (the case's time limit)"
    assert "Error: timeout after 200ms (the case's time limit)" in case_block(out, "SLOW")

    # The default timeout (5m) lets a slow agent finish.
    config = slow_config(demo / "agenttest.yaml", delay_ms=300)
    code, _, _ = run(capsys, "-i", "t.jsonl", "-n", "slow", "--config", str(config))
    assert code == 0


def test_deadline_stops_the_run_and_fails_what_is_unfinished(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = slow_config(demo / "agenttest.yaml", delay_ms=3000)
    write_cases(demo / "d.jsonl", [{"id": f"D{i}", "input": "Hello"} for i in range(3)])
    started = time.monotonic()
    code, out, _ = run(
        capsys,
        *("-i", "d.jsonl", "-n", "slow", "--config", str(config)),
        *("--deadline", "0.15s", "--parallel", "1", "-o", "d.out.jsonl"),
    )
    assert time.monotonic() - started < 2.5, "a turn in flight does not outlive the deadline"
    assert code == 1
    recs = records(demo / "d.out.jsonl")
    assert [(r["id"], r["status"]) for r in recs] == [
        ("D0", "failed"),
        ("D1", "failed"),
        ("D2", "failed"),
    ]
    assert {r["error"] for r in recs} == {"run deadline passed before this case finished"}
    assert "Failed:  3\n" in out


def test_parallel_runs_conversations_at_the_same_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--parallel 10: the ten conversations are at the agent together (each answer is held
    until all ten have asked, so a run playing fewer at once would time out); --parallel
    1: one after another (each asks after the previous answer, which takes 0.1 s)."""
    arrived: list[float] = []
    lock = threading.Lock()
    all_asked = threading.Event()

    def answer(body: dict[str, Any]) -> Reply:
        with lock:
            arrived.append(time.monotonic())
            if len(arrived) == 10:
                all_asked.set()
        return say("Hello there", delay=0.1, hold=all_asked)

    with ScriptedAgent() as agent:
        agent.script("target", answer)
        config = tmp_path / "agenttest.yaml"
        entry = agent.entry("target", timeout=60, max_retries=0)
        config.write_text(json.dumps({"agents": {"target": entry}}), encoding="utf-8")
        cases = [
            {
                "id": f"P{i:02d}",
                "input": "Hi",
                "assertions": [{"type": "contains", "value": "Hello"}],
            }
            for i in range(10)
        ]
        write_cases(tmp_path / "p.jsonl", cases)
        argv = ["-i", str(tmp_path / "p.jsonl"), "-n", "target", "--config", str(config)]

        def played(parallel: str) -> list[float]:
            arrived.clear()
            code, out, err = run(capsys, *argv, "--format", "table", "--parallel", parallel)
            assert code == 0, err
            assert "10 cases: 10 passed, 0 failed, 0 skipped" in out
            return list(arrived)

        assert len(played("10")) == 10
        all_asked.set()  # from here on no answer is held: the serial run's are 0.1 s apart
        serial = played("1")
    gaps = [later - earlier for earlier, later in itertools.pairwise(serial)]
    assert len(serial) == 10 and min(gaps) >= 0.1, gaps


# -- report formats ------------------------------------------------------------------------


def _check_format(fmt: str, text: str) -> None:
    if fmt == "json":
        doc = json.loads(text)
        assert doc["summary"] | {"duration_s": 0} == {
            "total": 4,
            "passed": 2,
            "failed": 1,
            "skipped": 1,
            "total_turns": 8,
            "avg_turns": 2.0,
            "duration_s": 0,
            # T002 ran out of input, T004's reply failed its assertion.
            "causes": {"agent": 1, "input": 1},
        }
        assert [r["id"] for r in doc["results"]] == ["T001", "T002", "T003", "T004"]
        for rec in doc["results"]:
            CaseResult.model_validate(rec)
    elif fmt == "jsonl":
        lines = text.splitlines()
        assert [CaseResult.model_validate_json(line).status for line in lines] == [
            "passed",
            "skipped",
            "passed",
            "failed",
        ]
    elif fmt == "table":
        rows = [line.split() for line in text.splitlines()]
        assert rows[0][:3] == ["ID", "STATUS", "TURNS"]
        assert [r[:3] for r in rows[1:5]] == [
            ["T001", "PASSED", "3"],
            ["T002", "SKIPPED", "1"],
            ["T003", "PASSED", "3"],
            ["T004", "FAILED", "1"],
        ]
        assert "4 cases: 2 passed, 1 failed, 1 skipped" in text
    elif fmt == "tsv":
        rows = list(csv.reader(io.StringIO(text), delimiter="\t"))
        assert rows[0][:3] == ["id", "name", "status"]
        assert [(r[0], r[2]) for r in rows[1:]] == [
            ("T001", "passed"),
            ("T002", "skipped"),
            ("T003", "passed"),
            ("T004", "failed"),
        ]
    elif fmt == "junit":
        root = ET.fromstring(text.encode("utf-8"))
        suite = root.find("testsuite")
        assert suite is not None and suite.get("skipped") == "1"
        assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("4", "1", "0")
        cases = root.findall(".//testcase")
        assert [c.get("name", "")[:6] for c in cases] == ["[T001]", "[T002]", "[T003]", "[T004]"]
        assert cases[3].find("failure") is not None and cases[1].find("skipped") is not None
        assert cases[0].find("failure") is None and cases[0].find("skipped") is None
    else:  # pragma: no cover
        raise AssertionError(fmt)


@pytest.mark.parametrize("fmt", ["json", "jsonl", "table", "tsv", "junit"])
def test_format_on_stdout_and_in_output_file(
    demo: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    code, out, _ = suite(capsys, "--format", fmt)
    assert code == 1
    assert "═══" not in out, "--format replaces the console report on stdout"
    _check_format(fmt, out)

    code, out, _ = suite(capsys, "--format", fmt, "-o", f"report.{fmt}")
    assert code == 1
    assert "  Summary\n" in out, "with -o, stdout keeps the console report"
    _check_format(fmt, (demo / f"report.{fmt}").read_text(encoding="utf-8"))


# -- selecting and producing cases ---------------------------------------------------------


def test_tag_and_id_select_cases(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_cases(
        demo / "tagged.jsonl",
        [
            {"id": "A", "input": "Hello", "tags": ["smoke"]},
            {"id": "B", "input": "Hello", "tags": ["slow"]},
            {"id": "C", "input": "Hello", "tags": ["smoke", "slow"]},
            {"id": "D", "input": "Hello"},
        ],
    )
    base = ["-i", "tagged.jsonl", "-n", "assistants.expense", "--config", SUITE_CONFIG]

    def ran(*extra: str) -> list[str]:
        code, _, err = run(capsys, *base, *extra, "-o", "sel.jsonl")
        assert code == 0, err
        return [r["id"] for r in records(demo / "sel.jsonl")]

    assert ran() == ["A", "B", "C", "D"]
    assert ran("--tag", "smoke") == ["A", "C"]
    assert ran("--tag", "smoke", "--tag", "slow") == ["A", "B", "C"]
    assert ran("--id", "D", "--id", "B") == ["B", "D"]
    assert ran("--tag", "slow", "--id", "C") == ["C"]
    recs = records(demo / "sel.jsonl")
    assert recs[0]["tags"] == ["smoke", "slow"]
    code, _, err = run(capsys, *base, "--id", "A", "--id", "NOPE", "--id", "Z", "-o", "s.jsonl")
    assert code == 0
    assert "warning: --id NOPE, Z: no such case in the input" in err


def test_direct_message_runs_as_one_case(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    message = ["-i", "I want to submit an expense", "-n", "assistants.expense"]
    code, out, _ = run(capsys, *message, "--config", SUITE_CONFIG, "-v", "-o", "msg.jsonl")
    assert code == 0
    [rec] = records(demo / "msg.jsonl")
    # A message is a single-turn case: over after its turn, though the agent asked.
    assert rec["status"] == "passed" and rec["total_turns"] == 1
    assert rec["turns"][0]["input"] == "I want to submit an expense"
    assert rec["turns"][0]["output"] == "What type of expense would you like to submit?"
    assert rec["turns"][0]["awaiting_input"] is True
    assert rec["agent"] == "assistants.expense"
    assert 'Turn 1: "I want to submit an expense" → PASSED' in out

    code, out, _ = run(
        capsys, *message, "--config", SUITE_CONFIG, "--on-missing-input", "skip", "-o", "msg.jsonl"
    )
    assert code == 0
    [rec] = records(demo / "msg.jsonl")
    assert rec["status"] == "skipped" and rec["total_turns"] == 1
    assert "Agent awaiting input, no next turn defined" in out


def test_generator_cases_are_run(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        capsys,
        "-i",
        "agents:workers.test.generator?count=3",
        "-n",
        "assistants.expense",
        "--config",
        SUITE_CONFIG,
        "-o",
        "gen.jsonl",
    )
    assert code == 0, err
    recs = records(demo / "gen.jsonl")
    assert len(recs) == 3
    assert len({r["id"] for r in recs}) == 3
    for rec in recs:
        assert rec["status"] == "passed"
        assert rec["total_turns"] >= 1
        ran = [t for t in rec["turns"] if t["input"] is not None]
        assert all(t["output"] is not None for t in ran)
        assert sum(len(t["assertions"]) for t in ran) >= 1, "generated cases carry assertions"


def test_dry_run_round_trip(
    demo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run(
        capsys,
        "-i",
        "agents:workers.test.generator?count=3",
        "-n",
        "assistants.expense",
        "--config",
        SUITE_CONFIG,
        "--dry-run",
        "-o",
        "generated.jsonl",
    )
    assert code == 0, err
    assert out == ""
    written = (demo / "generated.jsonl").read_text(encoding="utf-8")
    assert len(written.splitlines()) == 3
    code, out, _ = run(
        capsys,
        "-i",
        "generated.jsonl",
        "-n",
        "assistants.expense",
        "--config",
        SUITE_CONFIG,
        "--dry-run",
    )
    assert code == 0
    assert out == written
    # And the suite itself: normalized once, it stays the same.
    code, first, _ = suite(capsys, "--dry-run")
    (demo / "suite.jsonl").write_text(first, encoding="utf-8")
    code, second, _ = run(
        capsys,
        "-i",
        "suite.jsonl",
        "-n",
        "assistants.expense",
        "--config",
        SUITE_CONFIG,
        "--dry-run",
    )
    assert second == first and len(first.splitlines()) == 4

    # A dry run calls no target and stores no run: the agents may be unreachable.
    monkeypatch.setenv("AGENTTEST_DEMO_URL", "http://127.0.0.1:9/v1")
    code, out, _ = suite(capsys, "--dry-run")
    assert code == 0 and out == first
    assert not (demo / ".agenttest" / "agenttest.db").exists()


def test_simulator_flag_drives_a_case_without_one(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_cases(demo / "plain.jsonl", [{"id": "PLAIN", "input": "I want to submit an expense"}])
    base = ["-i", "plain.jsonl", "-n", "assistants.expense", "--config", SUITE_CONFIG]
    code, _, _ = run(capsys, *base, "-o", "plain.out")
    assert code == 0
    [alone] = records(demo / "plain.out")
    assert alone["total_turns"] == 1 and "simulator" not in alone

    code, out, _ = run(
        capsys, *base, "--simulator", "agents:workers.test.user-sim", "-v", "-o", "sim.out"
    )
    assert code == 0
    [rec] = records(demo / "sim.out")
    assert rec["simulator"] == "agents:workers.test.user-sim"
    sources = [t["input_source"] for t in rec["turns"]]
    assert sources[0] == "static" and sources[1:] and set(sources[1:]) == {"simulator"}
    assert rec["status"] == "passed"
    assert "► [PLAIN] (simulator: workers.test.user-sim)" in out
    assert "[Simulated]" in case_block(out, "PLAIN")

    # The suite's skipped case gets its missing input from the simulator instead.
    code, out, _ = suite(capsys, "--id", "T002", "--simulator", "agents:workers.test.user-sim")
    assert code == 0
    assert "Passed:  1\n" in out and "Skipped: 0\n" in out


# -- subcommands ---------------------------------------------------------------------------


def test_db_upgrade_creates_the_store(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sqlalchemy import create_engine, inspect

    code, out, _ = run(capsys, "db", "upgrade")
    assert code == 0
    db = demo / ".agenttest" / "agenttest.db"
    assert f"database sqlite:///{db} is at the current schema" in out
    tables = set(inspect(create_engine(f"sqlite:///{db}")).get_table_names())
    assert {"runs", "cases", "turns", "assertion_results", "agent_calls", "run_reports"} <= tables
    code, _, _ = run(capsys, "db", "upgrade")
    assert code == 0, "upgrading twice is harmless"


def test_status_and_report_of_stored_runs(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, first_out, _ = suite(capsys, "-o", "first.jsonl")
    assert code == 1
    first = RUN_ID.search(first_out).group(1)  # type: ignore[union-attr]
    code, second_out, _ = suite(capsys, "--id", "T001")
    second = RUN_ID.search(second_out).group(1)  # type: ignore[union-attr]
    assert code == 0 and second != first

    code, out, _ = run(capsys, "status", "last")
    assert code == 0
    assert out.splitlines()[0] == f"run       {second}", "last is the newest run"
    code, out, _ = run(capsys, "status", first)
    assert code == 0
    assert f"run       {first}" in out
    assert "status    done" in out
    assert "cases     4/4 finished: 2 passed, 1 failed, 1 skipped" in out
    assert "turns     8" in out

    code, out, err = run(capsys, "report", first, "--format", "jsonl", "-o", "again.jsonl")
    assert code == 1, "a report's exit code says whether a case failed"
    assert out == "" and "report written to again.jsonl" in err
    assert records(demo / "again.jsonl") == records(demo / "first.jsonl")

    code, out, _ = run(capsys, "report", "last", "--format", "jsonl", "-o", "last.jsonl")
    assert code == 0
    assert [r["id"] for r in records(demo / "last.jsonl")] == ["T001"]

    code, out, _ = run(capsys, "report", first)
    assert code == 1
    assert f"ℹ Run: {first}" in out
    for case_id in ("T001", "T002", "T003", "T004"):
        assert case_block(out, case_id) == case_block(first_out, case_id)
    assert summary_block(out)[:6] == summary_block(first_out)[:6]

    code, out, _ = run(capsys, "report", first, "-v")
    assert '✓ agent: The reply must mention "$3500"' in case_block(out, "T001")


# -- interactive ---------------------------------------------------------------------------


def test_interactive_without_a_terminal_falls_back_to_on_missing_input(
    demo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("PO-12345\n"))  # a pipe, not a person
    started = time.monotonic()
    code, _, _ = suite(capsys, "--id", "T002", "--interactive", "-o", "i.jsonl")
    assert time.monotonic() - started < 10, "nobody is waited for"
    assert code == 0
    [rec] = records(demo / "i.jsonl")
    assert rec["status"] == "skipped"
    assert rec["skip_reason"] == "Agent awaiting input, no next turn defined"
    assert "interactive" not in {t.get("input_source") for t in rec["turns"]}

    code, _, _ = suite(
        capsys, "--id", "T002", "--interactive", "--on-missing-input", "fail", "-o", "f.jsonl"
    )
    assert code == 1
    [rec] = records(demo / "f.jsonl")
    assert rec["status"] == "failed" and "on_missing_input: fail" in rec["error"]


def test_interactive_at_a_terminal_asks_the_person(demo_url: str, tmp_path: Path) -> None:
    """Under a pseudo-terminal, --interactive asks and the reply becomes the next turn."""
    env = submit_env(tmp_path / "home") | {"AGENTTEST_DEMO_URL": demo_url}
    argv = [
        str(BIN / "agenttest-submit"),
        *("-i", SUITE_CASES, "-n", "assistants.expense", "--config", SUITE_CONFIG),
        *("--id", "T002", "--interactive", "-o", str(tmp_path / "pty.jsonl")),
    ]
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child process
        os.chdir(tmp_path)
        os.execve(argv[0], argv, env)
    output, answered, deadline = b"", False, time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if not ready:
                continue
            try:
                data = os.read(fd, 4096)
            except OSError:
                break
            if not data:
                break
            output += data
            if not answered and b"Your reply" in output:
                os.write(fd, b"PO-12345\n")
                answered = True
    finally:
        # It closed the terminal as it exited: give it a second to be gone (still
        # running then, it hung: end it, fail below).
        code = reap(pid, fd, 1)
    text = output.decode("utf-8", "replace")
    assert answered, text
    assert "Agent: This requires manager approval. Please provide PO number." in text
    assert code == 0, text
    [rec] = records(tmp_path / "pty.jsonl")
    assert rec["status"] == "passed"
    assert [(t["input_source"], t["input"]) for t in rec["turns"]][1] == ("interactive", "PO-12345")
