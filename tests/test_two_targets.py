"""Two targets in one run, embedded: `-n A -n B` plays every case against each target,
the reports show each case once with each target's verdict, and the targets of a run
compare as two runs do (`diff RUN --targets A B`).

A scripted agent served over HTTP answers as two registry entries that answer
differently: `good` right to every question, `bad` wrong to T2's. The fleet's run is
tests/test_two_targets_fleet.py.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scripted_agent import ScriptedAgent, last_user_text

from agenttest_submit.cli.main import main

QUESTIONS = ["question T1", "question T2", "question T3"]


def _case(case_id: str, **more: Any) -> dict[str, Any]:
    return {
        "id": case_id,
        "input": f"question {case_id}",
        "assertions": [{"type": "contains", "value": "right"}],
        **more,
    }


CASES = [_case("T1"), _case("T2"), _case("T3")]


def _bad(body: dict[str, Any]) -> str:
    return "wrong" if last_user_text(body).endswith("T2") else "right answer"


@pytest.fixture
def agent() -> Iterator[ScriptedAgent]:
    with ScriptedAgent() as served:
        served.script("good", lambda body: "right answer")
        served.script("bad", _bad)
        yield served


class Project:
    """agenttest.yaml with the scripted `good` and `bad`, a case file, and the commands."""

    def __init__(self, agent: ScriptedAgent, tmp_path: Path, capsys: Any) -> None:
        self.agent, self.tmp_path, self.capsys = agent, tmp_path, capsys
        self.config = tmp_path / "agenttest.yaml"
        entries = {name: agent.entry(name, max_retries=0) for name in ("good", "bad")}
        self.config.write_text(json.dumps({"agents": entries}), encoding="utf-8")
        self.cases = tmp_path / "cases.jsonl"
        self.write(CASES)

    def write(self, cases: list[dict[str, Any]]) -> None:
        self.cases.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")

    def command(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(list(args))
        out, err = self.capsys.readouterr()
        assert "Traceback" not in err, err
        return code, out, err

    def submit(self, *args: str) -> tuple[int, str, str]:
        return self.command("-i", str(self.cases), "--config", str(self.config), *args)

    def report(self, fmt: str, *args: str) -> tuple[int, str]:
        """Run, writing the report in `fmt`: (exit code, the report)."""
        out = self.tmp_path / f"report.{fmt}"
        code, _, err = self.submit(*args, "-o", str(out), "--format", fmt)
        assert out.exists(), err
        return code, out.read_text(encoding="utf-8")

    def asked(self, model: str) -> list[str]:
        return sorted(last_user_text(body) for body in self.agent.requests(model))


@pytest.fixture
def project(agent: ScriptedAgent, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Project:
    return Project(agent, tmp_path, capsys)


def _records(text: str) -> dict[tuple[str, str], str]:
    found = [json.loads(line) for line in text.splitlines()]
    return {(r["id"], r["agent"]): r["status"] for r in found}


def test_every_case_is_played_against_each_target(project: Project) -> None:
    code, text = project.report("jsonl", "-n", "good", "-n", "bad")
    assert code == 1
    assert project.asked("good") == QUESTIONS
    assert project.asked("bad") == QUESTIONS
    assert _records(text) == {
        ("T1", "good"): "passed",
        ("T2", "good"): "passed",
        ("T3", "good"): "passed",
        ("T1", "bad"): "passed",
        ("T2", "bad"): "failed",
        ("T3", "bad"): "passed",
    }


def test_the_console_shows_each_case_once_with_each_targets_verdict(project: Project) -> None:
    code, out, _ = project.submit("-n", "good", "-n", "bad")
    assert code == 1
    assert "ℹ Agent: good, bad" in out
    assert out.count("► [T2]") == 1 and out.count("► [T1]") == 1
    t2 = out[out.index("► [T2]") : out.index("► [T3]")]
    assert "✓ good: PASSED" in t2 or "✓ good: passed" in t2.lower()
    assert "✗ bad:" in t2 and "failed" in t2.lower()
    assert "good: 3 passed, 0 failed, 0 skipped" in out
    assert "bad: 2 passed, 1 failed, 0 skipped" in out
    # The targets compared at the end, as `diff RUN --targets good bad` does.
    assert "bad against good: 1 newly failing (T2), 0 fixed" in out


def test_json_has_each_cases_verdict_per_target(project: Project) -> None:
    _, text = project.report("json", "-n", "good", "-n", "bad")
    document = json.loads(text)
    assert document["agent"] == "good, bad"
    assert document["targets"] == ["good", "bad"]
    cases = {c["id"]: c["targets"] for c in document["cases"]}
    assert list(cases) == ["T1", "T2", "T3"]
    assert {t: v["status"] for t, v in cases["T2"].items()} == {"good": "passed", "bad": "failed"}
    assert len(document["results"]) == 6


def test_junit_has_one_testcase_per_case_and_target(project: Project) -> None:
    _, text = project.report("junit", "-n", "good", "-n", "bad")
    suite = ET.fromstring(text).find("testsuite")
    assert suite is not None
    cases = {c.get("name"): c.find("failure") is not None for c in suite.iter("testcase")}
    assert cases == {
        "T1 @ good": False,
        "T2 @ good": False,
        "T3 @ good": False,
        "T1 @ bad": False,
        "T2 @ bad": True,
        "T3 @ bad": False,
    }
    assert suite.get("tests") == "6" and suite.get("failures") == "1"


def test_markdown_and_table_say_each_rows_target(project: Project) -> None:
    _, text = project.report("markdown", "-n", "good", "-n", "bad")
    assert "- ✗ **T2** @ bad" in text and "@ good" not in text
    _, text = project.report("table", "-n", "good", "-n", "bad")
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["ID", "TARGET", "STATUS"]
    assert [line.split()[:3] for line in lines[1:7]] == [
        [case_id, target, "FAILED" if (case_id, target) == ("T2", "bad") else "PASSED"]
        for case_id in ("T1", "T2", "T3")
        for target in ("good", "bad")
    ]
    _, text = project.report("tsv", "-n", "good", "-n", "bad")
    rows = [line.split("\t") for line in text.splitlines()]
    assert rows[0][-1] == "target" and [r[-1] for r in rows[1:3]] == ["good", "bad"]


def test_the_diff_of_two_targets_classifies_cases_as_the_diff_of_two_runs(
    project: Project,
) -> None:
    _, text = project.report("json", "-n", "good", "-n", "bad")
    run_id = json.loads(text)["run_id"]
    code, out, _ = project.command("diff", run_id, "--targets", "good", "bad", "--format", "json")
    assert code == 1  # a regression, as between runs
    found = json.loads(out)
    assert found["targets"] == {"base": "good", "new": "bad"}
    categories = {c["id"]: c["category"] for c in found["cases"]}
    assert categories == {"T1": "still_passing", "T2": "regression", "T3": "still_passing"}
    [t2] = [c for c in found["cases"] if c["id"] == "T2"]
    assert t2["difference"]["said_then"] == "right answer"
    assert t2["difference"]["said_now"] == "wrong"
    code, out, _ = project.command("diff", run_id, "--targets", "bad", "good")
    assert code == 0
    assert "Diff of target good against target bad" in out
    assert "Fixed (1)" in out and "T2" in out
    code, _, err = project.command("diff", run_id, "--targets", "good", "nosuch")
    assert code == 2 and "played no target 'nosuch'; it played good, bad" in err


def test_repeat_plays_each_targets_repetitions(project: Project) -> None:
    _, text = project.report("json", "-n", "good", "-n", "bad", "--repeat", "2")
    assert project.asked("good") == sorted(QUESTIONS * 2)
    assert project.asked("bad") == sorted(QUESTIONS * 2)
    document = json.loads(text)
    assert len(document["results"]) == 12
    cases = {c["id"]: c["targets"] for c in document["cases"]}
    assert cases["T2"]["bad"]["status"] == "failed" and cases["T2"]["bad"]["repeats"] == 2
    assert cases["T2"]["good"] == {"status": "passed", "passed": 2, "repeats": 2, "flaky": False}


def test_dry_run_prints_the_cases_times_the_targets(project: Project) -> None:
    code, out, err = project.submit("-n", "good", "-n", "bad", "--dry-run", "--id", "T2")
    assert code == 0
    printed = [json.loads(line) for line in out.splitlines()]
    assert [(c["id"], c["agent"]) for c in printed] == [("T2", "good"), ("T2", "bad")]
    assert "1 case(s) × 2 targets = 2 conversation(s)" in err
    assert project.agent.requests("good") == []


def test_a_case_naming_its_own_agent_is_played_against_it_only(project: Project) -> None:
    project.write([_case("T1"), _case("T3", agent="good")])
    code, text = project.report("jsonl", "-n", "good", "-n", "bad")
    assert code == 0
    assert _records(text) == {
        ("T1", "good"): "passed",
        ("T1", "bad"): "passed",
        ("T3", "good"): "passed",
    }
    _, _, err = project.submit("-n", "good", "-n", "bad", "--dry-run")
    assert "1 case(s) name their own agent and are played against it only" in err


def test_a_case_id_that_is_another_cases_target_key_is_refused(project: Project) -> None:
    project.write([_case("T1"), _case("T1@bad")])
    code, out, err = project.submit("-n", "good", "-n", "bad")
    assert (code, out) == (2, "")
    assert "case id 'T1@bad' is also the key of target bad of case 'T1': rename it" in err
    assert project.agent.requests("good") == []
    # With one target, no key has a target: the same ids run.
    code, _, _ = project.submit("-n", "good")
    assert code == 0


def test_an_unknown_target_and_repeat_auto_are_input_errors(project: Project) -> None:
    code, _, err = project.submit("-n", "good", "-n", "nosuch")
    assert code == 2 and "-n:" in err and "nosuch" in err
    code, _, err = project.submit("-n", "good", "-n", "bad", "--repeat", "auto")
    assert code == 2 and "--repeat: cannot be combined with several -n targets" in err


def test_one_target_keeps_todays_reports(project: Project) -> None:
    _, text = project.report("json", "-n", "bad")
    document = json.loads(text)
    assert document["agent"] == "bad"
    assert "targets" not in document and "cases" not in document
    assert [r["id"] for r in document["results"]] == ["T1", "T2", "T3"]
    code, out, _ = project.submit("-n", "bad")
    assert code == 1
    assert "Targets:" not in out and "✗ bad:" not in out
    _, text = project.report("junit", "-n", "bad")
    names = [c.get("name") for c in ET.fromstring(text).iter("testcase")]
    assert names == ["T1", "T2", "T3"]


def test_the_runs_list_labels_the_run_with_its_targets(project: Project) -> None:
    project.submit("-n", "good", "-n", "bad")
    project.submit("-n", "good")
    code, out, _ = project.command("runs", "--format", "json")
    assert code == 0
    assert [r["agent"] for r in json.loads(out)] == ["good", "good, bad"]
    # The suite a run of two targets belongs to is not the one target's.
    suites = [r["suite"] for r in json.loads(out)]
    assert suites[0] != suites[1] and suites[1].startswith("good, bad: ")


def test_a_rerun_plays_a_case_that_failed_on_one_target_on_each(project: Project) -> None:
    project.submit("-n", "good", "-n", "bad")
    before = len(project.agent.requests("good")), len(project.agent.requests("bad"))
    code, text = project.report("jsonl", "-n", "good", "-n", "bad", "--rerun-failed", "last")
    assert code == 1
    assert _records(text) == {("T2", "good"): "passed", ("T2", "bad"): "failed"}
    after = len(project.agent.requests("good")), len(project.agent.requests("bad"))
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)


def test_tags_select_the_cases_each_target_plays(project: Project) -> None:
    project.write([_case("T1", tags=["smoke"]), _case("T2")])
    code, text = project.report("jsonl", "-n", "good", "-n", "bad", "--tag", "smoke")
    assert code == 0
    assert _records(text) == {("T1", "good"): "passed", ("T1", "bad"): "passed"}


def test_a_budget_bounds_the_whole_run_over_its_targets(project: Project) -> None:
    _, text = project.report("json", "-n", "good", "-n", "bad", "--max-tokens", "1")
    document = json.loads(text)
    called = len(project.agent.requests("good")) + len(project.agent.requests("bad"))
    # The first turn runs alone; once it used the budget, no other turn starts.
    assert called == 1
    assert document["summary"]["budget"] is not None
    assert len(document["results"]) == 6
    assert sum(r["status"] == "skipped" for r in document["results"]) == 5


def test_a_run_of_two_targets_is_not_re_judged(project: Project) -> None:
    project.submit("-n", "good", "-n", "bad")
    before = len(project.agent.requests("good")) + len(project.agent.requests("bad"))
    code, out, err = project.command("--reeval", "last", "--config", str(project.config))
    assert (code, out) == (2, "")
    assert "played several targets: re-judge a run of one target" in err
    assert len(project.agent.requests("good")) + len(project.agent.requests("bad")) == before
