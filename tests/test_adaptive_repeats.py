"""Adaptive repeats (`--repeat auto`, `--max-repeat K`), embedded: each case is played
until the Wilson interval of its pass rate lies on one side of its pass rule's
threshold, or K repetitions.

The target is the demo's "coin" model over real HTTP: it answers "heads" with the
probability the case's message names (`p=1`, `p=0`, `p=0.5`), so the test knows what
each case's pass rate is; each case asserts `equals: heads`. What the records say is
checked against the stopping rule itself (report/repeat_stopping.py), and the store's
rows against the records. The same promises on a fleet of two workers:
tests/test_adaptive_repeats_fleet.py.
"""

from __future__ import annotations

import functools
import json
import threading
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from agenttest_submit.cli.main import main
from agenttest_submit.commands.viewer.queries import run_facts
from agenttest_worker.report.repeat_stopping import (
    START_WIDTH,
    decided,
    first_decided_at,
    next_repetition,
    stop_reason,
    wilson_interval,
)
from agenttest_worker.results import CaseResult
from agenttest_worker.settings import get_settings
from agenttest_worker.store import SqlStore, steps
from agenttest_worker.store.sql import runs
from agenttest_worker.store.sql.db import session_scope, upgrade
from agenttest_worker.store.sql.models import CaseRow, RunRow

# -- the rule ---------------------------------------------------------------------------


def test_the_interval_decides_a_majority_after_four_unanimous_repetitions() -> None:
    # 3 of 3: the interval's low end is 3/(3+z²) = 0.44, not above one half; 4 of 4: 0.51.
    assert decided("majority", 3, 3) is None
    assert decided("majority", 4, 4) == "passed"
    assert decided("majority", 0, 4) == "failed"
    assert first_decided_at("majority", every=True) == 4
    assert first_decided_at("majority", every=False) == 4
    # A share of 0.8 needs the low end at 0.8: 16 passes of 16.
    assert first_decided_at("0.8", every=True) == 16
    assert wilson_interval(16, 16)[0] >= 0.8 > wilson_interval(15, 15)[0]
    # Evenly split, it never settles: 10 of 20 is undecided.
    assert decided("majority", 10, 20) is None


def test_all_and_any_stop_only_when_the_verdict_is_certain() -> None:
    assert decided("all", 5, 6) == "failed"
    assert decided("all", 50, 50) is None  # all passing: to the bound
    assert decided("any", 1, 7) == "passed"
    assert decided("any", 0, 50) is None
    assert first_decided_at("all", every=True) is None
    assert first_decided_at("any", every=False) is None


def test_the_next_repetition_is_never_past_the_bound_nor_after_a_skip() -> None:
    assert next_repetition("majority", 10, ["passed"], 3) == 4
    assert next_repetition("majority", 10, ["passed"] * 4, 6) is None  # decided
    # 5 of 10 ended, 10 exist: at the bound.
    assert next_repetition("majority", 10, ["passed", "failed"] * 5, 10) is None
    # A skipped repetition: the run is stopping.
    assert next_repetition("majority", 10, ["passed", "skipped"], 3) is None
    # Undecided with others playing: each repetition that ends starts one more.
    assert next_repetition("majority", 10, ["passed"] * 3, 4) == 5
    assert next_repetition("all", 10, ["passed"] * 2, 3) == 4
    assert next_repetition("any", 10, ["failed"] * 2, 3) == 4
    assert next_repetition("any", 10, ["failed", "passed"], 3) is None
    assert stop_reason("majority", 10, ["passed"] * 4) == "decided"
    assert stop_reason("majority", 10, ["passed", "failed"] * 5) == "max_repeat"
    assert stop_reason("majority", 10, ["passed", "skipped"]) == "stopped"


# -- runs -------------------------------------------------------------------------------


def _coin_case(case_id: str, chance: str) -> dict[str, Any]:
    return {
        "id": case_id,
        "input": f"p={chance} throw the coin",
        "assertions": [{"type": "equals", "value": "heads"}],
    }


