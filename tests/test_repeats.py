"""Repeats: each case played K times as independent conversations, one verdict per case.

The agent under test is non-deterministic on purpose: a generic JSON (`http`) agent,
served over HTTP, whose answer depends on a hash of the session id it is sent. Each
repetition has its own session id, so a case played 20 times passes in some
repetitions and fails in others, and the test reads, from what the agent said to
each session, what every record, verdict and statistic must be. Every run is made
embedded and on a one-worker fleet (marked `fleet`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import xmlschema
from aiohttp import web
from fleet import WORKER_ENV, WORKER_HEADER, Fleet, fleet_on
from places import PLACES, Place

from agenttest_submit.cli.main import main
from agenttest_worker.demo.threaded import ServedOnThread, ThreadedServer
from agenttest_worker.report.verdicts import (
    pass_at_k,
    pass_hat_k,
    pass_rule_problem,
    verdict,
    wilson_interval,
)
from agenttest_worker.results import CaseStatus

XSD = Path(__file__).parent / "fixtures" / "junit-10.xsd"


def says_yes(session_id: str) -> bool:
    """What the coin agent answers a session: a hash of its id, so each repetition of a
    case (its own session) may answer differently, and the test can tell which."""
    return hashlib.sha256(session_id.encode()).digest()[0] % 2 == 0


class CoinAgent(ServedOnThread):
    """An `http` agent answering "yes" or "no" by a hash of the body's session_id,
    after `delay` seconds; it notes every session and when each request arrived."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.sessions: list[str] = []
        self.times: list[float] = []
        self.workers: list[str] = []
        self._lock = threading.Lock()
        self._server = ThreadedServer(self._app, name="coin-agent", shutdown_timeout=0.2)

    async def _reply(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        session = str(body["session_id"])
        with self._lock:
            self.sessions.append(session)
            self.times.append(time.monotonic())
            self.workers.append(request.headers.get(WORKER_HEADER, "none"))
        if self.delay:
            await asyncio.sleep(self.delay)
        answer = "yes" if says_yes(session) else "no"
        return web.json_response(
            {
                "content": answer,
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
            }
        )

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/agent", self._reply)
        return app

    def most_at_once(self) -> int:
        return max(
            (sum(1 for s in self.times if s <= t < s + self.delay) for t in self.times),
            default=0,
        )


@pytest.fixture
def coin() -> Iterator[CoinAgent]:
    with CoinAgent() as agent:
        yield agent


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


@pytest.fixture(params=PLACES)
def place(request: pytest.FixtureRequest) -> Place:
    return Place(request.param, request, worker="repeats", threads=4)


def _project(tmp_path: Path, agent: CoinAgent) -> Path:
    # On a fleet, each worker names itself in a header (from its own environment).
    entry = {
        "protocol": "http",
        "url": agent.base_url + "/agent",
        "timeout": 10,
        "headers": {WORKER_HEADER: f"${{{WORKER_ENV}:-none}}"},
    }
    path = tmp_path / "agenttest.yaml"
    path.write_text(json.dumps({"agents": {"coin": entry}}), encoding="utf-8")
    return path


def _case(case_id: str, **more: Any) -> dict[str, Any]:
    return {
        "id": case_id,
        "input": "Heads or tails?",
        "assertions": [{"type": "equals", "value": "yes"}],
        **more,
    }


def _cases(tmp_path: Path, cases: list[dict[str, Any]], name: str = "cases.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    return path


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _run(cases: Path, config: Path, *more: str) -> list[str]:
    return ["-i", str(cases), "-n", "coin", "--config", str(config), *more]


# -- the statistics ------------------------------------------------------------------


def test_pass_at_k_and_pass_hat_k_are_the_unbiased_estimators() -> None:
    # n=5, c=2, k=2: pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10; pass^2 = C(2,2)/C(5,2) = 1/10.
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_hat_k(5, 2, 2) == pytest.approx(0.1)
    # k = n: pass@k is "any passed", pass^k "all passed".
    assert pass_at_k(4, 1, 4) == 1.0 and pass_at_k(4, 0, 4) == 0.0
    assert pass_hat_k(4, 4, 4) == 1.0 and pass_hat_k(4, 3, 4) == 0.0
    # k = 1: both are the pass rate.
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8) == pass_hat_k(8, 3, 1)


def test_wilson_interval_matches_its_formula() -> None:
    low, high = wilson_interval(6, 9)
    assert (round(low, 3), round(high, 3)) == (0.354, 0.879)
    assert wilson_interval(0, 10)[0] == 0.0
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0)
    z = 1.959963984540054
    p, n = 0.5, 20
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert wilson_interval(10, 20) == pytest.approx((centre - half, centre + half))


