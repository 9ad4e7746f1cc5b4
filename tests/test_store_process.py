"""An embedded run's store work in a process of its own (store/store_process.py), and
flushes handed over without waiting for them (BufferedStore.flush(wait=False))."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url
from test_run_store import (
    RUN_ID,
    SUITE_CASES,
    SUITE_CONFIG,
    case_rows,
    fresh_suite,
    turn_writes_failing,
)

from agenttest_submit.embedded import drive
from agenttest_submit.progress import Progress
from agenttest_submit.storing import aggregate_run
from agenttest_worker.driver.step import Advance, prepare
from agenttest_worker.fleet.aggregate import build_report
from agenttest_worker.report import render
from agenttest_worker.results import AgentCallRecord, CaseResult, TurnResult, Usage
from agenttest_worker.store import records_ahead, results, runs, steps
from agenttest_worker.store.store_process import InThisProcess, StoreProcess, StoreProcessError


@pytest.fixture
def store_process() -> Iterator[StoreProcess]:
    work = StoreProcess()
    try:
        yield work
    finally:
        work.close()


def _submit_in_a_process(home: Path, choice: str) -> tuple[int, str, bool]:
    """`agenttest-submit` on the demo suite in a fresh interpreter with
    AGENTTEST_STORE_PROCESS=choice: (exit code, stdout, whether that interpreter
    imported SQLAlchemy)."""
    script = (
        "import sys\n"
        "from agenttest_submit.cli import main\n"
        f"code = main(['-i', {SUITE_CASES!r}, '-n', 'assistants.expense',"
        f" '--config', {SUITE_CONFIG!r}])\n"
        "print('SQLALCHEMY', 'sqlalchemy' in sys.modules)\n"
        "sys.exit(code)\n"
    )
    env = {**os.environ, "AGENTTEST_HOME": str(home), "AGENTTEST_STORE_PROCESS": choice}
    env.pop("AGENTTEST_DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    imported = "SQLALCHEMY True" in done.stdout
    assert ("SQLALCHEMY False" in done.stdout) != imported, done.stderr
    return done.returncode, done.stdout, imported


def test_a_command_line_run_keeps_sqlalchemy_out_of_its_own_process(
    demo: Path, tmp_path: Path
) -> None:
    """In the store's process (`always`, and `auto` where a second CPU is free) the run
    is stored, its turns written and its reports built there: the submitter's
    interpreter never imports SQLAlchemy, and the run is stored exactly as when the
    store's work runs in the submitter (`never`)."""
    stored = {}
    for choice, in_submitter in (("always", False), ("never", True)):
        home = tmp_path / choice
        code, out, imported = _submit_in_a_process(home, choice)
        assert code == 1, out  # the demo suite fails one case on purpose
        assert imported == in_submitter
        assert "Total turns:" in out
        # Before this test opens it: whoever wrote it folded its write-ahead log back.
        assert "agenttest.db-wal" not in os.listdir(home)
        found = RUN_ID.search(out)
        assert found is not None, out
        db = f"sqlite:///{home / 'agenttest.db'}"
        run = runs.get_run(db, found.group(1))
        assert run is not None and run.status == "done"
        rows = case_rows(db, found.group(1))
        stored[choice] = (
            (run.total_cases, run.finished_cases, run.passed, run.failed, run.skipped),
            (run.total_turns, run.total_tokens),
            sorted((c, row.phase, row.status, row.next_turn) for c, row in rows.items()),
            sorted(results.count_turn_rows(db, found.group(1))),
        )
    assert stored["always"] == stored["never"]


def _refusable_step(run_id: str, turn: int, state: str) -> steps.Step:
    """Turn `turn` of T001 with a call reporting more tokens than SQLite's 64 bits hold."""
    huge = Usage(prompt_tokens=10**20, completion_tokens=1, total_tokens=10**20 + 1)
    call = AgentCallRecord(role="target", agent="a", latency_ms=1, usage=huge)
    played = TurnResult(turn=turn, input="hi", output="ok", calls=[call])
    return steps.Step(
        run_id=run_id, case_id="T001", expected_turn=turn, next_turn=turn + 1,
        phase="ready", state=steps.JsonText(state), new_turns=[played],
    )  # fmt: skip


