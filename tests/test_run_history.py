"""Run history: suites, `diff`, `--baseline` with `--fail-on regressions`, `history`, `runs`.

Real histories: the same case file run night after night against a scripted agent
(served over HTTP) whose answers change between runs, so that one case regresses,
one is fixed, one keeps failing, one flips every night, one is added and one removed.
Every run is made embedded and on a one-worker fleet (marked `fleet`), and the history
commands read the store each one wrote (SQLite, Postgres).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import xmlschema
from fleet import Fleet, fleet_on
from places import PLACES, Place
from scripted_agent import Reply, ScriptedAgent, by_last_user

from agenttest_submit.cli.main import main

XSD = Path(__file__).parent / "fixtures" / "junit-10.xsd"


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


@pytest.fixture(params=PLACES)
def place(request: pytest.FixtureRequest) -> Place:
    return Place(request.param, request, worker="history", threads=4)


@pytest.fixture
def agent() -> Iterator[ScriptedAgent]:
    with ScriptedAgent() as served:
        yield served


def _case(case_id: str) -> dict[str, Any]:
    return {
        "id": case_id,
        "name": f"The {case_id} case",
        "input": f"question {case_id}",
        "assertions": [{"type": "contains", "value": "right"}],
    }


class Nights:
    """The suite run night after night: each night the agent answers as told."""

    def __init__(self, place: Place, agent: ScriptedAgent, tmp_path: Path) -> None:
        self.place, self.agent, self.tmp_path = place, agent, tmp_path
        self.config = tmp_path / "agenttest.yaml"
        entry = agent.entry("bot", max_retries=0)
        self.config.write_text(json.dumps({"agents": {"bot": entry}}), encoding="utf-8")
        # A derived suite names the file relative to agenttest.yaml's folder: a name of
        # this test's own keeps its suite apart from other tests' in a shared database.
        self.cases = tmp_path / f"nightly-{tmp_path.name}.jsonl"

    def args(self, *more: str) -> list[str]:
        return ["-i", str(self.cases), "-n", "bot", "--config", str(self.config), *more]

    def run(self, right: set[str], ids: list[str], *more: str) -> tuple[int, str, str]:
        """One night: cases `ids`, the agent right about those in `right`."""
        self.cases.write_text("".join(json.dumps(_case(i)) + "\n" for i in ids), encoding="utf-8")
        answers: dict[str, Reply | str] = {
            f"question {i}": ("right answer" if i in right else "wrong answer") for i in ids
        }
        self.agent.script("bot", by_last_user(answers))
        return self.place.submit(self.args(*more))

    def command(self, *args: str) -> tuple[int, str, str]:
        return self.place.submit(list(args))

    def suite(self) -> str:
        """The suite of the newest run: these nights' (none other runs meanwhile)."""
        newest = json.loads(self.command("runs", "--last", "1", "--format", "json")[1])
        return str(newest[0]["suite"])


@pytest.fixture
def nights(place: Place, agent: ScriptedAgent, tmp_path: Path) -> Nights:
    return Nights(place, agent, tmp_path)


EVERY = ["steady", "regress", "fixed", "broken", "flaky", "removed"]


def _two_nights(nights: Nights) -> None:
    # Night 1: steady, regress and removed right; fixed and broken wrong; flaky right.
    nights.run({"steady", "regress", "removed", "flaky"}, EVERY)
    # Nights 2 and 3 flip "flaky" twice; night 3 is the one compared.
    later = ["steady", "regress", "fixed", "broken", "flaky", "added"]
    nights.run({"steady", "regress", "fixed", "added"}, later)
    nights.run({"steady", "fixed", "flaky", "added"}, later)


def test_diff_puts_every_case_in_its_category(nights: Nights) -> None:
    _two_nights(nights)
    code, out, _ = nights.command("diff", "--format", "json")
    document = json.loads(out)
    assert code == 1  # "regress" passed the night before and fails now
    category = {c["id"]: c["category"] for c in document["cases"]}
    assert category == {
        "steady": "still_passing",
        "regress": "regression",
        "fixed": "still_passing",  # fixed on night 2: still passing on night 3
        "broken": "still_failing",
        "flaky": "flaky",  # changed on nights 2 and 3
        "added": "still_passing",
    }
    regress = next(c for c in document["cases"] if c["id"] == "regress")
    assert regress["base"] == "passed" and regress["new"] == "failed"
    assert regress["name"] == "The regress case"
    found = regress["difference"]
    assert found["turn"] == 1
    assert found["said_then"] == "right answer" and found["said_now"] == "wrong answer"
    assert 'contains "right"' in found["assertion"]
    # Night 1 against night 3: fixed, removed and new show.
    suite = nights.suite()
    runs = json.loads(nights.command("runs", "--suite", suite, "--format", "json")[1])
    assert len(runs) == 3
    first, last = runs[2]["run_id"], runs[0]["run_id"]
    document = json.loads(nights.command("diff", first, last, "--format", "json")[1])
    category = {c["id"]: c["category"] for c in document["cases"]}
    assert category["fixed"] == "fixed"
    assert category["removed"] == "removed"
    assert category["added"] == "new"
    assert category["regress"] == "regression"
    assert document["base"]["id"] == first and document["new"]["id"] == last