def test_pass_rules() -> None:
    five: list[CaseStatus] = ["passed", "passed", "passed", "passed", "failed"]
    assert verdict(five, "all") == "failed"
    assert verdict(five, "any") == "passed"
    assert verdict(five, "majority") == "passed"
    assert verdict(five, "0.8") == "passed"
    assert verdict(five, "0.9") == "failed"
    half: list[CaseStatus] = ["passed", "failed"]
    assert verdict(half, "majority") == "failed"
    # Skipped repetitions are not passes; all skipped is skipped.
    assert verdict(["passed", "skipped"], "all") == "failed"
    assert verdict(["skipped", "skipped"], "any") == "skipped"
    assert pass_rule_problem("0.8") is None and pass_rule_problem("majority") is None
    assert pass_rule_problem("1.5") and pass_rule_problem("most") and pass_rule_problem("0")


# -- runs ----------------------------------------------------------------------------


def test_each_repetition_is_its_own_conversation_and_the_case_has_one_verdict(
    place: Place, coin: CoinAgent, tmp_path: Path
) -> None:
    config = _project(tmp_path, coin)
    cases = _cases(tmp_path, [_case("coin-1"), _case("coin-2")])
    out = tmp_path / "out.jsonl"
    code, stdout, err = place.submit(_run(cases, config, "--repeat", "20", "-o", str(out)))
    records = _records(out)
    assert len(records) == 40
    assert "40/40 conversations" in err  # the progress counts each repetition
    # Own session per repetition: 40 sessions, none shared.
    assert len(coin.sessions) == 40 and len(set(coin.sessions)) == 40
    for case_id in ("coin-1", "coin-2"):
        mine = [r for r in records if r["id"] == case_id]
        assert sorted(r["repeat"] for r in mine) == list(range(1, 21))
        assert {r["repeats"] for r in mine} == {20}
        assert all(r["turns"][0]["output"] in ("yes", "no") for r in mine)
        for r in mine:
            assert r["status"] == ("passed" if r["turns"][0]["output"] == "yes" else "failed")
    yes = sum(says_yes(s) for s in coin.sessions)
    assert 0 < yes < 40  # a hash of 40 random sessions: both answers (2**-39 otherwise)
    # Under pass^k (all), a case with a "no" fails: the exit code says so.
    verdicts = {
        c: all(r["status"] == "passed" for r in records if r["id"] == c)
        for c in ("coin-1", "coin-2")
    }
    assert code == (0 if all(verdicts.values()) else 1)
    # The console shows each case once, with how many repetitions passed.
    assert stdout.count("► [coin-1]") == 1 and stdout.count("► [coin-2]") == 1
    passed_1 = sum(r["status"] == "passed" for r in records if r["id"] == "coin-1")
    assert f"► [coin-1] ({passed_1}/20 repetitions passed)" in stdout
    assert "Total:   2 tests" in stdout
    assert "Repetitions: 40" in stdout
    low, high = wilson_interval(yes, 40)
    assert f"Pass rate: {yes / 40:.1%} (95% CI {low:.1%}–{high:.1%})" in stdout
    # Each repetition that did not pass is shown with its turns; those that passed not.
    failed_1 = [r["repeat"] for r in records if r["id"] == "coin-1" and r["status"] == "failed"]
    for number in range(1, 21):
        shown = f"Repetition {number}/20: FAILED" in stdout.split("► [coin-2]")[0]
        assert shown == (number in failed_1)


