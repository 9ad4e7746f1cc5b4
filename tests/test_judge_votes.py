"""Judge votes and panels: an agent assertion asks its judge `votes` times, or a panel of
judges (`use: [...]`) each `votes` times, all at once, and decides by the majority; a
tie fails unless `tie: pass`; `min_agreement` fails a split panel ("judges disagree");
`min_score` needs the mean score. The record keeps every vote and the agreement.

Through the real CLI, embedded and (marked `fleet`) on a one-worker fleet, against
judges over real HTTP that disagree with themselves and with each other as each case's
criteria script them (`FickleJudges` in agent_servers.py): `a=pass:0.9,fail:0.2` is
judge `a` voting pass (score 0.9), then fail (0.2), and round again.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from agent_servers import AgentServer, FickleJudges
from fleet import Fleet, fleet_on

from agenttest_submit.cli.main import main
from agenttest_worker.demo._protocol import metadata_of
from agenttest_worker.report.judges import (
    JudgeAgreement,
    judge_agreement,
    judges_json,
    judges_line,
    voted_verdict,
)
from agenttest_worker.results import AssertionResult, CaseResult, JudgeVote

PATH = "/v1/chat/completions"
A = "agents:a"
PLACES = ["embedded", pytest.param("fleet", marks=pytest.mark.fleet)]


class Project:
    """Judges `a`, `b` and the target `bot` on one server, an agenttest.yaml naming them,
    and submissions run embedded (in this process) or on a one-worker fleet."""

    def __init__(self, tmp_path: Path, server: AgentServer, judges: FickleJudges) -> None:
        self.tmp_path, self.server, self.judges = tmp_path, server, judges
        self.fleet: Fleet | None = None
        self.capsys: pytest.CaptureFixture[str] | None = None
        self.configure()

    def entry(self, model: str, **settings: Any) -> dict[str, Any]:
        return {"base_url": self.server.url("/v1"), "model": model, "max_retries": 0, **settings}

    def configure(self, defaults: dict[str, Any] | None = None, **agents: Any) -> Path:
        entries = {name: self.entry(name) for name in ("bot", "a", "b")}
        entries.update({name: self.entry(name, **s) for name, s in agents.items()})
        config = {"agents": entries, "defaults": {"judge": "a", **(defaults or {})}}
        path = self.tmp_path / "agenttest.yaml"
        path.write_text(json.dumps(config), encoding="utf-8")
        return path

    def submit(self, *args: str) -> tuple[int, str, str]:
        argv = ["--config", str(self.tmp_path / "agenttest.yaml"), *args]
        if self.fleet is not None:
            done = self.fleet.submit(argv)
            return done.returncode, done.stdout, done.stderr
        assert self.capsys is not None
        self.capsys.readouterr()
        code = main(argv)
        out, err = self.capsys.readouterr()
        return code, out, err

    def run(self, cases: list[dict[str, Any]] | str, *args: str) -> dict[str, dict[str, Any]]:
        """Run these cases (JSONL ones, or the text of a YAML file) against `bot`: the
        records by case id."""
        if isinstance(cases, str):
            source = self.tmp_path / "tests.yml"
            source.write_text(cases, encoding="utf-8")
        else:
            source = self.tmp_path / "cases.jsonl"
            source.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
        out = self.tmp_path / "out.jsonl"
        code, stdout, err = self.submit("-i", str(source), "-n", "bot", "-o", str(out), *args)
        assert code in (0, 1), f"exit {code}:\n{stdout}\n{err}"
        return {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}


@pytest.fixture
def judges() -> FickleJudges:
    return FickleJudges()


@pytest.fixture
def server(judges: FickleJudges) -> Iterator[AgentServer]:
    with AgentServer() as served:
        served.respond(PATH, judges)
        yield served


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


@pytest.fixture
def project(
    server: AgentServer,
    judges: FickleJudges,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Project:
    monkeypatch.chdir(tmp_path)
    made = Project(tmp_path, server, judges)
    made.capsys = capsys
    return made


@pytest.fixture(params=PLACES)
def place(request: pytest.FixtureRequest, project: Project) -> Project:
    if request.param == "fleet":
        project.fleet = request.getfixturevalue("fleet")
        project.fleet.start("judges", concurrency=4)
    return project


def judged(case_id: str, criteria: str, **assertion: Any) -> dict[str, Any]:
    """A one-turn case whose one agent assertion gives the judges `criteria`."""
    check = {"type": "agent", "options": {"metadata": {"criteria": criteria}}, **assertion}
    return {"id": case_id, "input": f"Hello [{case_id}]", "assertions": [check]}


def verdict(record: dict[str, Any], turn: int = 0, index: int = 0) -> dict[str, Any]:
    result: dict[str, Any] = record["turns"][turn]["assertions"][index]
    return result


def voted(result: dict[str, Any]) -> list[tuple[str, bool, float | None]]:
    return sorted((v["judge"], v["passed"], v.get("score")) for v in result["votes"])


# -- votes, ties, panels (embedded and on a fleet) -------------------------------------------


def test_votes_and_panels_decide_by_the_majority(place: Project) -> None:
    records = place.run(
        [
            judged("majority", "a=pass:0.9,fail:0.3,pass:0.6", votes=3),
            judged("tie", "a=pass:1,fail:0", votes=2),
            judged("tie-passes", "a=pass:1,fail:0", votes=2, tie="pass"),
            judged("panel", "a=pass,pass b=fail,error,pass", use=["a", "agents:b"], votes=3),
            judged("down", "a=error", votes=3),
            judged("once", "a=pass:0.7"),
        ]
    )
    majority = verdict(records["majority"])
    assert majority["passed"] is True
    assert majority["reason"] == "a says pass (2 of 3 votes)"
    assert voted(majority) == [(A, False, 0.3), (A, True, 0.6), (A, True, 0.9)]
    assert majority["agreement"] == pytest.approx(2 / 3)
    assert majority["score"] == pytest.approx(0.6), "the mean of the votes' scores"
    assert records["majority"]["status"] == "passed"

    tie = verdict(records["tie"])
    assert (tie["passed"], tie["agreement"]) == (False, 0.5)
    assert tie["reason"] == "a says fail (a tie, 1 of 2 votes; tie: fail)"
    passes = verdict(records["tie-passes"])
    assert (passes["passed"], passes["agreement"]) == (True, 0.5)
    assert passes["reason"] == "a says pass (a tie, 1 of 2 votes; tie: pass)"

    # Six votes: a's three passes, b's fail, b's failed call (a failing vote), b's pass.
    panel = verdict(records["panel"])
    assert panel["passed"] is True and panel["agreement"] == pytest.approx(4 / 6)
    assert [v["judge"] for v in panel["votes"]] == ["agents:a"] * 3 + ["agents:b"] * 3
    errors = [v for v in panel["votes"] if v.get("error")]
    assert len(errors) == 1 and errors[0]["passed"] is False and "HTTP 500" in errors[0]["error"]
    assert panel["reason"] == "a says pass (4 of 6 votes)"
    assert panel["use"] == ["agents:a", "agents:b"]

    # Every call failed: the assertion errors, as one failed judge call does.
    down = verdict(records["down"])
    assert down["passed"] is False and "HTTP 500" in down["error"]
    assert down["reason"].startswith("judge a failed: ")
    assert down["reason"].endswith("(all 3 judge calls failed)")
    assert all(v["error"] for v in down["votes"]) and len(down["votes"]) == 3

    # Asked once: the record is what it always was.
    once = verdict(records["once"])
    assert (once["passed"], once["score"], once["reason"]) == (True, 0.7, "a says pass")
    assert "votes" not in once and "agreement" not in once

    # N votes are N calls, each in the turn's call log with its tokens.
    assert place.judges.asked == {"a": 3 + 2 + 2 + 3 + 3 + 1, "b": 3}
    calls = records["panel"]["turns"][0]["calls"]
    assert [c["role"] for c in calls].count("validator") == 6
    # The target's call and the five answered votes (the failed call used nothing).
    assert records["panel"]["turns"][0]["usage"]["total_tokens"] == 15 * 6


def test_min_agreement_and_min_score(place: Project) -> None:
    records = place.run(
        [
            judged("split", "a=pass,pass,fail", votes=3, min_agreement=0.8),
            judged("enough", "a=pass,pass,fail", votes=3, min_agreement=2 / 3),
            judged("mean-reaches", "a=pass:0.9,pass:0.7,pass:0.8", votes=3, min_score=0.8),
            judged("mean-misses", "a=pass:0.9,pass:0.3,fail:0.6", votes=3, min_score=0.8),
            judged("unscored-vote", "a=pass:0.9,pass", votes=2, min_score=0.5),
            judged("once-low", "a=pass:0.7", min_score=0.8),
            judged("once-unscored", "a=pass", min_score=0.8),
            judged("once-high", "a=pass:0.8", min_score=0.8),
        ]
    )
    split = verdict(records["split"])
    assert split["passed"] is False
    assert split["reason"].startswith(
        "judges disagree: 2 of 3 votes (67%) agree that it passed, below min_agreement 80%"
    )
    assert split["agreement"] == pytest.approx(2 / 3) and len(split["votes"]) == 3
    assert verdict(records["enough"])["passed"] is True

    reaches = verdict(records["mean-reaches"])
    assert reaches["passed"] is True, reaches["reason"]
    assert reaches["score"] == 0.8  # (0.9 + 0.7 + 0.8) / 3, which floats make 0.7999…
    misses = verdict(records["mean-misses"])
    assert misses["passed"] is False and misses["score"] == pytest.approx(0.6)
    assert misses["reason"].startswith("score 0.6, the mean of 3 votes, below min_score 0.8")
    unscored = verdict(records["unscored-vote"])
    assert unscored["passed"] is False
    assert unscored["reason"].startswith("judge agents:a gave no score")

    low = verdict(records["once-low"])
    assert low["passed"] is False and low["score"] == 0.7 and "votes" not in low
    assert low["reason"] == "score 0.7, below min_score 0.8: a says pass"
    once = verdict(records["once-unscored"])
    assert once["passed"] is False and once["reason"].startswith("judge agents:a gave no score")
    assert verdict(records["once-high"])["passed"] is True


def test_yaml_criteria_take_votes_from_the_test_and_the_round(place: Project) -> None:
    records = place.run(
        """\