def test_diff_formats(nights: Nights) -> None:
    _two_nights(nights)
    code, console, _ = nights.command("diff")
    assert code == 1
    assert console.index("Newly failing (1)") < console.index("Still failing (1)")
    assert "✗ regress The regress case (passed → failed)" in console
    assert 'agent then: "right answer"' in console and 'agent now: "wrong answer"' in console
    assert "Flaky (1)" in console
    _, markdown, _ = nights.command("diff", "--format", "markdown")
    assert markdown.startswith("### agenttest: ")
    assert "1 newly failing" in markdown
    assert "- **regress** — The regress case (passed → failed)" in markdown
    _, junit, _ = nights.command("diff", "--format", "junit")
    xmlschema.XMLSchema(str(XSD)).validate(junit)
    cases = {t.get("name"): t for t in ET.fromstring(junit.encode()).iter("testcase")}
    assert cases["regress"].find("failure") is not None
    assert cases["broken"].find("skipped") is not None  # a known failure
    assert cases["flaky"].find("failure") is None
    assert cases["steady"].find("failure") is None and cases["steady"].find("skipped") is None


def test_baseline_and_fail_on_regressions_gate_only_new_failures(nights: Nights) -> None:
    nights.run({"steady", "regress"}, ["steady", "regress", "broken"])
    # A known failure ("broken") does not fail the job; the diff follows the report.
    code, out, _ = nights.run(
        {"steady", "regress"}, ["steady", "regress", "broken"], "--fail-on", "regressions"
    )
    assert code == 0, out
    assert "Diff of run" in out and "Still failing (1)" in out
    # Without --fail-on regressions the same run exits 1, as always.
    code, out, _ = nights.run(
        {"steady", "regress"}, ["steady", "regress", "broken"], "--baseline", "suite"
    )
    assert code == 1 and "Diff of run" in out
    # A new failure does.
    code, out, _ = nights.run(
        {"steady"}, ["steady", "regress", "broken"], "--fail-on", "regressions"
    )
    assert code == 1
    assert "Newly failing (1)" in out and "regress" in out
    # --baseline RUN names the run to compare with.
    runs = json.loads(nights.command("runs", "--format", "json")[1])
    code, out, _ = nights.run(
        {"steady", "regress"},
        ["steady", "regress", "broken"],
        "--baseline",
        runs[-1]["run_id"],
        "--fail-on",
        "regressions",
    )
    assert code == 0 and f"against {runs[-1]['run_id']}" in out
    if nights.place.fleet is not None:
        # With --no-wait there is no report yet to compare: it says so, and how to later.
        code, _, err = nights.run({"steady"}, ["steady"], "--no-wait", "--fail-on", "regressions")
        assert code == 0 and "with --no-wait nothing is compared" in err
        assert "agenttest-submit diff " in err


