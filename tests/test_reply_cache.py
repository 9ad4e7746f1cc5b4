"""The reply cache: an identical request to a stable judge (temperature 0, a seed, or
`cache: true`) is answered once and served from the run's store afterwards; targets are
called as before; --no-cache, --cache-refresh and --cache target; a cached call is
marked and costs nothing; `agenttest-submit cache stats|clear`.

Every count is of the requests a real HTTP agent (tests/scripted_agent.py) received.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from scripted_agent import ScriptedAgent, judge_verdict

from agenttest_submit.cli.main import main
from agenttest_worker.agents.reply_cache import Busy, CacheEntry, Hit, Leased
from agenttest_worker.store.sql.cached_replies import CacheLimits, SqlReplyCache

CASES = [
    {
        "id": f"c{n}",
        "input": f"question {n}",
        "assertions": [{"type": "agent", "options": {"metadata": {"criteria": "answers"}}}],
    }
    for n in range(3)
]


@pytest.fixture
def agent() -> Iterator[ScriptedAgent]:
    with ScriptedAgent() as served:
        served.script("target", lambda body: "an answer")
        served.script("judge", lambda body: judge_verdict(True, "it answers"))
        yield served


def project(
    tmp_path: Path, agent: ScriptedAgent, judge: dict[str, Any], target: dict[str, Any]
) -> tuple[Path, Path]:
    config = {
        "agents": {
            "bot": agent.entry("target", **target),
            "grader": agent.entry("judge", **judge),
        },
        "defaults": {"judge": "agents:grader"},
    }
    config_path = tmp_path / "agenttest.yaml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    cases = tmp_path / "cases.jsonl"
    cases.write_text("".join(json.dumps(c) + "\n" for c in CASES), encoding="utf-8")
    return config_path, cases


def run(
    capsys: pytest.CaptureFixture[str], config: Path, cases: Path, out: Path, *argv: str
) -> str:
    capsys.readouterr()
    code = main(["-i", str(cases), "-n", "bot", "--config", str(config), "-o", str(out), *argv])
    console = capsys.readouterr().err
    assert code == 0, console
    return console


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def judge_calls(record: dict[str, Any]) -> list[dict[str, Any]]:
    calls = [c for turn in record["turns"] for c in turn.get("calls") or []]
    return [c for c in calls if c["role"] == "validator"]


STABLE = {"params": {"temperature": 0}}


def test_a_second_identical_run_calls_the_judge_zero_times_and_the_target_as_before(
    tmp_path: Path, agent: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    config, cases = project(tmp_path, agent, STABLE, {})
    run(capsys, config, cases, tmp_path / "first.jsonl", "--format", "jsonl")
    assert len(agent.requests("judge")) == 3
    assert len(agent.requests("target")) == 3
    first = records(tmp_path / "first.jsonl")
    assert all(not c.get("cached") for r in first for c in judge_calls(r))

    run(capsys, config, cases, tmp_path / "second.jsonl", "--format", "jsonl")
    assert len(agent.requests("judge")) == 3  # none more: every verdict came from the cache
    assert len(agent.requests("target")) == 6  # targets are not cached by default
    second = records(tmp_path / "second.jsonl")
    for record in second:
        assert record["status"] == "passed"
        (call,) = judge_calls(record)
        assert call["cached"] is True
        assert call.get("usage", {}).get("total_tokens", 0) == 0
        assert record["usage_by_role"]["judge"]["cached"] == 1
        assert record["usage_by_role"]["judge"]["total_tokens"] == 0


def test_the_console_summary_counts_cached_calls(
    tmp_path: Path, agent: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    config, cases = project(tmp_path, agent, {"params": {"seed": 7}}, {})
    run(capsys, config, cases, tmp_path / "first.txt")
    capsys.readouterr()
    assert main(["-i", str(cases), "-n", "bot", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "judge 3 calls, 3 cached, 0 tokens" in out, out


def test_no_cache_calls_again_and_cache_refresh_stores_the_new_reply(
    tmp_path: Path, agent: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    config, cases = project(tmp_path, agent, STABLE, {})
    run(capsys, config, cases, tmp_path / "a.jsonl", "--format", "jsonl")
    run(capsys, config, cases, tmp_path / "b.jsonl", "--format", "jsonl", "--no-cache")
    assert len(agent.requests("judge")) == 6
    assert all(not c.get("cached") for r in records(tmp_path / "b.jsonl") for c in judge_calls(r))

    agent.script("judge", lambda body: judge_verdict(False, "changed its mind"))
    code = main(["-i", str(cases), "-n", "bot", "--config", str(config), "--cache-refresh"])
    assert code == 1  # the new verdicts, called for, fail
    assert len(agent.requests("judge")) == 9
    # Served from the cache now: the refreshed (failing) verdicts, without a call.
    code = main(["-i", str(cases), "-n", "bot", "--config", str(config)])
    assert code == 1
    assert len(agent.requests("judge")) == 9


def test_a_judge_without_temperature_or_seed_is_not_cached(
    tmp_path: Path, agent: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    config, cases = project(tmp_path, agent, {}, {})
    run(capsys, config, cases, tmp_path / "a.jsonl")
    run(capsys, config, cases, tmp_path / "b.jsonl")
    assert len(agent.requests("judge")) == 6


def test_cache_false_on_the_entry_and_cache_target(
    tmp_path: Path, agent: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    config, cases = project(tmp_path, agent, {"params": {"temperature": 0}, "cache": False}, {})
    run(capsys, config, cases, tmp_path / "a.jsonl")
    run(capsys, config, cases, tmp_path / "b.jsonl")
    assert len(agent.requests("judge")) == 6

    run(capsys, config, cases, tmp_path / "c.jsonl", "--cache", "target")
    run(capsys, config, cases, tmp_path / "d.jsonl", "--cache", "target")
    assert len(agent.requests("target")) == 12 - 3  # the fourth run's targets were cached


def test_repetitions_do_not_share_the_targets_reply(
    tmp_path: Path, agent: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    config, cases = project(tmp_path, agent, STABLE, {"cache": True})
    run(capsys, config, cases, tmp_path / "a.jsonl", "--repeat", "2")
    assert len(agent.requests("target")) == 6  # each repetition asked for itself
    assert len(agent.requests("judge")) == 3  # the judge's identical requests shared
    run(capsys, config, cases, tmp_path / "b.jsonl", "--repeat", "2")
    assert len(agent.requests("target")) == 6


def test_cache_stats_and_clear(
    tmp_path: Path, agent: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    config, cases = project(tmp_path, agent, STABLE, {})
    run(capsys, config, cases, tmp_path / "a.jsonl")
    capsys.readouterr()
    assert main(["cache", "stats"]) == 0
    stats = capsys.readouterr().out
    assert "grader" in stats and "3 replies" in stats, stats
    assert main(["cache", "clear", "--agent", "bot"]) == 0
    assert "removed 0 cached replies" in capsys.readouterr().out
    assert main(["cache", "clear", "--older-than", "1h"]) == 0
    assert "removed 0 cached replies" in capsys.readouterr().out
    assert main(["cache", "clear", "--agent", "grader"]) == 0
    assert "removed 3 cached replies" in capsys.readouterr().out
    run(capsys, config, cases, tmp_path / "b.jsonl")
    assert len(agent.requests("judge")) == 6


def test_two_callers_racing_on_one_key_call_once(pg_database: str) -> None:
    """On Postgres, as a fleet shares it: of callers claiming one key at once, one holds
    the lease; the others are told to wait, then find its reply."""
    caches = [SqlReplyCache(pg_database, CacheLimits(lease_seconds=30)) for _ in range(4)]
    key = "race-" + "0" * 59
    caches[0].clear()
    start = threading.Barrier(len(caches))
    claims: list[object] = []

    def claim(cache: SqlReplyCache) -> None:
        start.wait()
        claims.append(cache.claim(key, "grader", "validator"))

    threads = [threading.Thread(target=claim, args=(c,)) for c in caches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(isinstance(c, Leased) for c in claims) == 1, claims
    caches[0].fill(CacheEntry(key, "grader", "validator", {"content": "verdict"}))
    assert caches[1].claim(key, "grader", "validator") == Hit({"content": "verdict"})


def test_the_oldest_replies_are_evicted_past_the_bound(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    cache = SqlReplyCache(url, CacheLimits(max_entries=2, evict_every=1))
    for n in range(4):
        key = f"{n:064d}"
        assert isinstance(cache.claim(key, "grader", "validator"), Leased)
        cache.fill(CacheEntry(key, "grader", "validator", {"content": str(n)}))
    (stats,) = cache.stats()
    assert stats.entries == 2
    assert cache.claim(f"{3:064d}", "grader", "validator") == Hit({"content": "3"})
    assert isinstance(cache.claim(f"{0:064d}", "grader", "validator"), Leased)


def test_a_lease_outlives_other_replies_being_stored_and_is_released_on_failure(
    tmp_path: Path,
) -> None:
    """Storing a reply evicts expired replies, never another caller's lease."""
    cache = SqlReplyCache(f"sqlite:///{tmp_path / 'cache.db'}")
    leased, other = "1" * 64, "2" * 64
    assert isinstance(cache.claim(leased, "grader", "validator"), Leased)
    assert isinstance(cache.claim(other, "grader", "validator"), Leased)
    cache.fill(CacheEntry(other, "grader", "validator", {"content": "x"}))
    assert isinstance(cache.claim(leased, "grader", "validator"), Busy)
    assert [s.entries for s in cache.stats()] == [1]  # leases are not replies
    cache.release(leased)  # the call failed: the next caller calls for itself
    assert isinstance(cache.claim(leased, "grader", "validator"), Leased)