def _project(tmp_path: Path, demo_url: str, cases: list[dict[str, Any]]) -> list[str]:
    config = tmp_path / "agenttest.yaml"
    entry = {"protocol": "openai", "base_url": demo_url, "model": "coin", "timeout": 10}
    config.write_text(json.dumps({"agents": {"coin": entry}}), encoding="utf-8")
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    return ["-i", str(path), "-n", "coin", "--config", str(config)]


def _records(path: Path) -> dict[str, list[dict[str, Any]]]:
    by_case: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        by_case[record["id"]].append(record)
    return dict(by_case)


def check_case(
    records: list[dict[str, Any]], rule: str, bound: int, status: str | None = None
) -> tuple[int, str]:
    """What every adaptive case's records must say, whatever its coin did: repetitions
    1..n, each once, in order; n and the stop reason as the rule says for its statuses.
    Returns (n, stop reason)."""
    played = len(records)
    assert [r["repeat"] for r in records] == list(range(1, played + 1))
    assert {r["repeats"] for r in records} == {played}
    assert {r["max_repeat"] for r in records} == {bound}
    statuses = [r["status"] for r in records]
    reason = stop_reason(rule, bound, statuses)
    assert {r["stop_reason"] for r in records} == {reason}
    assert played <= bound
    if reason == "decided":
        # It stopped no later than the first moment it was decided allows: once the
        # repetitions started before that moment had ended.
        first = next(n for n in range(1, played + 1) if _decided_by(rule, statuses[:n]))
        assert played <= first + START_WIDTH - 1
    else:
        assert reason == "max_repeat" and played == bound
    if status is not None:
        assert set(statuses) == {status}
    return played, reason


def _decided_by(rule: str, statuses: list[str]) -> bool:
    return decided(rule, statuses.count("passed"), len(statuses)) is not None


def _stored(run_id: str) -> tuple[RunRow, dict[str, list[str]]]:
    return _stored_in(get_settings().effective_database_url(), run_id)


