"""`--format html`: one self-contained page, checked in headless Chromium.

A real run (the CLI in a child process) against a scripted agent over HTTP whose
replies, tool calls, mocked tool results, judge reasons and the case names carry XSS
payloads; the page is opened from disk: it lists the cases sorted by status then id,
filters by status and tag, searches, opens a conversation, shows every payload as text,
runs none of them, and asks for nothing but its own file.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import (
    IMG,
    LINK,
    LISTED,
    PAYLOADS,
    SCRIPT,
    SCRIPT_END,
    TEXTAREA,
    chromium,
    environment,
    not_pwned,
    open_page,
    screenshot,
    submit,
    xss_project,
)
from fleet import Fleet, fleet_on
from scripted_agent import ScriptedAgent


class Run:
    def __init__(self, folder: Path, report: Path, jsonl: Path, run_id: str) -> None:
        self.folder, self.report, self.jsonl, self.run_id = folder, report, jsonl, run_id

    @property
    def title(self) -> str:
        return f"agenttest · run {self.run_id}"

    @property
    def url(self) -> str:
        return self.report.as_uri()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The XSS run, reported as HTML by the run itself (`-o report.html --format html`)."""
    folder = tmp_path_factory.mktemp("html-report")
    with ScriptedAgent() as agent:
        cases, config = xss_project(folder, agent)
        report = folder / "report.html"
        env = environment(folder / ".agenttest")
        args = ["-i", str(cases), "-n", "target", "--config", str(config)]
        done = submit([*args, "--format", "html", "-o", str(report)], env, folder)
        assert done.returncode == 1, done.stderr  # two cases fail
        run_id = re.search(r"\(run (\S+)\)", done.stderr)
        assert run_id, done.stderr
        jsonl = folder / "run.jsonl"
        again = submit(["report", "last", "--format", "jsonl", "-o", str(jsonl)], env, folder)
        assert again.returncode == 1, again.stderr
        yield Run(folder, report, jsonl, run_id.group(1))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


def _listed(page: Any) -> list[tuple[str, str]]:
    rows = page.query_selector_all("tr.case-row")
    return [
        (row.get_attribute("data-case-id"), row.query_selector(".badge").inner_text().lower())
        for row in rows
    ]


def test_the_file_holds_its_script_style_and_data_and_nothing_from_elsewhere(run: Run) -> None:
    text = run.report.read_text(encoding="utf-8")
    # No external anything: no src=, no stylesheet link, no URL but in the data.
    assert not re.search(r"<(script|img|iframe|link)[^>]*\s(src|href)=", text)
    assert "@import" not in text and "url(" not in text
    # One policy, allowing only the page's own script and style by hash.
    policy = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)"', text)
    assert policy, "no Content-Security-Policy"
    assert "default-src 'none'" in policy.group(1)
    assert re.search(r"script-src 'sha256-[A-Za-z0-9+/=]+'(;|$)", policy.group(1))
    # The data cannot close its element: no payload's "</script" or "<!--" is in the file.
    data = text[text.index('id="agenttest-records"') : text.index('id="agenttest-run"')]
    assert "</script" not in data.split(">", 1)[1].rsplit("</script>", 1)[0]
    assert "<!--" not in text
    for payload in PAYLOADS:
        assert payload not in text
    # ... and it is the run's records: each JSONL line is in the page, byte for byte
    # once the "<" escapes are read back.
    records = json.loads(data.split(">", 1)[1].rsplit("</script>", 1)[0])
    lines = run.jsonl.read_text(encoding="utf-8").splitlines()
    assert [record for record, _ in records] == [json.loads(line) for line in lines]


def test_the_table_lists_every_case_by_status_then_id(run: Run, browser: Any) -> None:
    page, seen = open_page(browser, run.url)
    assert _listed(page) == LISTED
    assert page.inner_text("#case-count") == "7 shown of 7 matching (7 cases)"
    cards = page.inner_text(".cards")
    assert "7\ncases" in cards and "4\npassed" in cards and "2\nfailed" in cards
    assert "1\nskipped" in cards and "57.1%\npass rate" in cards
    assert "target" in page.inner_text("table.usage") and "judge" in page.inner_text("table.usage")
    not_pwned(page, run.title)
    screenshot(page, run.folder / "artifacts", "html-report.png", docs=True)
    assert set(seen) == {run.url}, seen


