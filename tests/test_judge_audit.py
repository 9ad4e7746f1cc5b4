"""Judge audit and human labels: `audit-judges RUN [--times N]` asks every judge of a
stored run again on the same transcripts (no target call, no reply cache) and reports
flip rates, agreement and the unstable criteria with the transcripts that flip;
`label RUN CASE TURN pass|fail` and the viewer's POST keep people's verdicts, which the
audit compares each judge with (raw agreement, Cohen's kappa).

Against judges with known behaviour over real HTTP: `flaky`, a scripted judge that
answers each transcript pass, fail, pass, ... in turn (c2's starting with fail), so
every one of its verdicts flips when asked again; and the demo validator, which checks
the criteria's quoted phrases and never changes its mind. Embedded here, and (marked
`fleet`) auditing a run a fleet played, on its Postgres store.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fleet import Fleet, fleet_on
from scripted_agent import Body, Reply, ScriptedAgent, judge_verdict
from test_viewer import Viewer

from agenttest_submit.cli.main import main
from agenttest_worker.report import Judged, Label, Spot, audit, cohen_kappa
from agenttest_worker.settings import get_settings
from agenttest_worker.store import judge_labels, unstable_criteria

FLAKY = "agent: is polite"
STABLE = 'agent: Must mention "answer"'
CASES = ("c1", "c2", "c3")


# -- the statistics, on hand-worked examples ----------------------------------------------


def _pairs(tt: int, tf: int, ft: int, ff: int) -> list[tuple[bool, bool]]:
    return [(True, True)] * tt + [(True, False)] * tf + [(False, True)] * ft + [(False, False)] * ff


def test_cohen_kappa_on_hand_worked_tables() -> None:
    # 50 items: both pass 20, A pass B fail 5, A fail B pass 10, both fail 15.
    # Observed 35/50 = 0.7; A passes 0.5, B 0.6: expected 0.5*0.6 + 0.5*0.4 = 0.5;
    # kappa = (0.7 - 0.5) / (1 - 0.5) = 0.4.
    assert cohen_kappa(_pairs(20, 5, 10, 15)) == pytest.approx(0.4)
    # 10 items, 4/1/1/4: observed 0.8, expected 0.5, kappa 0.6.
    assert cohen_kappa(_pairs(4, 1, 1, 4)) == pytest.approx(0.6)
    assert cohen_kappa(_pairs(3, 0, 0, 2)) == pytest.approx(1.0)
    # Always the opposite: observed 0, expected 0.5, kappa -1.
    assert cohen_kappa(_pairs(0, 2, 2, 0)) == pytest.approx(-1.0)
    # Both always pass: chance alone agrees fully, kappa is undefined.
    assert cohen_kappa(_pairs(5, 0, 0, 0)) is None
    assert cohen_kappa([]) is None


def test_flip_rate_and_agreement_of_known_verdicts() -> None:
    def judged(verdict: bool, *votes: bool) -> Judged:
        return Judged("crit", verdict, {"agents:j": list(votes or [verdict])})

    a, b = Spot("a", 1, 1), Spot("b", 1, 1)
    # a: stored pass, then pass, fail, pass (flips; 3 of 4 agree with the majority);
    # b: pass four times (steady).
    askings = [
        {a: judged(True), b: judged(True)},
        {a: judged(True), b: judged(True)},
        {a: judged(False), b: judged(True)},
        {a: judged(True), b: judged(True)},
    ]
    labels = [Label(a, "crit", True, False), Label(b, "crit", True, True)]
    found = audit("r", askings, labels)
    crit = found.criteria["crit"]
    assert (found.times, crit.items, crit.flipped, crit.flips) == (3, 2, 1, [a])
    assert crit.flip_rate == 0.5 and crit.agreement == pytest.approx(7 / 8)
    assert crit.unstable and [c.name for c in found.unstable()] == ["crit"]
    people = found.people_criteria["crit"]
    assert people.raw == 0.5 and people.kappa == pytest.approx(0.0)
    # A tie among 2 verdicts counts half of them as agreeing.
    tie = audit("r", [{a: judged(True)}, {a: judged(False)}])
    assert tie.criteria["crit"].agreement == 0.5
    # An asking whose judge calls all failed gave no verdict: counted apart, not a flip.
    failed = Judged("crit", None, {})
    quiet = audit("r", [{a: judged(True)}, {a: failed}, {a: judged(True)}])
    assert (quiet.criteria["crit"].flipped, quiet.criteria["crit"].unanswered) == (0, 1)


# -- a run against judges of known behaviour ------------------------------------------------


class FlakyJudge:
    """Pass, fail, pass, ... for each transcript (by its case tag), c2 starting with fail."""

    def __init__(self) -> None:
        self.asked: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, body: Body) -> Reply:
        text = json.dumps(body)
        case = next(c for c in CASES if f"[case {c}]" in text)
        with self.lock:
            count = self.asked[case] = self.asked.get(case, 0) + 1
        passed = (count % 2 == 1) != (case == "c2")
        return judge_verdict(passed, f"judged {count} times")


def _case(case_id: str) -> dict[str, Any]:
    return {
        "id": case_id,
        "input": f"a question [case {case_id}]",
        "assertions": [
            {"type": "agent", "use": "flaky", "options": {"metadata": {"criteria": "is polite"}}},
            {
                "type": "agent",
                "use": "validator",
                "options": {"metadata": {"criteria": 'Must mention "answer"'}},
            },
        ],
    }


def write_project(folder: Path, agent: ScriptedAgent, demo_url: str) -> list[str]:
    config = {
        "agents": {
            "bot": agent.entry("target"),
            # temperature 0 would be cached by default: the audit must ask anyway.
            "flaky": agent.entry("flaky", params={"temperature": 0}),
            "validator": {"base_url": demo_url, "model": "validator", "max_retries": 0},
        },
    }
    (folder / "agenttest.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    cases = folder / "cases.jsonl"
    cases.write_text("".join(json.dumps(_case(c)) + "\n" for c in CASES), encoding="utf-8")
    return ["-i", str(cases), "-n", "bot", "--config", str(folder / "agenttest.yaml")]


@pytest.fixture
def agent() -> Iterator[ScriptedAgent]:
    with ScriptedAgent() as served:
        served.script("target", lambda body: "here is an answer")
        served.script("flaky", FlakyJudge())
        yield served


def _by_name(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in rows}


def check_audit(document: dict[str, Any], times: int) -> None:
    """What the audit of a run of CASES must find: the flaky criterion and judge unstable,
    flipping on every transcript; the validator's steady."""
    assert document["times"] == times and document["items"] == 2 * len(CASES)
    criteria = _by_name(document["criteria"])
    flaky, stable = criteria[FLAKY], criteria[STABLE]
    assert (flaky["flipped"], flaky["flip_rate"], flaky["unstable"]) == (3, 1.0, True)
    assert flaky["flips"] == [{"case_id": c, "turn": 1, "position": 1} for c in CASES]
    assert (stable["flipped"], stable["flip_rate"], stable["agreement"]) == (0, 0.0, 1.0)
    assert stable["unstable"] is False and stable["flips"] == []
    assert [u["name"] for u in document["unstable"]] == [FLAKY]
    judges = _by_name(document["judges"])
    assert judges["agents:flaky"]["unstable"] and judges["agents:flaky"]["flip_rate"] == 1.0
    assert judges["agents:validator"]["flip_rate"] == 0.0


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_an_audit_finds_the_judge_that_disagrees_with_itself(
    agent: ScriptedAgent,
    demo_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    args = write_project(tmp_path, agent, demo_url)
    code, out, err = _run(capsys, *args)
    assert code == 1, out + err  # c2's flaky verdict was a fail
    run_id = out.split("ℹ Run: ", 1)[1].split()[0]
    targets = len(agent.requests("target"))
    assert targets == 3 and len(agent.requests("flaky")) == 3

    code, out, err = _run(capsys, "audit-judges", "last", "--times", "3", "--format", "json")
    assert code == 0, err
    check_audit(json.loads(out), times=3)
    assert len(agent.requests("target")) == targets, "the audit calls no target"
    assert len(agent.requests("flaky")) == 3 + 3 * 3, "every asking called the judge: no cache"

    found = unstable_criteria(get_settings().effective_database_url(), run_id)
    assert [(u.criterion, u.flip_rate) for u in found] == [(FLAKY, 1.0)]
    assert found[0].flips == tuple((c, 1, 1) for c in CASES)

    # People's labels: c1 and c3 were stored as passes, c2 as a fail.
    for case, said in (("c1", "pass"), ("c2", "fail"), ("c3", "fail")):
        code, out, err = _run(capsys, "label", run_id, case, "1", said, "--assertion", "1")
        assert code == 0, err
    assert "disagrees with the judge's pass" in out
    # Judge vs people: (pass, pass), (fail, fail), (pass, fail): raw 2/3; kappa 0.4 (the
    # judge passes 2/3, people 1/3: chance agrees 4/9, (2/3 - 4/9) / (5/9) = 0.4).
    code, out, err = _run(capsys, "audit-judges", run_id, "--times", "1", "--format", "json")
    assert code == 0, err
    people = json.loads(out)["people"]
    expected = {"name": FLAKY, "labels": 3, "agreement": 0.6667, "kappa": 0.4}
    assert people["criteria"] == [expected]
    assert people["judges"] == [{**expected, "name": "agents:flaky"}]
    # The console says the same for people.
    code, out, err = _run(capsys, "audit-judges", run_id, "--times", "1")
    assert code == 0, err
    assert "UNSTABLE" in out and "c1 turn 1, c2 turn 1, c3 turn 1" in out
    assert "0.40" in out and "67%" in out


def test_label_and_audit_refuse_what_is_not_there(
    agent: ScriptedAgent,
    demo_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _out, err = _run(capsys, "audit-judges", "nope")
    assert code == 2 and "no run 'nope'" in err and "Traceback" not in err
    code, _out, err = _run(capsys, *write_project(tmp_path, agent, demo_url))
    assert code == 1, err
    for argv, said in (
        (["label", "last", "c9", "1", "pass"], "no finished conversation 'c9'"),
        (["label", "last", "c1", "4", "pass"], "has no turn 4"),
        (["label", "last", "c1", "1", "pass"], "has 2 judged assertions"),
        (["label", "last", "c1", "1", "maybe"], "invalid choice"),
        (["audit-judges", "last", "--times", "21"], "at most 20"),
    ):
        code, _out, err = _run(capsys, *argv)
        assert code == 2 and said in err and "Traceback" not in err, (argv, err)
    plain = tmp_path / "plain.jsonl"
    plain.write_text(
        json.dumps(
            {
                "id": "p",
                "input": "hi [case c1]",
                "assertions": [{"type": "contains", "value": "answer"}],
            }
        )
        + "\n",
        encoding="utf-8",
    )
    code, _out, err = _run(capsys, "-i", str(plain), "-n", "bot")
    assert code == 0, err
    code, _out, err = _run(capsys, "audit-judges", "last")
    assert code == 2 and "no judged (agent) assertion" in err, err


def test_repetitions_are_audited_each_as_its_own_transcript(
    agent: ScriptedAgent,
    demo_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(capsys, *write_project(tmp_path, agent, demo_url), "--repeat", "2")
    assert code == 1, out + err
    code, out, err = _run(capsys, "audit-judges", "last", "--times", "1", "--format", "json")
    assert code == 0, err
    document = json.loads(out)
    assert document["items"] == 2 * 2 * len(CASES)
    stable = _by_name(document["criteria"])[STABLE]
    assert (stable["items"], stable["flipped"]) == (2 * len(CASES), 0)
    code, out, err = _run(capsys, "label", "last", "c1#2", "1", "pass", "--assertion", "2")
    assert code == 0, err
    assert "c1#2 turn 1 assertion 2" in out and "agrees with the judge's pass" in out


def test_a_single_judge_is_named_as_a_panel_names_it() -> None:
    from agenttest_worker.report.audit_stats import judge_of
    from agenttest_worker.results import AssertionResult

    asked = AssertionResult(type="agent", passed=True)
    assert judge_of(asked, "agents:grader") == judge_of(asked, "grader") == "agents:grader"
    used = AssertionResult.model_validate({"type": "agent", "passed": True, "use": "agents:x"})
    assert judge_of(used, "grader") == "agents:x"


def test_the_viewer_keeps_a_label_posted_from_its_own_page(
    agent: ScriptedAgent, demo_url: str, tmp_path: Path
) -> None:
    from browser import environment, submit

    env = environment(tmp_path / ".agenttest")
    done = submit(write_project(tmp_path, agent, demo_url), env, tmp_path)
    assert done.returncode == 1, done.stderr
    run_id = done.stdout.split("ℹ Run: ", 1)[1].split()[0]
    viewer = Viewer(["--port", "0"], env, tmp_path)
    try:
        root = viewer.root()
        labels = f"{root}/api/runs/{run_id}/labels"
        body = {"case": "c2", "turn": 1, "assertion": 2, "label": "fail", "note": "<b>x</b>"}
        with httpx.Client() as client:
            # Not JSON (a cross-site form could send it): refused, nothing kept.
            form = client.post(labels, data={"case": "c2"})
            assert form.status_code == 415
            # Another site's page: refused.
            other = client.post(labels, json=body, headers={"Origin": "http://evil.example"})
            assert other.status_code == 403
            cross = client.post(labels, json=body, headers={"Sec-Fetch-Site": "cross-site"})
            assert cross.status_code == 403
            bad = client.post(labels, json={**body, "label": "maybe"})
            assert bad.status_code == 400 and "pass" in bad.json()["message"]
            missing = client.post(labels, json={**body, "case": "<script>"})
            assert missing.status_code == 400
            assert missing.headers["Content-Type"].startswith("application/json")
            kept = client.post(labels, json=body, headers={"Origin": root})
            assert kept.status_code == 201, kept.text
            assert kept.json()["judge_verdict"] == "pass" and kept.json()["label"] == "fail"
            assert "Content-Security-Policy" in kept.headers
            # Anything else still only reads.
            assert client.post(f"{root}/api/runs/{run_id}", json=body).status_code == 405
    finally:
        viewer.stop()
    # Behind a token, a label needs it like every request.
    guarded = Viewer(["--port", "0", "--token", "t0ken"], env, tmp_path)
    try:
        labels = f"{guarded.root()}/api/runs/{run_id}/labels"
        assert httpx.post(labels, json=body).status_code == 401
        good = httpx.post(labels, json=body, headers={"Authorization": "Bearer t0ken"})
        assert good.status_code == 201, good.text
    finally:
        guarded.stop()
    url = f"sqlite:///{tmp_path / '.agenttest' / 'agenttest.db'}"
    stored = judge_labels.labels_of(url, run_id)
    # Labelled twice by the same person: the newest label replaced the first.
    assert [(s.case_id, s.turn, s.position, s.label, s.note) for s in stored] == [
        ("c2", 1, 2, False, "<b>x</b>")
    ]
    assert stored[0].criterion == STABLE and stored[0].judge_verdict is True


def test_a_label_button_in_the_viewer_keeps_the_label(
    agent: ScriptedAgent, demo_url: str, tmp_path: Path
) -> None:
    from browser import chromium, environment, not_pwned, open_page, submit

    env = environment(tmp_path / ".agenttest")
    done = submit(write_project(tmp_path, agent, demo_url), env, tmp_path)
    assert done.returncode == 1, done.stderr
    run_id = done.stdout.split("ℹ Run: ", 1)[1].split()[0]
    viewer = Viewer(["--port", "0"], env, tmp_path)
    try:
        with chromium() as browser:
            page, seen = open_page(browser, f"{viewer.root()}/runs/{run_id}/case?id=c2")
            page.wait_for_selector("#conversation")
            judged = page.query_selector_all("ul.assertions > li")
            assert len(judged) == 2  # both judged: each has its buttons
            judged[0].query_selector("button[data-label=pass]").click()
            page.wait_for_function(
                "() => document.querySelector('ul.assertions .labels .dim').textContent"
                ".includes('labelled')"
            )
            said = judged[0].query_selector(".labels .dim").inner_text()
            assert "labelled pass (the judge said fail)" in said
            not_pwned(page, "agenttest · case")
            assert all(url.startswith(viewer.root()) for url in seen)
    finally:
        viewer.stop()
    url = f"sqlite:///{tmp_path / '.agenttest' / 'agenttest.db'}"
    stored = judge_labels.labels_of(url, run_id)
    assert [(s.case_id, s.turn, s.position, s.criterion) for s in stored] == [("c2", 1, 1, FLAKY)]
    assert (stored[0].judge_verdict, stored[0].label) == (False, True)


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


@pytest.mark.fleet
def test_an_audit_of_a_fleet_run(
    fleet: Fleet, agent: ScriptedAgent, demo_url: str, tmp_path: Path
) -> None:
    fleet.start("a", concurrency=2)
    done = fleet.submit(write_project(tmp_path, agent, demo_url))
    assert done.returncode == 1, done.stderr + fleet.logs()[-4000:]
    targets = len(agent.requests("target"))
    run_id = done.stdout.split("ℹ Run: ", 1)[1].split()[0]
    audited = fleet.submit(["audit-judges", run_id, "--times", "2", "--format", "json"])
    assert audited.returncode == 0, audited.stderr
    check_audit(json.loads(audited.stdout), times=2)
    assert len(agent.requests("target")) == targets
    found = unstable_criteria(fleet.database_url, run_id)
    assert [u.criterion for u in found] == [FLAKY]
    labelled = fleet.submit(["label", run_id, "c1", "1", "fail", "--assertion", "1"])
    assert labelled.returncode == 0, labelled.stderr
    assert [s.label for s in judge_labels.labels_of(fleet.database_url, run_id)] == [False]