def test_a_refusal_learned_a_flush_later_takes_back_the_steps_saved_since(
    demo: Path, store_process: StoreProcess
) -> None:
    """A flush handed over without waiting learns of a refused step only at the next
    flush, by which time its conversation may have played on: the refused step and
    every later one are taken back, none of them written, and the run's counters are
    as if they never ran."""
    db, run_id, store, _ = fresh_suite(lambda store_the_run: store_the_run(), store_process)
    store.flush()
    prepared = prepare(store, run_id, "T001", 1)
    assert not isinstance(prepared, Advance)
    state = prepared.state.model_dump_json()
    assert store.save_step(_refusable_step(run_id, 1, state)).saved
    store.flush(wait=False)  # handed over; its outcome is taken at the next flush
    later = TurnResult(turn=2, input="and then", output="ok")
    assert store.save_step(steps.Step(
        run_id=run_id, case_id="T001", expected_turn=2, next_turn=3, phase="ready",
        state=steps.JsonText(state), new_turns=[later],
    )).saved  # fmt: skip
    assert store.take_refused() == []

    store.flush()
    (refused,) = store.take_refused()
    assert (refused.case_id, refused.turn) == ("T001", 1)
    assert "too large" in refused.reason
    loaded = store.load_case(run_id, "T001")
    assert loaded is not None and loaded.next_turn == 1, "back to before the refused step"
    assert results.count_turn_rows(db, run_id) == [], "neither step was written"
    assert case_rows(db, run_id)["T001"].next_turn == 1
    run = runs.get_run(db, run_id)
    assert run is not None and (run.finished_cases, run.total_tokens) == (0, 0)


def test_an_error_in_the_store_process_comes_back_whole(store_process: StoreProcess) -> None:
    with pytest.raises(ValueError, match="invalid literal"):
        store_process.call(int, "not a number")
    assert store_process.call(int, "42") == 42, "the process serves on after an error"
    with pytest.raises(StoreProcessError, match="could not be sent"):
        store_process.call(threading.Lock)  # a result that cannot cross
    assert store_process.submit(int, "7").result() == 7


def test_the_store_process_ignores_ctrl_c(store_process: StoreProcess) -> None:
    """Ctrl-C reaches the whole process group; the run's cleanup, which the parent runs
    on it, still writes through the store's process."""
    assert store_process.call(int, "1") == 1
    os.kill(store_process.pid, signal.SIGINT)
    assert store_process.call(int, "2") == 2


def test_a_store_process_that_died_fails_the_flush_and_loses_nothing(
    demo: Path, store_process: StoreProcess
) -> None:
    db, run_id, store, _ = fresh_suite(lambda store_the_run: store_the_run(), store_process)
    store.flush()
    prepared = prepare(store, run_id, "T001", 1)
    assert not isinstance(prepared, Advance)
    played = TurnResult(turn=1, input="hi", output="ok")
    assert store.save_step(steps.Step(
        run_id=run_id, case_id="T001", expected_turn=1, next_turn=2, phase="ready",
        state=steps.JsonText(prepared.state.model_dump_json()), new_turns=[played],
    )).saved  # fmt: skip
    os.kill(store_process.pid, signal.SIGKILL)
    with pytest.raises(StoreProcessError, match="ended unexpectedly"):
        store.flush()
    assert results.count_turn_rows(db, run_id) == []

    store.work = InThisProcess()  # what the failed flush held is still to be written
    store.flush()
    assert results.count_turn_rows(db, run_id) == [("T001", 1, 1)]


def test_closing_reads_the_replies_nobody_took() -> None:
    """A run stopped before it read its last replies still closes its store process at
    once: the child is not left blocked writing them to a full pipe."""
    work = StoreProcess()
    for _ in range(8):
        work.submit(bytes, 256 * 1024)  # 2 MB of replies, far past a pipe's buffer
    work.close()
    assert work._proc.returncode == 0


def _store_processes_of_this_one() -> list[int]:
    """This process's children that are (or were: zombies too) store processes."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            command = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == os.getpid() and (b"store_process" in command or not command):
            found.append(int(name))
    return found


@pytest.mark.parametrize(
    "argv",
    [
        ["-n", "assistants.expense", "--config", SUITE_CONFIG],  # no input: exit 2
        ["-i", SUITE_CASES, "-n", "nobody", "--config", SUITE_CONFIG],  # unknown agent
        ["-i", SUITE_CASES, "-n", "assistants.expense", "--config", SUITE_CONFIG],  # a run
    ],
)
def test_the_command_line_leaves_no_store_process_behind(
    demo: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    """The store's process starts before the command line is parsed; whether the
    command turns out to be no run, a rejected one or a run, it is gone (ended, and
    waited for) when the command returns."""
    from agenttest_submit.cli import main

    monkeypatch.setenv("AGENTTEST_STORE_PROCESS", "always")
    code = main(argv)
    assert code in (1, 2)
    assert _store_processes_of_this_one() == []


def only_here() -> str:
    """A function of this test module, which the store's process cannot import."""
    return "here"