def test_unanimous_cases_stop_early_and_a_fair_coin_runs_on(
    demo_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [_coin_case("always", "1"), _coin_case("never", "0"), _coin_case("fair", "0.5")]
    out = tmp_path / "out.jsonl"
    args = [*_project(tmp_path, demo_url, cases), "--repeat", "auto", "--pass-rule", "majority"]
    code = main([*args, "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1  # "never" fails
    records = _records(out)
    # A case that passes (or fails) every time is decided after 4 repetitions: it
    # stops with at most the START_WIDTH - 1 more that were playing then.
    always, why = check_case(records["always"], "majority", 10, "passed")
    assert why == "decided" and 4 <= always <= 4 + START_WIDTH - 1 < 10
    never, why = check_case(records["never"], "majority", 10, "failed")
    assert why == "decided" and 4 <= never <= 4 + START_WIDTH - 1
    check_case(records["fair"], "majority", 10)
    # Each repetition called the coin once: the calls are the repetitions played.
    played = sum(len(r) for r in records.values())
    calls = sum(r["usage_by_role"]["target"]["calls"] for rs in records.values() for r in rs)
    assert calls == played < 30
    # The progress counts what was played, never a fixed K per case.
    assert f"{played}/{played} conversations" in err
    # The store holds exactly the repetitions played, each once, and the run is whole.
    run_id = err.rsplit("(run ", 1)[1].split(")", 1)[0]
    run, keys = _stored(run_id)
    for case_id, found in records.items():
        assert sorted(keys[case_id]) == sorted(f"{case_id}#{r['repeat']}" for r in found)
    assert run.finished_cases == run.total_cases and run.status == "done"
    assert run.passed + run.failed + run.skipped == played


def test_the_reports_say_how_many_repetitions_each_case_needed_and_why(
    demo_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [_coin_case("always", "1"), _coin_case("never", "0")]
    args = [*_project(tmp_path, demo_url, cases), "--repeat", "auto", "--pass-rule", "majority"]
    assert main([*args, "--max-repeat", "8", "--format", "json"]) == 1
    document = json.loads(capsys.readouterr().out)
    verdicts = {c["id"]: c for c in document["cases"]}
    for case_id, status in (("always", "passed"), ("never", "failed")):
        found = verdicts[case_id]
        assert found["status"] == status and found["stop_reason"] == "decided"
        assert found["max_repeat"] == 8 and 4 <= found["repeats"] <= 4 + START_WIDTH - 1
    repetitions = document["summary"]["repeats"]["repetitions"]
    assert repetitions == sum(c["repeats"] for c in document["cases"])
    # The console says it in words, with the repetitions counted as played.
    out = tmp_path / "out.jsonl"
    main([*args, "--max-repeat", "8", "-o", str(out)])
    shown = capsys.readouterr().out
    needed = len(_records(out)["always"])
    assert f"({needed}/{needed} repetitions passed)" in shown
    assert f"decided after {needed} of at most 8 repetitions" in shown
    # The header counts the conversations played, not a fixed number per case.
    played = sum(len(r) for r in _records(out).values())
    assert f"(2 test cases, {played} conversations, --repeat auto)" in shown


def test_pass_all_stops_at_the_first_failure_and_plays_a_passing_case_to_the_bound(
    demo_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [_coin_case("always", "1"), _coin_case("never", "0")]
    out = tmp_path / "out.jsonl"
    args = [*_project(tmp_path, demo_url, cases), "--repeat", "auto", "--max-repeat", "5"]
    assert main([*args, "-o", str(out)]) == 1
    records = _records(out)
    # Under `all` no interval says every repetition to come would pass: to the bound.
    assert check_case(records["always"], "all", 5, "passed") == (5, "max_repeat")
    # Its first failure decides: the repetitions started at once, and none after.
    assert check_case(records["never"], "all", 5, "failed") == (START_WIDTH, "decided")


def test_dry_run_says_the_most_it_may_play(
    demo_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [_coin_case("a", "1"), _coin_case("b", "0")]
    args = [*_project(tmp_path, demo_url, cases), "--repeat", "auto", "--max-repeat", "7"]
    assert main([*args, "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "at most 7 times, at most 14 conversation(s)" in err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--repeat", "sometimes"], "--repeat"),
        (["--repeat", "auto", "--max-repeat", "1"], "must be from 2 to 1000"),
        (["--repeat", "auto", "--max-repeat", "1001"], "must be from 2 to 1000"),
        (["--repeat", "auto", "--max-repeat", "ten"], "--max-repeat"),
        (["--repeat", "3", "--max-repeat", "5"], "--max-repeat bounds --repeat auto"),
        (["--max-repeat", "5"], "--max-repeat bounds --repeat auto"),
        (["--repeat", "auto", "--reeval", "last"], "--reeval plays none"),
    ],
)
def test_bad_repeat_flags_exit_2_before_anything_runs(
    flags: list[str],
    said: str,
    demo_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = _project(tmp_path, demo_url, [_coin_case("a", "1")])
    assert main([*args, *flags]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
    assert not (tmp_path / ".agenttest").exists() or not list((tmp_path / ".agenttest").iterdir())


def test_a_stopped_run_starts_no_more_repetitions_and_says_why(
    demo_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [_coin_case("never", "0")]
    out = tmp_path / "out.jsonl"
    args = [*_project(tmp_path, demo_url, cases), "--repeat", "auto", "--pass-rule", "majority"]
    assert main([*args, "--fail-fast", "--parallel", "1", "-o", str(out)]) == 1
    records = _records(out)["never"]
    # The first failure stopped the run: the repetitions started with it end skipped,
    # and none is started after them.
    assert len(records) == START_WIDTH
    assert [r["status"] for r in records] == ["failed"] + ["skipped"] * (START_WIDTH - 1)
    assert {r["stop_reason"] for r in records} == {"stopped"}
    run_id = capsys.readouterr().err.rsplit("(run ", 1)[1].split(")", 1)[0]
    # `status RUN` counts the repetitions played, with none left playing.
    assert main(["status", run_id]) == 0
    said = capsys.readouterr().out
    assert f"1 case, --repeat auto: {START_WIDTH} conversations finished, 0 playing" in said
    # `runs` counts them the same way, never as a fixed number per case.
    assert main(["runs"]) == 0
    assert f"1 ({START_WIDTH} conversations)" in capsys.readouterr().out
    # And the viewer.
    run, _ = _stored(run_id)
    facts = run_facts(run)
    assert facts["cases"] == f"1 ({START_WIDTH} conversations)"
    assert (facts["finished_cases"], facts["total_cases"]) == (START_WIDTH, START_WIDTH)


# -- the store: repetitions ending at once ----------------------------------------------


def _ended(run_id: str, key: str, status: str, plan: steps.RepeatPlan) -> steps.Step:
    """The step that ends repetition `key` with `status` (no turns: only its end)."""
    case_id, number = key.split("#")
    record = CaseResult(id=case_id, status=status, repeat=int(number), repeats=10, max_repeat=10)
    return steps.Step(
        run_id=run_id,
        case_id=key,
        expected_turn=1,
        next_turn=1,
        phase="done",
        new_turns=[],
        result=record,
        repeat_plan=plan,
        state={},
    )


def test_repetitions_ending_at_once_on_postgres_add_each_next_one_once(pg_database: str) -> None:
    """Six repetitions of one case end at the same moment, each from a thread of its own
    (as on six workers): every one reads the case's repetitions and may add the next. The
    run row's lock orders them: the repetitions added are numbered on from the stored
    ones, none twice, and each took its ender's place in the run's finished count."""
    upgrade(pg_database)
    run_id = f"adaptive-{uuid.uuid4().hex[:8]}"
    options = {"repeat": 10, "repeat_auto": True, "pass_rule": "majority"}
    runs.create_run(
        pg_database, run_id=run_id, agent="coin", input_label="t", options=options, config={}
    )
    record = {**_coin_case("T", "0.5"), "repeat": 10, "max_repeat": 10}
    keys = tuple(f"T#{n}" for n in range(1, 11))
    first = [runs.NewCase(0, keys[n], {**record, "repetition": n + 1}, None) for n in range(6)]
    runs.add_cases(pg_database, run_id, first)
    runs.start_run(pg_database, run_id, len(first))
    rule = functools.partial(next_repetition, "majority", 10)
    plan = steps.RepeatPlan(test_id="T", keys=keys, next_repetition=rule)
    store = SqlStore(pg_database)
    # Three pass and three fail: 3 of 6, undecided, whatever order they are read in.
    ending = [(keys[n], "passed" if n % 2 else "failed") for n in range(6)]
    barrier = threading.Barrier(len(ending))

    def end(key: str, status: str) -> steps.Saved:
        barrier.wait()
        return store.save_step(_ended(run_id, key, status, plan))

    with ThreadPoolExecutor(len(ending)) as pool:
        saved = list(pool.map(lambda pair: end(*pair), ending))
    assert all(s.saved for s in saved)
    added = sorted((s.added for s in saved if s.added is not None), key=keys.index)
    # Each ender was undecided when it read (at most 5 of its 6 peers had ended), so each
    # added one: 7 to 10, then the bound; none twice.
    assert added == list(keys[6:10])
    run, stored = _stored_in(pg_database, run_id)
    assert sorted(stored["T"], key=keys.index) == list(keys)
    # The four that added one handed it their place; the other two finished.
    assert (run.finished_cases, run.total_cases) == (2, 6)
    assert run.passed + run.failed == 6


def _stored_in(url: str, run_id: str) -> tuple[RunRow, dict[str, list[str]]]:
    with session_scope(url) as session:
        run = session.execute(select(RunRow).where(RunRow.id == run_id)).scalar_one()
        session.expunge(run)
        rows = session.execute(
            select(CaseRow.test_id, CaseRow.case_id).where(CaseRow.run_id == run_id)
        ).all()
    keys: dict[str, list[str]] = defaultdict(list)
    for test_id, case_id in rows:
        keys[test_id].append(case_id)
    return run, dict(keys)