def test_pass_rules_decide_the_exit_code(place: Place, coin: CoinAgent, tmp_path: Path) -> None:
    config = _project(tmp_path, coin)
    cases = _cases(tmp_path, [_case("coin")])
    out = tmp_path / "out.jsonl"
    code_all, _, _ = place.submit(_run(cases, config, "--repeat", "12", "-o", str(out)))
    records = _records(out)
    passed = sum(r["status"] == "passed" for r in records)
    assert code_all == (0 if passed == 12 else 1)
    for rule in ("any", "majority", "0.25"):
        code, _, _ = place.submit(
            _run(cases, config, "--repeat", "12", "--pass-rule", rule, "-o", str(out))
        )
        again = sum(r["status"] == "passed" for r in _records(out))
        wanted = {"any": again >= 1, "majority": again * 2 > 12, "0.25": again >= 3}[rule]
        assert code == (0 if wanted else 1), (rule, again)


def test_case_field_repeat_and_the_flag_overrides_it(
    place: Place, coin: CoinAgent, tmp_path: Path
) -> None:
    config = _project(tmp_path, coin)
    jsonl = _cases(tmp_path, [_case("thrice", repeat=3), _case("once")])
    yaml_file = tmp_path / "cases.yaml"
    yaml_file.write_text(
        "tests:\n  - name: twice\n    user_input: Heads or tails?\n    repeat: 2\n"
        "    assertions:\n      - type: equals\n        value: 'yes'\n",
        encoding="utf-8",
    )
    out = tmp_path / "out.jsonl"
    place.submit(["-i", str(jsonl), "-i", str(yaml_file), *_run(jsonl, config, "-o", str(out))[2:]])
    records = _records(out)
    by_id: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_id.setdefault(r["id"], []).append(r)
    assert len(by_id["thrice"]) == 3 and len(by_id["twice"]) == 2 and len(by_id["once"]) == 1
    assert "repeat" not in by_id["once"][0] and "repeats" not in by_id["once"][0]
    assert [r["repeat"] for r in by_id["twice"]] == [1, 2]
    place.submit([*_run(jsonl, config, "--repeat", "2", "-o", str(out))])
    records = _records(out)
    assert [(r["id"], r["repeat"], r["repeats"]) for r in records] == [
        ("thrice", 1, 2),
        ("thrice", 2, 2),
        ("once", 1, 2),
        ("once", 2, 2),
    ]


def test_every_format_summarises_a_repeated_case_once(
    place: Place, coin: CoinAgent, tmp_path: Path
) -> None:
    config = _project(tmp_path, coin)
    cases = _cases(tmp_path, [_case("coin-a"), _case("coin-b")])
    out = tmp_path / "out.json"
    place.submit(
        _run(cases, config, "--repeat", "10", "--pass-k", "3", "--format", "json", "-o", str(out))
    )
    document = json.loads(out.read_text(encoding="utf-8"))
    records = document["results"]
    assert len(records) == 20
    stats = document["summary"]["repeats"]
    passed = {
        c: sum(r["status"] == "passed" for r in records if r["id"] == c)
        for c in ("coin-a", "coin-b")
    }
    assert stats["repetitions"] == 20 and stats["passed"] == sum(passed.values())
    assert stats["k"] == 3
    mean_at_3 = sum(pass_at_k(10, c, 3) for c in passed.values()) / 2
    mean_hat_3 = sum(pass_hat_k(10, c, 3) for c in passed.values()) / 2
    assert stats["pass_at_k"] == pytest.approx(mean_at_3, abs=1e-4)
    assert stats["pass_hat_k"] == pytest.approx(mean_hat_3, abs=1e-4)
    low, high = wilson_interval(sum(passed.values()), 20)
    assert stats["pass_rate_ci95"] == [round(low, 4), round(high, 4)]
    flaky = [c for c, p in passed.items() if 0 < p < 10]
    assert stats["flaky"] == flaky
    assert document["summary"]["total"] == 2
    assert [
        (c["id"], c["passed"], c["repeats"], c["flaky"], c["status"]) for c in document["cases"]
    ] == [(c, p, 10, 0 < p < 10, "passed" if p == 10 else "failed") for c, p in passed.items()]
    run_id = document["run_id"]

    # The stored run, in the other formats: one row / testcase per case.
    def report(fmt: str) -> str:
        code, out, _ = place.submit(["report", run_id, "--format", fmt])
        assert code == (0 if all(p == 10 for p in passed.values()) else 1)
        return out

    tsv, table, junit = report("tsv"), report("table"), report("junit")
    # The HTML report of the stored run (Postgres on a fleet) embeds every repetition.
    page = report("html")
    assert page.startswith("<!DOCTYPE html>")
    assert page.count('"repeats":10') + page.count('"repeats": 10') >= 20
    rows = [line.split("\t") for line in tsv.splitlines()]
    assert rows[0][-3:] == ["repeats", "passed_repeats", "flaky"]
    assert [(r[0], r[-3], r[-2], r[-1]) for r in rows[1:]] == [
        (c, "10", str(p), "true" if 0 < p < 10 else "false") for c, p in passed.items()
    ]
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["ID", "STATUS", "REPEATS"]
    for c, p in passed.items():
        row = next(line for line in lines if line.startswith(c))
        assert f"{p}/10" in row and (("flaky" in row) == (0 < p < 10))
    xmlschema.XMLSchema(str(XSD)).validate(junit)
    testcases = ET.fromstring(junit.encode()).iter("testcase")
    found = {t.get("name"): t for t in testcases}
    assert set(found) == {"coin-a", "coin-b"}
    for c, p in passed.items():
        failure = found[c].find("failure")
        if p == 10:
            assert failure is None
            continue
        assert failure is not None
        assert f"{p}/10 repetitions passed" in (failure.get("message") or "")
        body = failure.text or ""
        failed = [r["repeat"] for r in records if r["id"] == c and r["status"] == "failed"]
        assert [int(line.split()[1].split("/")[0]) for line in body.splitlines()] == failed