def test_it_filters_by_status_and_tag_and_searches(run: Run, browser: Any) -> None:
    page, seen = open_page(browser, run.url)
    page.click("button[data-status=failed]")
    assert _listed(page) == [("plain-fail", "failed"), ("xss-judge", "failed")]
    page.click("button[data-status=all]")
    page.select_option("#tag-filter", "tools")
    assert _listed(page) == [("xss-tool", "passed")]
    page.select_option("#tag-filter", "plain")
    page.click("button[data-status=passed]")
    assert _listed(page) == [("plain-1", "passed"), ("plain-2", "passed")]
    page.click("button[data-status=all]")
    page.select_option("#tag-filter", "")
    # Text search looks in replies and reasons too, not only ids and names.
    page.fill("#search", "not polite")
    page.wait_for_function("() => document.querySelectorAll('tr.case-row').length === 1")
    assert _listed(page) == [("xss-judge", "failed")]
    page.fill("#search", "</textarea>")
    page.wait_for_function("() => document.querySelectorAll('tr.case-row').length === 2")
    assert {case for case, _ in _listed(page)} == {"xss-ask", "xss-tool"}
    page.fill("#search", "")
    page.wait_for_function("() => document.querySelectorAll('tr.case-row').length === 7")
    not_pwned(page, run.title)
    assert set(seen) == {run.url}, seen


def test_a_conversation_shows_every_payload_as_text(run: Run, browser: Any) -> None:
    page, seen = open_page(browser, run.url)
    page.click("tr[data-case-id=xss-tool] a")
    page.wait_for_selector("#conversation")
    text = page.inner_text("#conversation")
    assert f"Tool {SCRIPT}" in text  # the case's name
    assert "lookup(" in text and "[Initial]" not in text  # a static case has no markers
    assert "Tool lookup (mocked result)" in text
    page.click("#conversation details:has(summary:text('arguments')) summary")
    args = page.inner_text("#conversation pre.args")
    assert json.loads(args) == {"query": SCRIPT_END, "html": IMG}
    assert TEXTAREA in text and SCRIPT_END in text  # the reply and the mocked result
    screenshot(page, run.folder / "artifacts", "html-conversation.png", docs=True)
    not_pwned(page, run.title)

    page.go_back()
    page.click("tr[data-case-id=xss-reply] a")
    page.wait_for_selector("#conversation")
    text = page.inner_text("#conversation")
    assert f"Reply {IMG}" in text and SCRIPT in text and LINK in text
    page.goto(f"{run.url}#case=xss-judge")
    page.wait_for_selector("#conversation .assertions")
    text = page.inner_text("#conversation")
    assert f"The reply was not polite: {SCRIPT_END} {IMG}" in text
    # The judge's criteria, labelled in words ("judge", not the case file's "agent").
    assert f"judge: {LINK}" in text
    page.goto(f"{run.url}#case=xss-ask")
    page.wait_for_selector("#conversation .skip")
    skip = page.inner_text("#conversation .skip")
    assert "Agent awaiting input, no next turn defined" in skip
    assert "Agent asked: " in skip and "Which amount" in skip
    assert f"Input hint: {IMG}" in skip
    assert "Hint: Add more turns" in skip
    not_pwned(page, run.title)
    assert set(seen) == {run.url}, seen


def test_the_policy_stops_a_script_that_got_in_anyway(run: Run, browser: Any) -> None:
    """Were app.js ever to put data into the page as markup, the policy still would not
    run it: a script element or handler added to the page is refused."""
    page, _ = open_page(browser, run.url)
    page.evaluate(
        """() => {
            const s = document.createElement('script');
            s.textContent = "window.__pwned = 'inline'";
            document.body.appendChild(s);
            const d = document.createElement('div');
            d.innerHTML = "<img src=x onerror=\\"window.__pwned = 'handler'\\">";
            document.body.appendChild(d);
        }"""
    )
    page.wait_for_timeout(200)
    assert page.evaluate("() => window.__pwned") is None


def test_control_characters_show_as_escapes(run: Run, browser: Any) -> None:
    """An input's bidirectional override would make text read backwards: shown as an
    escape, as on the terminal."""
    page, _ = open_page(browser, f"{run.url}#case=plain-1")
    page.wait_for_selector("#conversation")
    text = page.inner_text("#conversation")
    assert "hello 1 \\u202etxt.exe" in text
    assert "\u202e" not in text


