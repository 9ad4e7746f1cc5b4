"""`--reporter agents:ID`: a custom reporter agent gets the run's results and writes its own
report, which is stored with the run and printed. Over real HTTP, on the embedded default:
the target is the demo expense agent, the reporter a scripted agent that keeps every
request it gets.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from scripted_agent import Reply, ScriptedAgent, fail, say

from agenttest_submit.cli.main import main
from agenttest_worker.demo._protocol import metadata_of
from agenttest_worker.settings import get_settings
from agenttest_worker.store.sql import run_results as results
from agenttest_worker.store.sql import runs

RUN_ID = re.compile(r"ℹ Run: (\S+)")
DIGEST = "1 of 2 cases failed: FAILS expected a refund the agent never mentions."

CASES = [
    {"id": "PASSES", "input": "Hello", "assertions": [{"type": "contains", "value": "help you"}]},
    {"id": "FAILS", "input": "Hello", "assertions": [{"type": "contains", "value": "refund"}]},
]


@pytest.fixture
def agent() -> Iterator[ScriptedAgent]:
    with ScriptedAgent() as server:
        yield server


@pytest.fixture
def project(
    demo_url: str, agent: ScriptedAgent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """cwd = tmp_path with agenttest.yaml (target: demo expense; reporter: scripted) and
    cases.jsonl (one case passes, one fails)."""
    monkeypatch.chdir(tmp_path)
    config = {
        "agents": {
            "assistants.expense": {"base_url": demo_url, "model": "expense", "max_retries": 0},
            "team.reporter": agent.entry("reporter", max_retries=0),
        }
    }
    (tmp_path / "agenttest.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    (tmp_path / "cases.jsonl").write_text(
        "".join(json.dumps(c) + "\n" for c in CASES), encoding="utf-8"
    )
    return tmp_path


def submit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["-i", "cases.jsonl", "-n", "assistants.expense", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def store_url() -> str:
    return get_settings().effective_database_url()


def test_the_reporter_gets_the_results_and_its_reply_is_stored_and_printed(
    project: Path, agent: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    agent.script("reporter", [say(DIGEST)])
    code, out, err = submit(capsys, "--reporter", "agents:team.reporter", "-o", "out.jsonl")
    assert code == 1, err  # the reporter does not change the exit code: FAILS failed
    run_id = RUN_ID.search(out).group(1)  # type: ignore[union-attr]

    [request] = agent.requests("reporter")
    assert metadata_of(request)["test_mode"] == "reporter"
    assert metadata_of(request)["run_id"] == run_id
    summary = metadata_of(request)["summary"]
    assert (summary["total"], summary["passed"], summary["failed"]) == (2, 1, 1)
    payload = json.loads(request["messages"][-1]["content"])
    assert request["messages"][-1]["role"] == "user"
    assert payload["summary"] == summary and payload["run_id"] == run_id
    assert payload["agent"] == "assistants.expense"
    by_id = {r["id"]: r for r in payload["results"]}
    assert set(by_id) == {"PASSES", "FAILS"}
    assert (by_id["PASSES"]["status"], by_id["FAILS"]["status"]) == ("passed", "failed")
    # The same records as -o writes (minus the per-call log), verdicts and reasons included.
    written = {
        r["id"]: r for r in map(json.loads, (project / "out.jsonl").read_text().splitlines())
    }
    failed_check = by_id["FAILS"]["turns"][0]["assertions"][0]
    assert failed_check == written["FAILS"]["turns"][0]["assertions"][0]
    assert failed_check["passed"] is False and failed_check["value"] == "refund"
    assert by_id["FAILS"]["turns"][0]["output"] == written["FAILS"]["turns"][0]["output"]

    # Printed after the standard report, and kept with the run as format "reporter".
    assert f"── Report by agents:team.reporter ──\n{DIGEST}\n" in out
    assert out.index("Summary") < out.index("Report by")
    assert results.get_report(store_url(), run_id, "reporter") == DIGEST
    # `report RUN` shows it again, after the report; other formats are the report alone.
    capsys.readouterr()
    assert main(["report", run_id]) == 1
    shown = capsys.readouterr().out
    assert f"── Report by the reporter agent ──\n{DIGEST}\n" in shown
    assert shown.index("Summary") < shown.index("Report by")
    main(["report", run_id, "--format", "json"])
    assert "Report by" not in capsys.readouterr().out


def test_a_failing_reporter_only_warns(
    project: Path, agent: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    agent.script("reporter", [fail(500, "reporter is down")])
    code, out, err = submit(capsys, "--id", "PASSES", "--reporter", "team.reporter")
    assert code == 0, err  # the run's own verdict stands
    run_id = RUN_ID.search(out).group(1)  # type: ignore[union-attr]
    assert "warning: reporter team.reporter failed" in err and "500" in err
    assert "Report by" not in out
    assert len(agent.requests("reporter")) == 1
    assert results.get_report(store_url(), run_id, "reporter") is None
    assert results.get_report(store_url(), run_id, "jsonl"), "the standard reports are stored"

    # A reply that is not text at all (content null) is stored as an empty report, not a crash.
    agent.script("reporter", [Reply(content=None)])
    code, _, err = submit(capsys, "--id", "PASSES", "--reporter", "team.reporter")
    assert code == 0, err


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("agents:team.reportr", "unknown agent 'team.reportr'"),
        ("nobody", "unknown agent 'nobody'"),
        ("scripts:report", "a reporter is an agent"),
        ("agents:../x", "not a valid name"),
    ],
)
def test_a_reporter_that_cannot_work_is_an_input_error_before_anything_runs(
    project: Path,
    agent: ScriptedAgent,
    capsys: pytest.CaptureFixture[str],
    ref: str,
    expected: str,
) -> None:
    code, out, err = submit(capsys, "--reporter", ref)
    assert code == 2, err
    assert "nothing was run" in err and "--reporter" in err and expected in err
    assert out == ""
    assert not (project / ".agenttest" / "agenttest.db").exists() or (
        runs.latest_run(store_url()) is None
    )


def test_the_reporter_also_reports_a_re_evaluation(
    project: Path, agent: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = submit(capsys)
    first = RUN_ID.search(out).group(1)  # type: ignore[union-attr]
    agent.script(
        "reporter",
        lambda body: say(
            f"re-judged {json.loads(body['messages'][-1]['content'])['results_total']}"
        ),
    )
    capsys.readouterr()
    code = main(["--reeval", first, "--reporter", "team.reporter"])
    out, err = capsys.readouterr()
    assert code == 1, err
    second = RUN_ID.search(out).group(1)  # type: ignore[union-attr]
    assert "re-judged 2" in out
    assert results.get_report(store_url(), second, "reporter") == "re-judged 2"
    # ... and is checked first there too.
    code = main(["--reeval", first, "--reporter", "team.nobody"])
    _, err = capsys.readouterr()
    assert code == 2 and "unknown agent 'team.nobody'" in err