def test_a_call_the_store_process_cannot_import_fails_alone(store_process: StoreProcess) -> None:
    with pytest.raises(ModuleNotFoundError, match="test_store_process"):
        store_process.call(only_here)
    assert store_process.call(int, "5") == 5, "it serves on, its replies in order"


def test_auto_keeps_the_store_work_here_on_one_cpu() -> None:
    """On one CPU the child's work would be the conversations' loss: `auto` keeps it in
    the submitter there, and uses the child where a second CPU is free."""
    script = (
        "import os, sys\n"
        "from agenttest_worker.store.store_process import store_work\n"
        "cpus = sorted(os.sched_getaffinity(0))\n"
        "os.sched_setaffinity(0, cpus[:int(sys.argv[1])])\n"
        "work = store_work('auto')\n"
        "print(type(work).__name__)\n"
        "work.close()\n"
    )
    one = subprocess.run(
        [sys.executable, "-c", script, "1"], capture_output=True, text=True, timeout=60
    )
    assert one.stdout.strip() == "InThisProcess", one.stderr
    if len(os.sched_getaffinity(0)) >= 2:
        two = subprocess.run(
            [sys.executable, "-c", script, "2"], capture_output=True, text=True, timeout=60
        )
        assert two.stdout.strip() == "StoreProcess", two.stderr


def test_a_flush_handed_over_that_fails_is_written_by_a_later_one(
    demo: Path, store_process: StoreProcess
) -> None:
    """A write handed over without waiting that the database rolls back is reported by
    the next flush, and what it held is kept: a later flush writes it, before and with
    what was saved since."""
    db, run_id, store, _ = fresh_suite(lambda store_the_run: store_the_run(), store_process)
    store.flush()

    def save_turn_one(case_id: str) -> None:
        prepared = prepare(store, run_id, case_id, 1)
        assert not isinstance(prepared, Advance)
        played = TurnResult(turn=1, input="hi", output="ok")
        assert store.save_step(steps.Step(
            run_id=run_id, case_id=case_id, expected_turn=1, next_turn=2, phase="ready",
            state=steps.JsonText(prepared.state.model_dump_json()), new_turns=[played],
        )).saved  # fmt: skip

    with turn_writes_failing(db):
        save_turn_one("T001")
        store.flush(wait=False)  # handed over: it fails in the store's process meanwhile
        save_turn_one("T002")
        with pytest.raises(Exception, match="disk trouble"):
            store.flush()  # T001's outcome, taken first
        assert results.count_turn_rows(db, run_id) == []
    store.flush()
    assert sorted(results.count_turn_rows(db, run_id)) == [("T001", 1, 1), ("T002", 1, 1)]


# The command line's store process, as `store_work` makes it; argv[1]: a file the
# parent's exit handler writes to; argv[2]: "sqlalchemy" to import it first.
MADE = """
import atexit, os, signal, sys
from pathlib import Path

exits = Path(sys.argv[1])
atexit.register(lambda: exits.open("a").write(f"exit {os.getpid()}\\n"))
signal.signal(signal.SIGTERM, lambda signum, frame: None)  # the parent's own handler
if sys.argv[2] == "sqlalchemy":
    import sqlalchemy
from agenttest_worker.store.store_process import StoreProcessError, store_work

work = store_work("always")
child = work.call(os.getpid)
# A forked child runs this very command line; a started one, the store's module.
forked = Path(f"/proc/{child}/cmdline").read_bytes() == Path("/proc/self/cmdline").read_bytes()
print("PARENT", os.getpid(), "FORKED" if forked else "STARTED", flush=True)
work.call(print, "printed by the store's work")
work.close()

work = store_work("always")
work.call(int, "1")
work.interrupt()
try:
    work.call(int, "2")
except StoreProcessError as exc:
    print("INTERRUPTED", exc, flush=True)
work.close()
"""