def test_reeval_rejudges_each_repetition(place: Place, coin: CoinAgent, tmp_path: Path) -> None:
    config = _project(tmp_path, coin)
    cases = _cases(tmp_path, [_case("coin")])
    out = tmp_path / "out.jsonl"
    place.submit(_run(cases, config, "--repeat", "6", "-o", str(out)))
    first = _records(out)
    calls = len(coin.sessions)
    # The criterion changes: "no" is now the right answer. Nothing calls the agent.
    changed = _cases(
        tmp_path, [{**_case("coin", repeat=6), "assertions": [{"type": "equals", "value": "no"}]}]
    )
    again = tmp_path / "again.jsonl"
    place.submit(
        ["-i", str(changed), "-n", "coin", "--config", str(config), "--reeval", "-o", str(again)]
    )
    assert len(coin.sessions) == calls
    second = _records(again)
    assert [(r["repeat"], r["turns"][0]["output"]) for r in second] == [
        (r["repeat"], r["turns"][0]["output"]) for r in first
    ]
    for before, after in zip(first, second, strict=True):
        assert {before["status"], after["status"]} == {"passed", "failed"}


def test_parallel_and_fail_fast_count_every_repetition(place: Place, tmp_path: Path) -> None:
    with CoinAgent(delay=0.2) as slow:
        config = _project(tmp_path, slow)
        cases = _cases(tmp_path, [_case("slow")])
        out = tmp_path / "out.jsonl"
        place.submit(_run(cases, config, "--repeat", "6", "--parallel", "2", "-o", str(out)))
        assert len(_records(out)) == 6
        assert slow.most_at_once() <= 2
    with CoinAgent() as coin:
        config = _project(tmp_path, coin)
        # Always "no" for "yes?": every repetition fails; --fail-fast stops after the first.
        never = _cases(
            tmp_path, [{**_case("never"), "assertions": [{"type": "equals", "value": "maybe"}]}]
        )
        code, stdout, _ = place.submit(
            _run(never, config, "--repeat", "8", "--parallel", "1", "--fail-fast", "-o", str(out))
        )
        records = _records(out)
        assert code == 1
        assert len(coin.sessions) < 8
        assert sum(r["status"] == "failed" for r in records) == len(coin.sessions)
        assert "Not run:" in stdout