def test_history_of_a_case_and_the_runs_of_a_suite(nights: Nights) -> None:
    ids = ["steady", "flaky"]
    for right in ({"steady", "flaky"}, {"steady"}, {"steady", "flaky"}, {"steady"}):
        nights.run(right, ids)
    # (A fleet's database holds other tests' runs too: this suite's are asked for.)
    suite = nights.suite()
    nights.run({"steady"}, ids, "--suite", "elsewhere")
    code, out, _ = nights.command("history", "flaky", "--suite", suite, "--format", "json")
    assert code == 0
    document = json.loads(out)
    assert [r["status"] for r in document["runs"]] == ["failed", "passed", "failed", "passed"]
    assert document["changes"] == 3 and document["flake_rate"] == 1.0
    failed = document["runs"][0]
    assert failed["reason"] and "right" in failed["reason"]
    assert failed["duration_ms"] >= 0 and failed["run_id"]
    # Every suite's runs, without --suite.
    every = json.loads(nights.command("history", "flaky", "--format", "json")[1])
    assert every["runs"][0]["suite"] == "elsewhere"
    # In one suite only, and the last N runs.
    runs = json.loads(nights.command("runs", "--format", "json")[1])
    assert runs[0]["suite"] == "elsewhere" and runs[1]["suite"] == suite
    scoped = json.loads(
        nights.command("history", "flaky", "--suite", suite, "--last", "3", "--format", "json")[1]
    )
    assert [r["status"] for r in scoped["runs"]] == ["failed", "passed", "failed"]
    code, out, _ = nights.command("history", "flaky", "--suite", suite)
    assert code == 0 and "flake rate" in out and "FAILED" in out
    listed = json.loads(nights.command("runs", "--suite", suite, "--format", "json")[1])
    assert len(listed) == 4 and all(r["suite"] == suite for r in listed)
    assert [(r["passed"], r["failed"]) for r in listed] == [(1, 1), (2, 0), (1, 1), (2, 0)]
    _, table, _ = nights.command("runs", "--last", "2")
    assert len(table.strip().splitlines()) == 3  # a header and two runs
    # status names the suite.
    _, status, _ = nights.command("status", "last")
    assert "suite     elsewhere" in status


def test_the_derived_suite_is_stable_and_follows_the_target(
    nights: Nights, agent: ScriptedAgent
) -> None:
    nights.run({"steady"}, ["steady"])
    nights.run({"steady"}, ["steady"])
    runs = json.loads(nights.command("runs", "--format", "json")[1])
    assert runs[0]["suite"] == runs[1]["suite"]
    assert runs[0]["suite"] == f"bot: {nights.cases.name}"
    # Another target is another suite.
    entry = agent.entry("bot", max_retries=0)
    nights.config.write_text(
        json.dumps({"agents": {"bot": entry, "bot2": entry}}), encoding="utf-8"
    )
    args = nights.args()
    args[args.index("bot")] = "bot2"
    nights.place.submit(args)
    runs = json.loads(nights.command("runs", "--format", "json")[1])
    assert runs[0]["suite"] != runs[1]["suite"]


def test_flaky_repetitions_are_flaky_not_regressions(nights: Nights, agent: ScriptedAgent) -> None:
    nights.run({"coin"}, ["coin"])
    answers = iter(["right answer", "wrong answer"] * 3)
    nights.cases.write_text(json.dumps(_case("coin")) + "\n", encoding="utf-8")
    agent.script("bot", lambda body: next(answers))
    code, out, _ = nights.place.submit(
        nights.args("--repeat", "4", "--parallel", "1", "--fail-on", "regressions")
    )
    assert code == 0, out  # its repetitions disagree: flaky, listed, not a regression
    assert "Flaky (1)" in out and "repetitions disagree: 2/4 passed" in out


def test_history_commands_refuse_what_they_cannot_find(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["history", "nothing"]) == 2
    assert "no finished run played case 'nothing'" in capsys.readouterr().err
    assert main(["diff"]) == 2
    assert "no runs yet" in capsys.readouterr().err
    assert main(["runs"]) == 0
    assert "no runs yet" in capsys.readouterr().out
    assert main(["diff", "a", "b", "c"]) == 2


