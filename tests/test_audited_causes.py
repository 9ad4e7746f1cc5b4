"""The `judge` cause an audit of the judges gives: after `audit-judges RUN` finds a
criterion unstable, a failed case resting on it alone is the judge's in `report RUN`
(JSON and the console's summary by cause), the viewer and the diff; a case failing on a
stable criterion stays the target's (`agent`). The stored records are not rewritten.

Against agents of known behaviour over real HTTP: a scripted judge that answers each
transcript pass, fail, pass, ... in turn (so asked again it flips), the demo validator
(which checks the criteria's quoted phrases and never changes its mind), and a target
that answers the `broke` case right once, then wrong.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fleet import Fleet, fleet_on
from scripted_agent import Body, Reply, ScriptedAgent, judge_verdict

from agenttest_submit.cli.main import main
from agenttest_submit.commands.viewer.queries import RunViews
from agenttest_worker.results import CaseResult
from agenttest_worker.settings import get_settings
from agenttest_worker.store import results, unstable_criteria

POLITE = "agent: is polite"
CASES = ("reg", "broke", "wrong")


class Counted:
    """Counts the requests per case (by the `[case ID]` tag of the transcript)."""

    def __init__(self) -> None:
        self.asked: dict[str, int] = {}
        self.lock = threading.Lock()

    def count(self, body: Body) -> tuple[str, int]:
        text = json.dumps(body)
        case = next(c for c in CASES if f"[case {c}]" in text)
        with self.lock:
            seen = self.asked[case] = self.asked.get(case, 0) + 1
        return case, seen


def flipping_judge() -> Any:
    counted = Counted()

    def judge(body: Body) -> Reply:
        _, seen = counted.count(body)
        return judge_verdict(seen % 2 == 1, f"judged {seen} times")

    return judge


def target() -> Any:
    counted = Counted()

    def answer(body: Body) -> str:
        case, seen = counted.count(body)
        return "no idea" if case == "broke" and seen > 1 else "here is an answer"

    return answer


def _judged(criteria: str) -> dict[str, Any]:
    return {"type": "agent", "use": "flaky", "options": {"metadata": {"criteria": criteria}}}


def _validated(criteria: str) -> dict[str, Any]:
    return {"type": "agent", "use": "validator", "options": {"metadata": {"criteria": criteria}}}


# reg: the flipping judge (passes, then fails) and a stable criterion it meets;
# broke: a stable criterion the target meets once, then not; wrong: one it never meets.
ASSERTIONS = {
    "reg": [_judged("is polite"), _validated('Must mention "answer"')],
    "broke": [_validated('Must mention "answer"')],
    "wrong": [_validated('Must mention "refund"')],
}


def write_project(folder: Path, agent: ScriptedAgent, demo_url: str, *ids: str) -> list[str]:
    config = {
        "agents": {
            "bot": agent.entry("target", max_retries=0),
            "flaky": agent.entry("flaky", max_retries=0),
            "validator": {"base_url": demo_url, "model": "validator", "max_retries": 0},
        },
    }
    (folder / "agenttest.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    cases = folder / "cases.jsonl"
    written = [
        {"id": c, "input": f"a question [case {c}]", "assertions": ASSERTIONS[c]}
        for c in ids or CASES
    ]
    cases.write_text("".join(json.dumps(c) + "\n" for c in written), encoding="utf-8")
    return ["-i", str(cases), "-n", "bot", "--config", str(folder / "agenttest.yaml")]


@pytest.fixture
def agent() -> Iterator[ScriptedAgent]:
    with ScriptedAgent() as served:
        served.script("target", target())
        served.script("flaky", flipping_judge())
        yield served


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _run_id(out: str) -> str:
    return out.split("ℹ Run: ", 1)[1].split()[0]


def _reported(capsys: pytest.CaptureFixture[str], run_id: str) -> dict[str, Any]:
    code, out, err = _run(capsys, "report", run_id, "--format", "json")
    assert code == 1, err
    document: dict[str, Any] = json.loads(out)
    return document


def _causes(document: dict[str, Any]) -> dict[str, str | None]:
    return {r["id"]: r.get("cause") for r in document["results"]}


def test_an_audit_makes_a_failure_on_an_unstable_criterion_the_judges(
    agent: ScriptedAgent,
    demo_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    args = write_project(tmp_path, agent, demo_url)
    # The baseline: reg (its judge's first verdict, a pass) and broke pass; wrong fails.
    code, out, err = _run(capsys, *args)
    assert code == 1, out + err
    base = _run_id(out)
    # Now reg fails on the judge's second verdict and broke on the target's answer.
    code, out, err = _run(capsys, *args)
    assert code == 1, out + err
    run_id = _run_id(out)
    url = get_settings().effective_database_url()

    # Before the audit every failure is the target's (one judge, no split votes).
    before = _reported(capsys, run_id)
    assert _causes(before) == {"reg": "agent", "broke": "agent", "wrong": "agent"}
    assert before["summary"]["causes"] == {"agent": 3}
    views = RunViews(url)
    header = views.header(run_id)  # (the viewer keeps the run's table from here on)
    assert header is not None and header["summary"]["causes"] == {"agent": 3}
    _, out, _ = _run(capsys, "diff", base, run_id, "--format", "json")
    assert json.loads(out)["causes"] == {"agent": 3}

    code, out, err = _run(capsys, "audit-judges", run_id, "--times", "2", "--format", "json")
    assert code == 0, err
    assert [u["name"] for u in json.loads(out)["unstable"]] == [POLITE]
    assert [u.criterion for u in unstable_criteria(url, run_id)] == [POLITE]

    # After it: reg failed on the unstable criterion alone, the judge's; broke and wrong
    # failed on stable ones, the target's.
    after = _reported(capsys, run_id)
    assert _causes(after) == {"reg": "judge", "broke": "agent", "wrong": "agent"}
    assert after["summary"]["causes"] == {"agent": 2, "judge": 1}
    code, out, _ = _run(capsys, "report", run_id)
    assert code == 1 and "Causes: 2 agent, 1 judge" in out, out
    # The records stored are not rewritten: reading them applies the audit.
    stored = [CaseResult.model_validate_json(t) for t in results.iter_result_texts(url, run_id)]
    assert {r.id: r.cause for r in stored} == {"reg": "agent", "broke": "agent", "wrong": "agent"}
    # The baseline run was not audited: its one failure stays the target's.
    assert _causes(_reported(capsys, base)) == {"reg": None, "broke": None, "wrong": "agent"}

    # The viewer: the run's summary and table are built again after the audit.
    header = views.header(run_id)
    assert header is not None and header["summary"]["causes"] == {"agent": 2, "judge": 1}
    rows = {row["id"]: row.get("cause") for row in views.rows(run_id) or []}
    assert rows == {"reg": "judge", "broke": "agent", "wrong": "agent"}
    case = views.case(run_id, "reg")
    assert case is not None and [r["cause"] for r, _ in case["records"]] == ["judge"]
    case = views.case(run_id, "broke")
    assert case is not None and [r["cause"] for r, _ in case["records"]] == ["agent"]

    # The diff: its summary by cause and each regression's cause.
    _, out, _ = _run(capsys, "diff", base, run_id, "--format", "json")
    document = json.loads(out)
    assert document["causes"] == {"agent": 2, "judge": 1}
    explained = {c["id"]: (c["category"], c.get("cause")) for c in document["cases"]}
    assert explained["reg"] == ("regression", "judge")
    assert explained["broke"] == ("regression", "agent")
    _, out, _ = _run(capsys, "diff", base, run_id)
    assert "Failing now, by cause: 2 agent, 1 judge" in out, out


def test_an_unstable_criterion_wins_over_a_flake(
    agent: ScriptedAgent,
    demo_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    args = write_project(tmp_path, agent, demo_url, "reg")
    code, out, err = _run(capsys, *args)
    assert code == 0, out + err
    base = _run_id(out)
    # Two repetitions: the judge fails one and passes the other, a flake.
    code, out, err = _run(capsys, *args, "--repeat", "2", "--parallel", "1")
    assert code == 1, out + err
    run_id = _run_id(out)
    url = get_settings().effective_database_url()
    before = _reported(capsys, run_id)
    assert before["summary"]["causes"] == {"flake": 1}
    _, out, _ = _run(capsys, "diff", base, run_id, "--format", "json")
    assert json.loads(out)["causes"] == {"flake": 1}

    code, out, err = _run(capsys, "audit-judges", run_id, "--times", "2", "--format", "json")
    assert code == 0, err
    assert [u.criterion for u in unstable_criteria(url, run_id)] == [POLITE]

    # The judge changing its mind is why the repetitions disagreed.
    after = _reported(capsys, run_id)
    assert after["summary"]["causes"] == {"judge": 1}
    assert sorted(str(r.get("cause")) for r in after["results"]) == ["None", "judge"]
    case = RunViews(url).case(run_id, "reg")
    assert case is not None
    assert sorted(str(r.get("cause")) for r, _ in case["records"]) == ["None", "judge"]
    _, out, _ = _run(capsys, "diff", base, run_id, "--format", "json")
    assert json.loads(out)["causes"] == {"judge": 1}


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


@pytest.mark.fleet
def test_an_audit_of_a_fleet_run_gives_the_judge_cause(
    fleet: Fleet, agent: ScriptedAgent, demo_url: str, tmp_path: Path
) -> None:
    fleet.start("a", concurrency=2)
    args = write_project(tmp_path, agent, demo_url)
    first = fleet.submit(args)
    assert first.returncode == 1, first.stderr + fleet.logs()[-4000:]
    base = _run_id(first.stdout)
    done = fleet.submit(args)
    assert done.returncode == 1, done.stderr + fleet.logs()[-4000:]
    run_id = _run_id(done.stdout)
    audited = fleet.submit(["audit-judges", run_id, "--times", "2", "--format", "json"])
    assert audited.returncode == 0, audited.stderr
    reported = fleet.submit(["report", run_id, "--format", "json"])
    document = json.loads(reported.stdout)
    assert _causes(document) == {"reg": "judge", "broke": "agent", "wrong": "agent"}
    assert document["summary"]["causes"] == {"agent": 2, "judge": 1}
    diffed = fleet.submit(["diff", base, run_id, "--format", "json"])
    assert json.loads(diffed.stdout)["causes"] == {"agent": 2, "judge": 1}
    header = RunViews(fleet.database_url).header(run_id)
    assert header is not None and header["summary"]["causes"] == {"agent": 2, "judge": 1}