def test_repetitions_votes_markers_and_fields_added_later(tmp_path: Path, browser: Any) -> None:
    """A repeated case shows its verdict and each repetition; a judge panel its votes; a
    simulated conversation its markers; a turn field the page does not know, its value."""
    from agenttest_worker.report import RunReport, render
    from agenttest_worker.results import AssertionResult, CaseResult, JudgeVote, TurnResult

    votes = [
        JudgeVote(judge="agents:a", passed=True, score=1.0, reason=f"fine {IMG}"),
        JudgeVote(judge="agents:b", passed=False, score=0.0, reason="rude"),
    ]

    def repetition(number: int, status: str) -> CaseResult:
        judged = AssertionResult(
            type="agent", passed=status == "passed", reason="panel", votes=votes, agreement=0.5
        )
        turns = [
            TurnResult(turn=1, input="Hi", input_source="static", output="Hello?"),
            TurnResult(
                turn=2,
                input="I need a refund",
                input_source="simulator",
                output="Done.",
                assertions=[judged],
                status=status,
                first_token_ms=42,
            ),
        ]
        return CaseResult(
            id="rep",
            status=status,
            turns=turns,
            total_turns=2,
            simulator="agents:sim",
            repeat=number,
            repeats=3,
        )

    records = [repetition(1, "passed"), repetition(2, "failed"), repetition(3, "passed")]
    run = RunReport(records, "target", "suite", 3, 1.0, run_id="r-1", pass_rule="majority")
    path = tmp_path / "report.html"
    path.write_text(render("html", run), encoding="utf-8")
    page, _ = open_page(browser, f"{path.as_uri()}#case=rep")
    text = page.inner_text("#conversation")
    assert "2/3 repetitions passed" in text and "flaky" in text
    assert [h.inner_text() for h in page.query_selector_all("#conversation h3")] == [
        "Repetition 1/3 PASSED",
        "Repetition 2/3 FAILED",
        "Repetition 3/3 PASSED",
    ]
    assert "[Initial]" in text and "[Simulated]" in text
    assert "first_token_ms: 42" in text
    votes_text = page.inner_text("#conversation table.votes")
    assert "agents:b\tfail\t0\trude" in votes_text and f"fine {IMG}" in votes_text
    assert "agreement 50.0%" in text
    not_pwned(page, "agenttest · run r-1")


def _baseline_report(
    tmp_path: Path, browser: Any, play: Callable[[list[str]], subprocess.CompletedProcess[str]]
) -> None:
    """Two runs of one suite made by `play` (the CLI), the second failing a case that
    passed: the second run's page shows the diff against the first."""
    replies = {"greet": "Hello."}
    with ScriptedAgent() as agent:
        agent.script("target", lambda body: replies["greet"] if "greet" in str(body) else "Hello")
        config = tmp_path / "agenttest.yaml"
        config.write_text(json.dumps({"agents": {"target": agent.entry("target")}}))
        cases = tmp_path / "cases.jsonl"
        written = [
            {"id": c, "input": f"{c} me", "assertions": [{"type": "contains", "value": "Hello"}]}
            for c in ("greet", "other")
        ]
        cases.write_text("".join(json.dumps(c) + "\n" for c in written))
        # A suite of its own: a fleet's database is shared by the session's tests.
        suite = f"html-baseline-{tmp_path.name}"
        args = ["-i", str(cases), "-n", "target", "--config", str(config), "--format", "html"]
        args += ["--suite", suite]
        before = tmp_path / "before.html"
        first = play([*args, "--baseline", "suite", "-o", str(before)])
        assert first.returncode == 0, first.stderr  # no baseline yet: none shown
        replies["greet"] = f"Bye. {SCRIPT}"
        report = tmp_path / "report.html"
        second = play([*args, "--baseline", "suite", "-o", str(report)])
        assert second.returncode == 1, second.stderr
    base = re.search(r"\(run (\S+)\)", first.stderr)
    assert base, first.stderr
    page, seen = open_page(browser, report.as_uri())
    section = page.inner_text("#baseline-diff")
    assert f"What changed since the baseline (run {base.group(1)})" in section
    assert "Newly failing: 1" in section and "Still passing: 1" in section
    regression = page.inner_text("#baseline-diff section[data-category=regression]")
    assert "greet" in regression and f"Now: Bye. {SCRIPT}" in regression
    page.click("#baseline-diff a:text('greet')")
    page.wait_for_selector("#conversation")
    assert f"Bye. {SCRIPT}" in page.inner_text("#conversation")
    not_pwned(page, page.title())
    assert {url.split("#")[0] for url in seen} == {report.as_uri()}
    page, _ = open_page(browser, before.as_uri())
    assert page.locator("#baseline-diff").count() == 0


def test_a_run_with_a_baseline_reports_what_changed_in_its_html(
    tmp_path: Path, browser: Any
) -> None:
    """`--baseline suite --format html -o FILE`: the page shows the diff against the
    suite's previous run (a regression, with what the agent said, as text) and links
    each case still in the run to its conversation; a run without one shows none."""
    env = environment(tmp_path / ".agenttest")
    _baseline_report(tmp_path, browser, lambda args: submit(args, env, tmp_path))


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


@pytest.mark.fleet
def test_a_fleet_run_with_a_baseline_reports_what_changed_in_its_html(
    fleet: Fleet, tmp_path: Path, browser: Any
) -> None:
    """The same on a fleet: the diff is read from Postgres once the run is done."""
    fleet.start("html", concurrency=2)
    (tmp_path / "project").mkdir()
    _baseline_report(tmp_path / "project", browser, fleet.submit)