def test_a_case_id_that_is_another_cases_repetition_key_is_refused(
    coin: CoinAgent, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _project(tmp_path, coin)
    cases = _cases(tmp_path, [_case("T1", repeat=3), _case("T1#2")])
    code = main(_run(cases, config))
    err = capsys.readouterr().err
    assert code == 2
    assert "'T1#2' is also the key of repetition 2 of case 'T1'" in err
    assert coin.sessions == []


@pytest.mark.fleet
def test_repetitions_spread_across_the_fleets_workers(fleet: Fleet, tmp_path: Path) -> None:
    with CoinAgent(delay=0.3) as slow:
        fleet.start("one", concurrency=2)
        fleet.start("two", concurrency=2)
        config = _project(tmp_path, slow)
        cases = _cases(tmp_path, [_case("spread")])
        out = tmp_path / "out.jsonl"
        done = fleet.submit(_run(cases, config, "--repeat", "8", "-o", str(out)))
        assert done.returncode in (0, 1), done.stderr
        assert len(_records(out)) == 8
        # Each repetition is its own chain of turn tasks: both workers played some.
        assert set(slow.workers) == {"one", "two"}, slow.workers
        assert len(set(slow.sessions)) == 8


def test_budgets_and_the_deadline_count_every_repetition(place: Place, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with CoinAgent() as coin:
        config = _project(tmp_path, coin)
        cases = _cases(tmp_path, [_case("budget")])
        # Each call uses 6 tokens: a 12-token budget lasts at most two repetitions.
        _, stdout, _ = place.submit(
            _run(cases, config, "--repeat", "6", "--max-tokens", "12", "-o", str(out))
        )
        records = _records(out)
        assert len(records) == 6
        assert 1 <= len(coin.sessions) <= 2
        assert sum(r["total_turns"] for r in records) == len(coin.sessions)
        assert "Budget:" in stdout
    with CoinAgent(delay=0.25) as slow:
        config = _project(tmp_path, slow)
        code, _, _ = place.submit(
            _run(cases, config, "--repeat", "10", "--parallel", "1", "--deadline", "0.6s")
        )
        assert code == 1
        assert len(slow.sessions) < 10


def test_a_repeated_run_left_unfinished_is_resumed(
    coin: CoinAgent, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agenttest_submit.run.runner import store_run
    from agenttest_worker.agents.config_loading import load_config
    from agenttest_worker.cases.case_model import Case
    from agenttest_worker.engine import RunOptions
    from agenttest_worker.settings import get_settings

    # Stored, never played: as if the submitter died as soon as it had written the run.
    url = get_settings().effective_database_url()
    case = Case.model_validate(_case("resumed"))
    run_id, total = store_run(
        url,
        case.repetitions(3),
        options=RunOptions(target="coin"),
        config=load_config(str(_project(tmp_path, coin))),
        target="coin",
        label="resumed",
    )
    assert total == 3
    out = tmp_path / "out.jsonl"
    main(["resume", run_id])
    capsys.readouterr()
    assert main(["report", run_id, "-o", str(out)]) in (0, 1)
    records = _records(out)
    assert [(r["id"], r["repeat"], r["repeats"]) for r in records] == [
        ("resumed", 1, 3),
        ("resumed", 2, 3),
        ("resumed", 3, 3),
    ]
    assert len(set(coin.sessions)) == 3


def test_repeats_multiply_the_calls_and_the_usage_and_nothing_else(
    place: Place, coin: CoinAgent, tmp_path: Path
) -> None:
    config = _project(tmp_path, coin)
    cases = _cases(tmp_path, [_case("u1"), _case("u2")])
    out = tmp_path / "out.json"
    place.submit(_run(cases, config, "--format", "json", "-o", str(out)))
    once = json.loads(out.read_text(encoding="utf-8"))["usage_by_role"]
    _, console, _ = place.submit(_run(cases, config, "--repeat", "4"))
    place.submit(_run(cases, config, "--repeat", "4", "--format", "json", "-o", str(out)))
    document = json.loads(out.read_text(encoding="utf-8"))
    four = document["usage_by_role"]
    assert once == {
        "target": {
            "calls": 2,
            "prompt_tokens": 10,
            "completion_tokens": 2,
            "total_tokens": 12,
            "cost": 0.0,
        }
    }
    assert four["target"] == {k: v * 4 for k, v in once["target"].items()}
    assert set(four) == {"target"}  # no judge, simulator or anything else appeared
    assert "Usage: target 8 calls, 48 tokens" in console
    per_record = [r["usage_by_role"]["target"]["calls"] for r in document["results"]]
    assert per_record == [1] * 8
    assert len(coin.sessions) == 2 + 8 + 8