def test_the_derived_suite_is_one_however_the_path_is_spelled(
    nights: Nights, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The submitter's working directory holds agenttest.yaml (found there, no --config).
    fleet = nights.place.fleet
    base = fleet.workdir if fleet is not None else nights.tmp_path
    monkeypatch.chdir(base)
    (base / "agenttest.yaml").write_text(nights.config.read_text(), encoding="utf-8")
    (base / "t").mkdir()
    cases = base / "t" / "x.jsonl"
    cases.write_text(json.dumps(_case("steady")) + "\n", encoding="utf-8")
    nights.agent.script("bot", by_last_user({"question steady": "right answer"}))
    config = ["-n", "bot"]
    # The first run has no baseline: --fail-on regressions says so, and its code stands.
    code, _, err = nights.place.submit(["-i", "t/x.jsonl", *config, "--fail-on", "regressions"])
    assert code == 0
    assert "--fail-on regressions: no baseline to compare with" in err
    for spelled in ("./t/x.jsonl", str(cases)):
        code, out, err = nights.place.submit(["-i", spelled, *config, "--fail-on", "regressions"])
        assert code == 0 and "Diff of run" in out, err
        assert "no baseline" not in err
    runs = json.loads(nights.command("runs", "--last", "3", "--format", "json")[1])
    assert {r["suite"] for r in runs} == {"bot: t/x.jsonl"}


def test_a_case_whose_definition_changed_is_changed_not_a_regression(nights: Nights) -> None:
    nights.run({"steady", "edited"}, ["steady", "edited"])
    # "edited" gains an assertion before its old one, and fails it: a new definition.
    edited = _case("edited")
    edited["assertions"] = [{"type": "contains", "value": "zzz"}, *edited["assertions"]]
    lines = [json.dumps(_case("steady")), json.dumps(edited)]
    nights.cases.write_text("\n".join(lines) + "\n", encoding="utf-8")
    nights.agent.script(
        "bot", by_last_user({"question steady": "right", "question edited": "right"})
    )
    code, out, _ = nights.place.submit(nights.args())
    assert code == 1, out
    code, out, _ = nights.command("diff", "--format", "json")
    document = json.loads(out)
    assert code == 0  # nothing that was the same case regressed
    change = next(c for c in document["cases"] if c["id"] == "edited")
    assert change["category"] == "changed"
    assert change["changed_because"] == "its definition changed since the baseline"
    # Matched by hash, not by position: the failing assertion is the new one.
    assert change["difference"]["new_assertion"] is True
    assert '"zzz"' in change["difference"]["assertion"]
    _, console, _ = nights.command("diff")
    assert "Changed (1)" in console and "is new or changed, and fails" in console
    suite = nights.suite()
    history = json.loads(
        nights.command("history", "edited", "--suite", suite, "--format", "json")[1]
    )
    assert [r["changed"] for r in history["runs"]] == [True, False]
    assert history["changes"] == 0 and history["flake_rate"] == 0.0


def test_one_regression_is_not_flakiness(nights: Nights) -> None:
    for right in ({"steady"}, {"steady"}, set()):
        nights.run(right, ["steady"])
    suite = nights.suite()
    _, out, _ = nights.command("history", "steady", "--suite", suite, "--format", "json")
    document = json.loads(out)
    assert [r["status"] for r in document["runs"]] == ["failed", "passed", "passed"]
    assert document["changes"] == 1 and document["flips"] == 0
    assert document["flake_rate"] == 0.0
    _, text, _ = nights.command("history", "steady", "--suite", suite)
    assert "3 runs, flake rate 0% (0 flips in 1 window of three runs; 1 change)" in text


def test_fail_on_new_gates_new_failing_cases(nights: Nights) -> None:
    nights.run({"steady"}, ["steady"])
    # Its id now, while it is the newest: the session's database holds other tests' runs.
    first = _run_id(nights)
    ids = ["steady", "added"]
    # Today's gate: regressions alone lets a new failing case through, and says so.
    code, out, err = nights.run({"steady"}, ids, "--fail-on", "regressions")
    assert code == 0, out
    assert "note: 1 new or changed case fails and does not fail the job" in err
    code, out, err = nights.run(
        {"steady"}, ids, "--baseline", first, "--fail-on", "regressions,new"
    )
    assert code == 1, out
    assert "New (1)" in out and "+ added" in out
    code, _, err = nights.run({"steady"}, ["steady"], "--fail-on", "regressions,sometimes")
    assert code == 2 and "give any, or one or more of regressions, new" in err


def test_a_stopped_run_fails_the_gate(nights: Nights) -> None:
    ids = ["broken", "steady"]
    nights.run({"steady"}, ids)
    # --fail-fast stops the run at "broken" (a known failure): "steady" is not run, and
    # a run that did not test every case does not pass the gate.
    code, out, err = nights.run(
        {"steady"}, ids, "--fail-fast", "--parallel", "1", "--fail-on", "regressions,new"
    )
    assert code == 1, out
    assert "the run stopped before every case was tested (1 not run: --fail-fast" in err
    _, junit, _ = nights.command("report", "last", "--format", "junit")
    cases = {t.get("name"): t for t in ET.fromstring(junit.encode()).iter("testcase")}
    error = cases["[steady] The steady case"].find("error")
    assert error is not None and error.get("type") == "not_run"
    xmlschema.XMLSchema(str(XSD)).validate(junit)


def _run_id(nights: Nights) -> str:
    return str(
        json.loads(nights.command("runs", "--last", "1", "--format", "json")[1])[0]["run_id"]
    )


def test_a_failing_run_is_never_the_baseline_of_its_retry(nights: Nights) -> None:
    ids = ["steady", "regress"]
    gate = ("--suite", "pr-checks", "--fail-on", "regressions,new")
    code, out, _ = nights.run({"steady", "regress"}, ids, *gate)
    assert code == 0, out
    passed = _run_id(nights)
    code, out, _ = nights.run({"steady"}, ids, *gate)
    assert code == 1 and "Newly failing (1)" in out
    # The job re-run: compared with the run that passed its gate, not with the failure.
    code, out, _ = nights.run({"steady"}, ids, *gate)
    assert code == 1, out
    assert f"against {passed}" in out and "Newly failing (1)" in out


def test_the_baseline_is_the_one_the_team_chose(nights: Nights) -> None:
    ids = ["steady", "regress"]
    nights.run({"steady", "regress"}, ids, "--suite", "main")
    chosen = _run_id(nights)
    code, out, _ = nights.command("promote", chosen)
    assert code == 0 and f"run {chosen} is the baseline of suite main" in out
    # A later run of main fails "regress"; the promoted run stays main's baseline.
    nights.run({"steady"}, ids, "--suite", "main")
    # Two pull requests at once, each in its suite, both compared with main's baseline.
    other = ("--baseline", "suite:main", "--fail-on", "regressions,new")
    code, out, _ = nights.run({"steady", "regress"}, ids, "--suite", "pr-b", *other)
    assert code == 0 and f"against {chosen}" in out
    code, out, _ = nights.run({"steady"}, ids, "--suite", "pr-a", *other)
    assert code == 1 and f"against {chosen}" in out and "Newly failing (1)" in out
    # `--baseline suite` prefers the promoted run too.
    code, out, _ = nights.run({"steady"}, ids, "--suite", "main", "--fail-on", "regressions")
    assert code == 1 and f"against {chosen}" in out
    code, _, err = nights.command("promote", "no-such-run")
    assert code == 2 and "no run 'no-such-run'" in err
    code, _, err = nights.run({"steady"}, ids, "--baseline", "suite:nowhere", "--fail-on", "new")
    assert "no baseline to compare with" in err and "suite 'nowhere' has no promoted run" in err


def test_diff_junit_counts_each_case_once_with_time_file_and_line(nights: Nights) -> None:
    _two_nights(nights)
    code, junit, _ = nights.command("diff", "--format", "junit")
    assert code == 1
    xmlschema.XMLSchema(str(XSD)).validate(junit)
    suite = ET.fromstring(junit.encode()).find("testsuite")
    assert suite is not None
    cases = {t.get("name"): t for t in suite.iter("testcase")}
    outcomes = {
        name: next((child.tag for child in case if child.tag in ("failure", "skipped")), None)
        for name, case in cases.items()
    }
    # regress fails; broken (known) and flaky are skipped; nothing counted twice.
    assert outcomes == {
        "steady": None,
        "regress": "failure",
        "fixed": None,
        "broken": "skipped",
        "flaky": "skipped",
        "added": None,
    }
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("6", "1", "2")
    for line, case_id in enumerate(["steady", "regress", "fixed", "broken", "flaky", "added"], 1):
        case = cases[case_id]
        assert case.get("file") == str(nights.cases) and case.get("line") == str(line)
        assert float(case.get("time") or "-1") >= 0


def test_repeated_runs_count_one_way_everywhere(nights: Nights) -> None:
    from agenttest_submit.commands.viewer.queries import runs_page
    from agenttest_worker.settings import get_settings

    _, out, _ = nights.run({"steady", "other"}, ["steady", "other"], "--repeat", "2")
    assert "ℹ Input: " in out and "(2 test cases × 2)" in out
    _, table, _ = nights.command("runs", "--last", "1")
    assert "    2×2  " in table.splitlines()[1]
    _, status, _ = nights.command("status", "last")
    assert "cases     2×2: 4/4 conversations finished: 4 passed, 0 failed, 0 skipped" in status
    fleet = nights.place.fleet
    url = fleet.database_url if fleet is not None else get_settings().effective_database_url()
    newest = runs_page(url)["groups"][0]["runs"][0]
    assert (newest["cases"], newest["unit"]) == ("2×2", "conversations")
    # Once, and for one case: the singular.
    _, out, _ = nights.run({"steady"}, ["steady"])
    assert "(1 test case)" in out
    _, table, _ = nights.command("runs", "--last", "1")
    assert "      1  " in table.splitlines()[1]
