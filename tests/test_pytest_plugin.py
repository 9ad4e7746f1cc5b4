"""The pytest plugin: agenttest cases collected and played as pytest items, against the
demo agents over real HTTP (embedded, each item a run in the test's own store). Each
session is a pytest process of its own, as a user's would be."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

SUITE = Path(__file__).resolve().parents[1] / "agenttest_worker" / "demo" / "suite"
AGENT = "--agenttest-agent=assistants.expense"
TAGGED = {
    "id": "T010",
    "input": "Hello",
    "tags": ["smoke", "slow:path"],
    "assertions": [{"type": "contains", "value": "expense"}],
}


@pytest.fixture
def project(
    pytester: pytest.Pytester, demo: Path, monkeypatch: pytest.MonkeyPatch
) -> pytest.Pytester:
    """A project with agenttest.yaml, a case file named for the plugin and one that is not."""
    monkeypatch.chdir(pytester.path)  # (the demo fixture moved to its own tmp_path)
    shutil.copy(SUITE / "agenttest.yaml", pytester.path / "agenttest.yaml")
    cases = pytester.path / "cases"
    cases.mkdir()
    suite = (SUITE / "expense-suite.jsonl").read_text().splitlines()
    # T001 passes, T004 fails; T010 passes and is tagged.
    text = "\n".join([suite[0], suite[3], json.dumps(TAGGED)]) + "\n"
    (cases / "expense.agenttest.jsonl").write_text(text)
    # Not named for the plugin: read only under --agenttest.
    (cases / "other.jsonl").write_text(suite[1] + "\n")
    return pytester


def test_cases_are_items_that_pass_and_fail_with_the_conversation(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("cases", AGENT, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*agenttest case T004*",
            "► [T004] Greeting mentions refunds (1 turn)",
            '  ├─ Turn 1: "Hello" → FAILED*',
            '*✗ contains "refund"',
            "  └─ Result: FAILED",
        ]
    )
    assert "other.jsonl" not in result.stdout.str()  # not named *.agenttest.*


def test_agenttest_path_collects_every_case_file_there(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("--agenttest", "cases", AGENT, "--collect-only", "-q")
    result.stdout.fnmatch_lines(
        [
            "cases/expense.agenttest.jsonl::T001",
            "cases/expense.agenttest.jsonl::T004",
            "cases/expense.agenttest.jsonl::T010",
            "cases/other.jsonl::T002",
        ]
    )
    assert result.ret == 0


def test_k_m_and_x_select_and_stop(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("cases", AGENT, "-k", "T004 or T010", "--strict-markers")
    result.assert_outcomes(passed=1, failed=1)
    tagged = project.runpytest_subprocess("cases", AGENT, "-m", "smoke", "--strict-markers")
    tagged.assert_outcomes(passed=1)
    # A tag no marker can be named by is a keyword still.
    keyword = project.runpytest_subprocess("cases", AGENT, "-k", "slow", "--strict-markers")
    keyword.assert_outcomes(passed=1)
    # -x: T004 fails, T010 after it is never played.
    stopped = project.runpytest_subprocess("cases", AGENT, "-x")
    stopped.assert_outcomes(passed=1, failed=1)


def test_last_failed_replays_only_the_failed_case(project: pytest.Pytester) -> None:
    project.runpytest_subprocess("cases", AGENT).assert_outcomes(passed=2, failed=1)
    again = project.runpytest_subprocess("cases", AGENT, "--lf", "-v")
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(["*run-last-failure*", "*::T004 FAILED*"])
    assert "::T001" not in again.stdout.str() and "::T010" not in again.stdout.str()


def test_junit_and_xdist(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    junit = project.path / "results.xml"
    # On GitHub the session reports through pytest: no step summary per case.
    summary = project.path / "summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = project.runpytest_subprocess("cases", AGENT, "-n", "2", f"--junitxml={junit}")
    result.assert_outcomes(passed=2, failed=1)
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    assert set(cases) == {"T001", "T004", "T010"}
    failure = cases["T004"].find("failure")
    assert failure is not None and "► [T004]" in (failure.text or "")
    assert not summary.exists()


def test_a_case_file_with_errors_is_a_collection_error(project: pytest.Pytester) -> None:
    bad = project.path / "cases" / "bad.agenttest.jsonl"
    bad.write_text('{"id": "B1", "input": "Hi", "assertions": [{"type": "nope"}]}\n')
    result = project.runpytest_subprocess("cases", AGENT)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        ["*ERROR collecting cases/bad.agenttest.jsonl*", "*bad.agenttest.jsonl:1*"]
    )
    assert "Traceback" not in result.stdout.str()


def test_without_case_files_the_plugin_collects_nothing(pytester: pytest.Pytester) -> None:
    (pytester.path / "data.jsonl").write_text('{"id": "X", "input": "Hi"}\n')
    (pytester.path / "agenttest.yaml").write_text("agents: {}\n")
    pytester.makepyfile(test_plain="def test_one():\n    assert True\n")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)