def test_a_stable_generator_is_called_once_for_two_identical_runs(
    tmp_path: Path, agent: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    generated = {"id": "g1", "input": "generated question"}
    agent.script("gen", lambda body: json.dumps({"cases": [generated]}))
    config, _ = project(tmp_path, agent, STABLE, {})
    document = yaml.safe_load(config.read_text(encoding="utf-8"))
    document["agents"]["gen"] = agent.entry("gen", params={"seed": 1})
    config.write_text(yaml.safe_dump(document), encoding="utf-8")
    argv = ["-i", "agents:gen?count=1", "-n", "bot", "--config", str(config)]
    for output in ("a.jsonl", "b.jsonl"):
        capsys.readouterr()
        assert main([*argv, "-o", str(tmp_path / output), "--format", "jsonl"]) == 0
        assert [r["id"] for r in records(tmp_path / output)] == ["g1"]
    assert len(agent.requests("gen")) == 1
    assert len(agent.requests("target")) == 2
    capsys.readouterr()
    assert main([*argv, "--no-cache"]) == 0
    assert len(agent.requests("gen")) == 2


def test_a_judge_reply_that_cannot_be_read_is_not_stored(
    tmp_path: Path, agent: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    agent.script("judge", lambda body: "no verdict here")
    config, cases = project(tmp_path, agent, STABLE, {})
    argv = ["-i", str(cases), "-n", "bot", "--config", str(config)]
    started = time.monotonic()
    assert main(argv) == 1
    # The junk reply's lease is given back at once: the cases asking the judge the
    # same thing do not wait for it to run out (a minute) before calling for themselves.
    assert time.monotonic() - started < 30
    agent.script("judge", lambda body: judge_verdict(True, "it answers"))
    assert main(argv) == 0  # asked again: the junk was not kept
    assert len(agent.requests("judge")) == 6