tests:
  - name: flat
    user_input: Hello
    criteria: Greets. a=pass:1,fail:0,fail:0
    votes: 3
  - name: rounds
    votes: 2
    tie: pass
    rounds:
      - user_input: Hello
        criteria: Greets. a=pass:1,fail:0
      - user_input: And?
        criteria: Helps. a=pass:0.9,fail:0.1,pass:0.4
        votes: 3
        min_score: 0.5
"""
    )
    flat = verdict(records["flat"])
    assert flat["passed"] is False and flat["reason"] == "a says fail (2 of 3 votes)"
    assert flat["conversation"] is True and len(flat["votes"]) == 3
    first, second = verdict(records["rounds"], 0), verdict(records["rounds"], 1)
    assert (first["passed"], len(first["votes"]), first["tie"]) == (True, 2, "pass")
    assert (len(second["votes"]), second["min_score"]) == (3, 0.5), "the round's own votes"
    # The majority passed, but the mean score (0.47) is below the round's min_score.
    assert second["passed"] is False and second["score"] == pytest.approx(1.4 / 3)
    assert second["reason"].startswith("score 0.466667, the mean of 3 votes, below min_score")
    assert place.judges.asked == {"a": 3 + 2 + 3}


# -- defaults, budgets, rate limits, checks (embedded) ----------------------------------------


def test_defaults_judge_votes_asks_each_judge_that_often(project: Project) -> None:
    project.configure(defaults={"judge_votes": 3})
    records = project.run(
        [
            judged("default", "a=pass,fail,pass"),
            judged("panel", "a=pass b=fail", use=["a", "b"]),
            judged("once", "a=fail", votes=1),
        ]
    )
    assert len(verdict(records["default"])["votes"]) == 3
    assert verdict(records["default"])["passed"] is True
    panel = verdict(records["panel"])
    assert (len(panel["votes"]), panel["passed"]) == (6, False), "a tie: 3 passes, 3 fails"
    once = verdict(records["once"])
    assert "votes" not in once and once["passed"] is False
    assert project.judges.asked == {"a": 3 + 3 + 1, "b": 3}


def test_every_vote_counts_against_the_token_budget(project: Project) -> None:
    """Each call is 15 tokens. With three votes the first case spends 60 of a 50-token
    budget, and the second is not run; asked once, it spends 30, and both run."""
    cases = [judged("first", "a=pass", votes=3), judged("second", "a=pass", votes=3)]
    budget = ("--max-tokens", "50", "--parallel", "1")
    records = project.run(cases, *budget)
    assert records["first"]["status"] == "passed"
    assert records["second"]["status"] == "skipped"
    assert "token budget (50) was spent (60 used)" in records["second"]["skip_reason"]
    once = [judged(f"{n}-1", "a=pass", votes=1) for n in ("first", "second")]
    records = project.run(once, *budget)
    assert [r["status"] for r in records.values()] == ["passed", "passed"]


def test_votes_are_asked_at_once_within_the_judges_rate_limit(project: Project) -> None:
    project.judges.delay = 0.1
    project.run([judged("free", "a=pass", votes=3)])
    project.configure(a={"rate_limit": {"concurrency": 1}})
    project.run([judged("limited", "a=pass", votes=3)])
    arrivals: dict[str, list[float]] = {}
    for request in project.server.requests(PATH):
        body = request.json
        if metadata_of(body).get("test_mode") == "validator":
            arrivals.setdefault(metadata_of(body)["test_id"], []).append(request.at)
    free, limited = arrivals["free"], arrivals["limited"]
    assert max(free) - min(free) < 0.05, "three asks at once"
    gaps = [b - a for a, b in itertools.pairwise(limited)]
    assert len(gaps) == 2 and min(gaps) >= 0.09, f"one ask at a time: {gaps}"


@pytest.mark.parametrize(
    ("assertion", "message"),
    [
        ({"votes": 0}, "greater than or equal to 1"),
        ({"tie": "maybe"}, "'fail' or 'pass'"),
        ({"min_agreement": 1.5}, "less than or equal to 1"),
        ({"use": []}, "a panel of judges names at least one agent"),
        ({"use": ["a", "agents:a"]}, "agents:a is in the panel twice"),
        ({"use": ["a", "nobody"]}, "nobody"),
        ({"use": ["a", "scripts:x"]}, "an agent assertion uses agents:NAME"),
    ],
)
def test_mistakes_are_input_errors(
    project: Project, assertion: dict[str, Any], message: str
) -> None:
    path = project.tmp_path / "bad.jsonl"
    path.write_text(json.dumps(judged("bad", "x", **assertion)) + "\n", encoding="utf-8")
    code, _, err = project.submit("-i", str(path), "-n", "bot", "--dry-run")
    assert code == 2, err
    assert message in err and "assertions" in err, err
    assert not project.judges.asked


def test_yaml_judging_fields_need_criteria(project: Project) -> None:
    path = project.tmp_path / "bad.yml"
    path.write_text(
        "tests:\n  - name: t\n    rounds:\n      - user_input: hi\n        votes: 3\n",
        encoding="utf-8",
    )
    code, _, err = project.submit("-i", str(path), "-n", "bot", "--dry-run")
    assert code == 2 and "`votes` says how `criteria` are judged" in err, err


def test_the_schemas_take_the_new_fields(project: Project) -> None:
    import jsonschema

    from agenttest_submit.commands.schema import schema_text

    cases = jsonschema.Draft7Validator(json.loads(schema_text("cases")))
    good = judged("ok", "x", use=["a", "b"], votes=3, tie="pass", min_agreement=0.6)
    assert not list(cases.iter_errors({**good, "assertions": [*good["assertions"]]}))
    assert list(cases.iter_errors(judged("bad", "x", votes=0)))
    assert list(cases.iter_errors(judged("bad", "x", tie="maybe")))
    tests = yaml.safe_load(
        "tests:\n  - name: t\n    votes: 3\n    rounds:\n      - user_input: hi\n"
        "        criteria: c\n        min_score: 0.8\n        tie: pass\n"
    )
    assert not list(jsonschema.Draft7Validator(json.loads(schema_text("yaml"))).iter_errors(tests))


# -- re-judging a stored run ------------------------------------------------------------------


def test_reeval_asks_every_vote_again(place: Project) -> None:
    case = judged("stored", "a=pass,fail,pass", votes=3)
    case["final_assertions"] = [
        {
            "type": "agent",
            "votes": 3,
            "options": {"metadata": {"criteria": "final a=pass:1,pass:1,fail:0"}},
        }
    ]
    first = place.run([case])["stored"]
    assert len(verdict(first)["votes"]) == 3 and len(first["final_assertions"][0]["votes"]) == 3
    code, out, err = place.submit("--reeval", "last", "-o", str(place.tmp_path / "again.jsonl"))
    assert code == 0, f"{out}\n{err}"
    again = json.loads((place.tmp_path / "again.jsonl").read_text())
    assert place.judges.targeted == 1, "the target is not called again"
    assert place.judges.asked == {"a": 12}
    judged_again = verdict(again)
    assert (judged_again["passed"], len(judged_again["votes"])) == (True, 3)
    final = again["final_assertions"][0]
    assert (final["passed"], final["score"]) == (True, pytest.approx(2 / 3))
    # Every re-judging call is in the call log, the final judges' with the last turn.
    calls = again["turns"][0]["calls"]
    assert [c["role"] for c in calls] == ["target"] + ["validator"] * 6

    # The file now asks for five votes: re-judged with five.
    source = place.tmp_path / "cases.jsonl"
    source.write_text(json.dumps(judged("stored", "a=pass,fail,pass", votes=5)) + "\n")
    out_path = place.tmp_path / "five.jsonl"
    code, out, err = place.submit("--reeval", "-i", str(source), "-n", "bot", "-o", str(out_path))
    assert code == 0, f"{out}\n{err}"
    five = verdict(json.loads(out_path.read_text()))
    assert len(five["votes"]) == 5 and five["reason"].endswith("(3 of 5 votes)")
    assert place.judges.targeted == 1


# -- each judge's agreement over a run (report/judges.py) -------------------------------------


def test_each_judges_agreement_with_its_panels(project: Project) -> None:
    project.run(
        [
            judged("panel", "a=pass,pass,pass b=fail,error,pass", use=["a", "b"], votes=3),
            judged("tie", "a=pass b=fail", use=["a", "b"], tie="pass"),
            judged(
                "low-score",
                "a=pass:0.2,pass:0.2 b=pass:0.2",
                use=["a", "b"],
                votes=2,
                min_score=0.9,
            ),
            judged("once", "b=fail", use="b"),
        ]
    )
    lines = (project.tmp_path / "out.jsonl").read_text().splitlines()
    records = (CaseResult.model_validate_json(line) for line in lines)  # read once
    agreement = judge_agreement(records)
    # a: 3 + 1 + 2 votes, all with the verdict (the tie passed under `tie: pass`; the
    # low score failed the assertion, not the votes' verdict). b: its fail and failed
    # call of the panel and its tie vote did not agree; its passes did.
    assert agreement == {
        "agents:a": JudgeAgreement("agents:a", votes=6, agreeing=6, errors=0),
        "agents:b": JudgeAgreement("agents:b", votes=6, agreeing=3, errors=1),
    }
    assert agreement["agents:b"].rate == 0.5
    assert judges_line(agreement) == (
        "Judges: agents:a 100% agreement (6/6 votes), agents:b 50% (3/6, 1 failed)"
    )
    assert judges_json(agreement) == {
        "agents:a": {"votes": 6, "agreeing": 6, "errors": 0, "agreement": 1.0},
        "agents:b": {"votes": 6, "agreeing": 3, "errors": 1, "agreement": 0.5},
    }
    assert judges_line(judge_agreement([])) is None and judges_json({}) == {}


def test_a_tie_counts_by_the_assertions_own_tie_rule() -> None:
    def case(tie: str | None) -> CaseResult:
        votes = [
            JudgeVote(judge="agents:a", passed=True),
            JudgeVote(judge="agents:b", passed=False),
        ]
        extra = {"tie": tie} if tie else {}
        result = AssertionResult.model_validate(
            {"type": "agent", "passed": tie == "pass", "votes": votes, "agreement": 0.5, **extra}
        )
        return CaseResult(id=f"t-{tie}", status="passed", final_assertions=[result])

    assert voted_verdict(case("pass").final_assertions[0]) is True
    assert voted_verdict(case(None).final_assertions[0]) is False
    agreement = judge_agreement([case("pass"), case(None)])
    assert [(j.agreeing, j.votes) for j in agreement.values()] == [(1, 2), (1, 2)]


def test_summaries_show_each_judges_agreement_with_the_panel(place: Project) -> None:
    cases = [
        judged("panel", "a=pass,pass b=fail,pass", use=["a", "b"], votes=2),
        judged("split", "a=pass:0.9,fail:0.1,fail:0.2", votes=3),
    ]
    records = place.run(cases)
    expected = judges_json(judge_agreement(CaseResult.model_validate(r) for r in records.values()))
    assert set(expected) == {"agents:a", "agents:b"}
    source = place.tmp_path / "cases.jsonl"
    _, out, _ = place.submit("-i", str(source), "-n", "bot", "--format", "json")
    document = json.loads(out)
    assert document["summary"]["judges"] == judges_json(
        judge_agreement(CaseResult.model_validate(r) for r in document["results"])
    )
    _, console, _ = place.submit("-i", str(source), "-n", "bot")
    line = next(line for line in console.splitlines() if line.strip().startswith("Judges:"))
    assert "agents:a" in line and "agents:b" in line and "agreement" in line
    # A failed split assertion lists every vote under its reason.
    assert "agents:a: pass 0.9" in console and "agents:a: fail 0.1" in console