@pytest.mark.parametrize(("first", "made"), [("nothing", "FORKED"), ("sqlalchemy", "STARTED")])
def test_the_store_process_is_forked_where_nothing_of_the_store_exists_yet(
    tmp_path: Path, first: str, made: str
) -> None:
    """Forked where SQLAlchemy is not imported yet (the command line's case: the child
    begins with what the parent imported), started afresh where it is (a forked child
    would share its engines' connections). Either way it is the parent's only in what it
    was given: the parent's exit handlers run once, in the parent; SIGTERM ends it
    whatever handler the parent had; what its work prints goes to stderr, never into
    the parent's stdout (the report)."""
    exits = tmp_path / "exits"
    done = subprocess.run(
        [sys.executable, "-c", MADE, str(exits), first],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    parent = done.stdout.split()[1]
    assert f"PARENT {parent} {made}" in done.stdout
    assert "printed by the store's work" in done.stderr
    assert "printed by the store's work" not in done.stdout
    assert exits.read_text() == f"exit {parent}\n"
    assert "INTERRUPTED the store's process ended unexpectedly" in done.stdout


def _played(store_work: StoreProcess | None) -> tuple[str, str]:
    """The suite played to its end through a BufferedStore whose flushes `store_work`
    writes (default: this process): (url, run id)."""
    db, run_id, store, records = fresh_suite(lambda store_the_run: store_the_run(), store_work)
    conversations = [(case_id, 1) for case_id, _, _ in records]
    asyncio.run(drive(db, run_id, conversations, 4, Progress(len(records)), store=store))
    return db, run_id


def test_the_store_process_parses_each_ended_record_once_its_flush_is_answered(
    demo: Path, store_process: StoreProcess
) -> None:
    """While the conversations go on, the store's process parses the records its flushes
    wrote, for the run's aggregation: every record stored is there, by its text, as
    parsing it gives it; taken once."""
    db, run_id = _played(store_process)
    ahead = store_process.call(records_ahead.take, run_id)
    stored = list(results.iter_result_texts(db, run_id))
    assert len(stored) == 4 and sorted(ahead) == sorted(stored)
    assert all(ahead[text] == CaseResult.model_validate_json(text) for text in stored)
    assert store_process.call(records_ahead.take, run_id) == {}


def test_records_parsed_ahead_give_the_reports_a_fresh_reading_gives(
    demo: Path, store_process: StoreProcess
) -> None:
    """The aggregation in the store's process, with the records it parsed ahead, renders
    and stores the reports this process renders from the stored records alone; and the
    report sent back carries the records' texts, not what was parsed ahead."""
    db, run_id = _played(store_process)
    built = store_process.call(aggregate_run, db, run_id)
    assert built is not None and built.results._ahead == {} and not built.results._recent
    fresh = build_report(db, run_id)
    assert fresh.results._ahead == {}, "nothing parsed ahead in this process"
    # (Timed from the run's end as the store now has it, a few ms after the aggregation's.)
    fresh.duration_s = built.duration_s
    for fmt in ("console", "jsonl"):
        assert built.rendered[fmt] == render(fmt, fresh) == results.get_report(db, run_id, fmt)


def test_the_store_work_in_this_process_parses_nothing_ahead(demo: Path) -> None:
    """Where the store's work runs beside the conversations (one CPU, AGENTTEST_STORE_PROCESS
    =never), parsing ahead would be their loss: nothing is."""
    _, run_id = _played(None)
    assert records_ahead.take(run_id) == {}


def test_the_store_process_folds_the_write_ahead_log_once_a_flush_is_answered(
    demo: Path, store_process: StoreProcess, tmp_path: Path
) -> None:
    """After each flush the store's process folds SQLite's write-ahead log into the
    database file (not left for the run's end): the file alone, without its log, holds
    every conversation the flushes ended."""
    db, run_id = _played(store_process)
    store_process.call(int, "0")  # answered once the flush's after-reply work is done
    path = make_url(db).database
    assert path
    alone = tmp_path / "alone.db"
    shutil.copyfile(path, alone)
    with contextlib.closing(sqlite3.connect(alone)) as conn:
        (ended,) = conn.execute(
            "SELECT count(*) FROM cases WHERE run_id = ? AND result IS NOT NULL", (run_id,)
        ).fetchone()
    assert ended == 4


def test_told_no_call_follows_the_store_process_leaves_once_it_answered() -> None:
    """`no_more_calls`: the store's process answers what it was given and leaves
    (closing the database) while the caller goes on; nothing more can be sent, and
    `close` still waits for it."""
    work = StoreProcess()
    try:
        reply = work.submit(int, "7")
        work.no_more_calls()
        assert reply.result() == 7
        assert work._proc.wait(timeout=60) == 0, "gone before close()"
        with pytest.raises(StoreProcessError, match="closed"):
            work.submit(int, "8")
    finally:
        work.close()
