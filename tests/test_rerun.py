"""Reruns, embedded: `--rerun-failed [RUN|last]` and `--rerun-skipped` play again only the
cases of the current inputs that failed (or were skipped) in a stored run.

A case file is run against a scripted agent served over HTTP that answers some cases
wrong; the rerun is then checked by what the agent was asked (its requests) and by the
records the rerun wrote. The fleet's rerun is tests/test_rerun_fleet.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scripted_agent import ScriptedAgent, by_last_user, fail, last_user_text

from agenttest_submit.cli.main import main


@pytest.fixture
def agent() -> Iterator[ScriptedAgent]:
    with ScriptedAgent() as served:
        yield served


def _case(
    case_id: str, *, tags: list[str] | None = None, asks: str | None = None
) -> dict[str, Any]:
    return {
        "id": case_id,
        "input": asks or f"question {case_id}",
        "tags": tags or [],
        "assertions": [{"type": "contains", "value": "right"}],
    }


class Project:
    """A case file, agenttest.yaml with the scripted `bot`, and the commands run on them."""

    def __init__(self, agent: ScriptedAgent, tmp_path: Path, capsys: Any) -> None:
        self.agent, self.tmp_path, self.capsys = agent, tmp_path, capsys
        self.config = tmp_path / "agenttest.yaml"
        entry = agent.entry("bot", max_retries=0)
        self.config.write_text(json.dumps({"agents": {"bot": entry}}), encoding="utf-8")
        self.cases = tmp_path / "cases.jsonl"
        self.runs = 0

    def write(self, cases: list[dict[str, Any]]) -> None:
        self.cases.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")

    def answer(self, right: set[str]) -> None:
        """The agent answers right to the questions of the cases in `right` only."""

        def rule(body: dict[str, Any]) -> str:
            asked = last_user_text(body).split()[-1]
            return "right answer" if asked in right else "wrong answer"

        self.agent.script("bot", rule)

    def submit(self, *more: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(["-i", str(self.cases), "-n", "bot", "--config", str(self.config), *more])
        out, err = self.capsys.readouterr()
        return code, out, err

    def command(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(list(args))
        out, err = self.capsys.readouterr()
        return code, out, err

    def asked(self) -> list[str]:
        """What the agent was asked, in order of arrival, since the last call."""
        texts = [last_user_text(body) for body in self.agent.requests("bot")]
        seen, self.runs = self.runs, len(texts)
        return texts[seen:]

    def records(self, *more: str) -> tuple[int, dict[str, str], str]:
        """Submit writing JSONL records: (exit code, {id: status}, stderr)."""
        self.runs_file = self.tmp_path / "out.jsonl"
        self.runs_file.unlink(missing_ok=True)
        code, _, err = self.submit(*more, "-o", str(self.runs_file), "--format", "jsonl")
        if not self.runs_file.exists():
            return code, {}, err
        lines = self.runs_file.read_text(encoding="utf-8").splitlines()
        return code, {r["id"]: r["status"] for r in map(json.loads, lines)}, err

    def newest_run(self) -> dict[str, Any]:
        code, out, _ = self.command("runs", "--last", "1", "--format", "json")
        assert code == 0
        newest: dict[str, Any] = json.loads(out)[0]
        return newest

    def run_count(self) -> int:
        code, out, _ = self.command("runs", "--format", "json")
        assert code == 0
        return len(json.loads(out))


@pytest.fixture
def project(agent: ScriptedAgent, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Project:
    return Project(agent, tmp_path, capsys)


FOUR = ["a", "b", "c", "d"]


def _first_run(project: Project, right: set[str]) -> str:
    project.write([_case(i) for i in FOUR])
    project.answer(right)
    code, _, err = project.records()
    assert code == (0 if right >= set(FOUR) else 1), err
    assert len(project.asked()) == 4
    return str(project.newest_run()["run_id"])


def test_rerun_failed_last_plays_only_the_failures(project: Project) -> None:
    first = _first_run(project, {"a", "c"})
    project.answer(set(FOUR))  # the agent is fixed
    code, statuses, err = project.records("--rerun-failed", "last")
    assert code == 0, err
    assert sorted(project.asked()) == ["question b", "question d"]
    assert statuses == {"b": "passed", "d": "passed"}
    assert f"rerunning 2 cases of run {first} (failed)" in err
    # The rerun is a run of its own, made from the first one.
    rerun = project.newest_run()
    assert rerun["run_id"] != first and rerun["cases"] == 2
    code, out, _ = project.command("status", str(rerun["run_id"]))
    assert f"from      {first}" in out


def test_rerun_failed_alone_reads_the_newest_finished_run(project: Project) -> None:
    _first_run(project, {"a", "b", "c"})
    project.answer({"a", "b", "d"})  # d is fixed, c breaks: a rerun of d alone passes
    code, statuses, err = project.records("--rerun-failed")
    assert code == 0, err
    assert statuses == {"d": "passed"}
    assert project.asked() == ["question d"]


def test_rerun_failed_of_a_named_run(project: Project) -> None:
    first = _first_run(project, {"a", "b", "c"})  # d failed
    project.answer({"a", "c", "d"})  # b answers wrong now
    code, statuses, _ = project.records()
    assert code == 1 and statuses["b"] == "failed" and statuses["d"] == "passed"
    project.asked()
    # Run 1 named: its d, not the b of the newest run.
    code, statuses, err = project.records("--rerun-failed", first)
    assert code == 0, err
    assert statuses == {"d": "passed"}
    assert project.asked() == ["question d"]


def test_a_case_whose_agent_call_errored_is_rerun(project: Project) -> None:
    project.write([_case("a"), _case("b")])
    project.agent.script("bot", by_last_user({"question a": fail(500, "the agent broke")}, "right"))
    code, statuses, _ = project.records()
    assert code == 1 and statuses == {"a": "failed", "b": "passed"}
    project.asked()
    project.answer({"a", "b"})
    code, statuses, err = project.records("--rerun-failed", "last")
    assert code == 0, err
    assert statuses == {"a": "passed"}
    assert project.asked() == ["question a"]


def _skipping_run(project: Project) -> str:
    """a fails first; --fail-fast then skips b, c and d (one conversation at a time)."""
    project.write([_case(i) for i in FOUR])
    project.answer({"b", "c", "d"})
    code, statuses, err = project.records("--fail-fast", "--parallel", "1")
    assert code == 1, err
    assert statuses == {"a": "failed", "b": "skipped", "c": "skipped", "d": "skipped"}
    assert project.asked() == ["question a"]
    return str(project.newest_run()["run_id"])


def test_rerun_skipped_alone_and_with_the_failures(project: Project) -> None:
    run = _skipping_run(project)
    project.answer(set(FOUR))
    code, statuses, err = project.records("--rerun-skipped", run)
    assert code == 0, err
    assert statuses == {"b": "passed", "c": "passed", "d": "passed"}
    assert sorted(project.asked()) == ["question b", "question c", "question d"]
    # Both flags: the failed and the skipped cases of one run (named once, for both).
    code, statuses, err = project.records("--rerun-failed", run, "--rerun-skipped")
    assert code == 0, err
    assert set(statuses) == set(FOUR)
    assert "(failed or skipped)" in err
    # Two runs named: an input error.
    code, _, err = project.submit("--rerun-failed", run, "--rerun-skipped", "other")
    assert code == 2 and "--rerun-skipped" in err and "Traceback" not in err


def test_the_current_case_file_is_used(project: Project) -> None:
    first = _first_run(project, {"a", "c"})  # b and d failed
    # b is edited, d removed, e added (not in the first run: not rerun).
    project.write([_case("a"), _case("b", asks="edited b"), _case("c"), _case("e")])
    project.answer({"b"})
    code, statuses, err = project.records("--rerun-failed", first)
    assert code == 0, err
    assert statuses == {"b": "passed"}
    assert project.asked() == ["edited b"]
    assert f"--rerun-failed: 1 failed case(s) of run {first} are no longer in the inputs" in err
    assert err.rstrip().count("not run: d") == 1


def test_with_tag_id_dry_run_and_repeat(project: Project) -> None:
    project.write(
        [_case("a", tags=["x"]), _case("b", tags=["x"]), _case("c", tags=["y"]), _case("d")]
    )
    project.answer({"a"})  # b, c and d fail
    code, _, _ = project.records()
    assert code == 1
    first = str(project.newest_run()["run_id"])
    project.asked()
    project.answer(set(FOUR))
    # An intersection with --tag and with --id.
    code, statuses, err = project.records("--rerun-failed", first, "--tag", "x")
    assert (code, statuses) == (0, {"b": "passed"}), err
    code, statuses, err = project.records("--rerun-failed", first, "--id", "c", "--id", "a")
    assert (code, statuses) == (0, {"c": "passed"}), err
    assert project.asked() == ["question b", "question c"]
    # --dry-run prints what would run, and calls nothing.
    code, out, err = project.submit("--rerun-failed", first, "--dry-run")
    assert code == 0, err
    assert [json.loads(line)["id"] for line in out.splitlines()] == ["b", "c", "d"]
    assert f"rerunning 3 cases of run {first} (failed)" in err
    assert project.asked() == []
    # --repeat plays each case of the rerun that many times.
    code, _, err = project.submit("--rerun-failed", first, "--repeat", "2")
    assert code == 0, err
    assert sorted(project.asked()) == sorted([f"question {i}" for i in "bcd"] * 2)


def test_a_repeated_case_is_rerun_when_its_verdict_failed(project: Project) -> None:
    project.write([_case("x"), _case("y"), _case("z")])
    calls: dict[str, int] = {}

    def rule(body: dict[str, Any]) -> str:
        asked = last_user_text(body)
        calls[asked] = calls.get(asked, 0) + 1
        if asked == "question x":  # one repetition of three passes
            return "right" if calls[asked] == 1 else "wrong"
        return "right" if asked == "question z" else "wrong"

    project.agent.script("bot", rule)
    code, statuses, err = project.records("--repeat", "3", "--pass-rule", "any", "--parallel", "1")
    assert code == 1, err  # y failed
    project.asked()
    # Under `any`, x passed (one of three) and y failed: only y is played again.
    project.answer(set("xyz"))
    code, statuses, err = project.records("--rerun-failed")
    assert code == 0, err
    assert statuses == {"y": "passed"}
    assert project.asked() == ["question y"]


def test_nothing_to_rerun_exits_0_and_runs_nothing(project: Project) -> None:
    first = _first_run(project, set(FOUR))
    code, _, err = project.submit("--rerun-failed")
    assert code == 0
    assert f"nothing to rerun: run {first} has no failed case" in err
    assert project.asked() == [] and project.run_count() == 1
    # Failures, none of them selected by --id: nothing either.
    project.answer({"a"})
    _, statuses, _ = project.records()
    assert statuses["b"] == "failed"
    project.asked()
    code, _, err = project.submit("--rerun-failed", "--id", "a")
    assert code == 0
    assert "none of the failed cases of run" in err
    assert project.asked() == [] and project.run_count() == 2


def test_an_unknown_run_is_an_input_error(project: Project) -> None:
    project.write([_case("a")])
    code, _, err = project.submit("--rerun-failed")  # an empty store: no finished run
    assert code == 2 and "no finished run in" in err and "Traceback" not in err
    _first_run(project, {"a"})
    code, _, err = project.submit("--rerun-failed", "no-such-run")
    assert code == 2
    assert "--rerun-failed: no run 'no-such-run'" in err and "Traceback" not in err
    code, _, err = project.submit("--rerun-skipped", "--suite", "never-run")
    assert code == 2 and "suite 'never-run' has no finished run" in err
    assert project.asked() == []
    code, _, err = project.submit("--rerun-failed", "--reeval")
    assert code == 2 and "--reeval" in err


def test_an_unreachable_store_exits_3(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    project.write([_case("a")])
    monkeypatch.setenv("AGENTTEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/nothing")
    code, _, err = project.submit("--rerun-failed", "last")
    assert code == 3, err
    assert "Traceback" not in err
    assert project.asked() == []


def test_alone_with_a_suite_it_reads_that_suites_newest_finished_run(project: Project) -> None:
    project.write([_case(i) for i in FOUR])
    project.answer({"a", "b"})  # c and d fail in suite "nightly"
    code, _, _ = project.records("--suite", "nightly")
    assert code == 1
    project.answer({"a", "c", "d"})  # b fails in suite "other", the newest run
    code, _, _ = project.records("--suite", "other")
    assert code == 1
    project.asked()
    project.answer(set(FOUR))
    code, statuses, err = project.records("--suite", "nightly", "--rerun-failed")
    assert code == 0, err
    assert statuses == {"c": "passed", "d": "passed"}
    assert sorted(project.asked()) == ["question c", "question d"]
    assert project.newest_run()["suite"] == "nightly"
    # `last` is the store's newest finished run, whatever --suite says: "nightly"'s
    # rerun just now, which failed nothing.
    code, _, err = project.submit("--suite", "other", "--rerun-failed", "last")
    assert code == 0 and "has no failed case" in err


def test_a_run_that_has_not_finished_is_refused(project: Project) -> None:
    from agenttest_worker.settings import get_settings
    from agenttest_worker.store import runs, upgrade

    project.write([_case("a")])
    url = get_settings().effective_database_url()
    upgrade(url)
    runs.create_run(
        url, run_id="still-storing", agent="bot", input_label="x", options={}, config={}
    )
    code, _, err = project.submit("--rerun-failed", "still-storing")
    assert code == 2
    assert "run still-storing has not finished (status pending)" in err
    assert "Traceback" not in err and project.asked() == []
