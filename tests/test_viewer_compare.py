"""The viewer for analysis, in headless Chromium: each suite's trend drawn from its
stored runs, two runs picked and compared case by case, one case side by side turn by
turn, every table sorted by any column, the filters, the judge's prompt and reply,
words instead of codes, hostile replies shown as text, and no page wider than an
800 px window or a phone.

The runs are real (tests/analysis_runs.py: the CLI against a scripted agent, embedded);
the viewer runs as a user starts it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from analysis_runs import HOSTILE_REPLY, JSON_REPLY, JUDGE_NO, SUITE, Runs, make_runs
from browser import IMG, chromium, open_page
from scripted_agent import ScriptedAgent
from test_viewer import Viewer

# Codes that records carry and pages must say in words.
CODES = (
    "content_is_question",
    "agent_declared",
    "tool_called",
    "not_contains",
    "still_passing",
    "still_failing",
    "validator",
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    with ScriptedAgent() as agent:
        yield make_runs(tmp_path_factory.mktemp("analysis"), agent)


@pytest.fixture(scope="module")
def viewer(runs: Runs) -> Iterator[Viewer]:
    started = Viewer(["--port", "0"], runs.env, runs.folder)
    try:
        started.url()
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


def _ids(page: Any, selector: str) -> list[str]:
    return [row.get_attribute("data-case-id") for row in page.query_selector_all(selector)]


def _no_codes(page: Any) -> None:
    text = page.inner_text("#app")
    assert not [code for code in CODES if code in text], text


def _safe(page: Any) -> None:
    """Nothing from a reply ran or became markup; links go to http(s) only."""
    assert page.evaluate("() => window.__pwned") is None
    assert page.evaluate("() => document.querySelectorAll('#app img, #app textarea').length") == 0
    links = page.evaluate("() => [...document.querySelectorAll('#app a')].map(a => a.href)")
    assert all(href.startswith(("http://", "https://")) for href in links), links


def test_the_runs_page_draws_each_suites_trend(runs: Runs, viewer: Viewer, browser: Any) -> None:
    page, _ = open_page(browser, f"{viewer.root()}/")
    section = page.locator("section.suite", has_text=SUITE)
    assert section.locator("svg.trend-rate circle").count() == 4
    assert section.locator("svg.trend-cost circle").count() == 4
    assert section.locator("svg.trend-flaky circle").count() == 4
    # The repeated run has its interval; the others, played once, have none.
    assert section.locator("svg.trend-rate line.interval").count() == 1
    group = next(g for g in httpx.get(f"{viewer.root()}/api/runs").json()["groups"])
    trend = {p["id"]: p for p in group["trend"]}
    assert [p["id"] for p in group["trend"]] == [runs.first, runs.repeated, runs.now, runs.other]
    repeated = trend[runs.repeated]
    # 10 conversations, 9 passed (one of greet's two failed): the interval holds 0.9.
    assert (repeated["passed"], repeated["total"], repeated["flaky"]) == (9, 10, 1)
    assert repeated["low"] < 0.9 < repeated["high"] <= 1
    assert trend[runs.first]["rate"] == 1.0 and trend[runs.first]["flaky"] == 0
    assert trend[runs.now]["rate"] == 0.6
    tip = section.locator(f"svg.trend-rate circle[data-run='{runs.repeated}'] title")
    assert "95% interval" in tip.text_content()


def test_picking_two_runs_opens_their_comparison(runs: Runs, viewer: Viewer, browser: Any) -> None:
    page, _ = open_page(browser, f"{viewer.root()}/")
    assert page.is_disabled("#compare-go")
    page.check(f"input.pick[data-run-id='{runs.now}']")
    page.check(f"input.pick[data-run-id='{runs.first}']")
    page.click("#compare-go")
    # The older run first: then | now.
    page.wait_for_url(f"**/compare?a={runs.first}&b={runs.now}")
    page.wait_for_selector("#app[data-ready=true]")
    assert "then | now" in page.inner_text("h1")
    api = httpx.get(f"{viewer.root()}/api/compare", params={"a": runs.first, "b": runs.now})
    found = api.json()
    order = found["order"]
    expected = sorted(found["cases"], key=lambda c: (order.index(c["category"]), c["id"]))
    # Listed by change: newly failing first, then the rest in the diff's order.
    assert _ids(page, "tr.compare-row") == [c["id"] for c in expected]
    assert {c["id"] for c in found["cases"] if c["category"] == "regression"} == {
        "greet",
        "judged",
    }
    _no_codes(page)
    # Changed only: what did not stay as it was.
    page.select_option("#change-filter", "changed")
    changed = [c["id"] for c in expected if c["category"] not in ("still_passing", "still_failing")]
    assert _ids(page, "tr.compare-row") == changed
    page.select_option("#change-filter", "")
    page.select_option("#status-filter", "passed")
    assert set(_ids(page, "tr.compare-row")) == {"order-json", "receipt-md", "hostile"}
    page.select_option("#status-filter", "")
    page.select_option("#tag-filter", "json")
    assert _ids(page, "tr.compare-row") == ["order-json"]
    page.select_option("#tag-filter", "")
    page.select_option("#check-filter", "agent")
    assert _ids(page, "tr.compare-row") == ["judged"]
    assert "check: judge" in page.inner_text("#check-filter")
    page.select_option("#check-filter", "")
    page.select_option("#agent-filter", "target")
    assert len(_ids(page, "tr.compare-row")) == 5


def test_two_targets_are_compared_as_a_and_b(runs: Runs, viewer: Viewer, browser: Any) -> None:
    page, _ = open_page(browser, f"{viewer.root()}/compare?a={runs.now}&b={runs.other}")
    assert "A: target | B: target2" in page.inner_text("h1")
    heads = page.inner_text("table.compare-table thead")
    assert "A: target" in heads and "B: target2" in heads


def test_a_case_side_by_side_turn_by_turn(runs: Runs, viewer: Viewer, browser: Any) -> None:
    root = viewer.root()
    page, seen = open_page(browser, f"{root}/compare?a={runs.first}&b={runs.now}")
    page.click("tr[data-case-id=greet] a")
    page.wait_for_url("**/compare/case?**id=greet")
    page.wait_for_selector("#app[data-ready=true]")
    rows = page.locator("section.pair > .pair-row")
    assert rows.count() == 2  # two turns, each then | now
    first = rows.nth(0).locator(".pair-cell")
    assert "Hello! Welcome to the shop." in first.nth(0).inner_text()
    assert "Go away." in first.nth(1).inner_text()
    assert "differs" in (rows.nth(0).get_attribute("class") or "")
    heads = page.inner_text(".pair-heads")
    assert "then" in heads and "now" in heads and "PASSED" in heads and "FAILED" in heads
    _no_codes(page)
    assert all(url.startswith(f"{root}/") for url in seen)


def test_replies_as_markdown_or_pretty_json_and_hostile_text_as_text(
    runs: Runs, viewer: Viewer, browser: Any
) -> None:
    root = viewer.root()
    page, _ = open_page(browser, f"{root}/compare/case?a={runs.first}&b={runs.now}&id=order-json")
    pretty = page.locator(".pair-cell pre.json").first.inner_text()
    assert json.loads(pretty) == JSON_REPLY and "\n  " in pretty
    page.goto(f"{root}/compare/case?a={runs.first}&b={runs.now}&id=receipt-md")
    page.wait_for_selector("#app[data-ready=true]")
    md = page.locator(".pair-cell .md").first
    assert md.locator("strong").first.inner_text() == "Total"
    assert md.locator("li").count() == 2
    assert md.locator("pre.md-code").inner_text() == "<b>receipt</b> #42"
    links = md.locator("a")
    assert links.count() == 1 and links.first.get_attribute("href") == "https://example.com/shop"
    assert "noopener" in (links.first.get_attribute("rel") or "")
    assert "[this](javascript:alert(1))" in md.inner_text()
    _safe(page)
    page.goto(f"{root}/compare/case?a={runs.first}&b={runs.now}&id=hostile")
    page.wait_for_selector("#app[data-ready=true]")
    reply = page.locator(".pair-cell .msg.assistant").first
    reply.locator("button.reply-mode").click()
    assert reply.locator("pre.text").inner_text() == HOSTILE_REPLY
    assert f"Hostile {IMG}" in page.inner_text("h1")
    _safe(page)
    assert page.title() == "agenttest · side by side"


def test_every_table_sorts_by_any_column(runs: Runs, viewer: Viewer, browser: Any) -> None:
    page, _ = open_page(browser, f"{viewer.root()}/runs/{runs.now}")
    by_status = _ids(page, "tr.case-row")
    assert by_status[:2] == ["greet", "judged"]  # failed first
    page.click("table.case-table th:nth-child(2) button")
    assert page.get_attribute("table.case-table th:nth-child(2)", "aria-sort") == "ascending"
    assert _ids(page, "tr.case-row") == sorted(by_status)
    page.click("table.case-table th:nth-child(2) button")
    assert page.get_attribute("table.case-table th:nth-child(2)", "aria-sort") == "descending"
    assert _ids(page, "tr.case-row") == sorted(by_status, reverse=True)
    # A table drawn whole (the runs) sorts its rows.
    page.goto(f"{viewer.root()}/")
    page.wait_for_selector("#app[data-ready=true]")
    table = page.locator("section.suite", has_text=SUITE).locator("table.runs")
    table.locator("th:nth-child(7) button").click()  # passed, ascending
    passed = [int(t) for t in table.locator("tbody td:nth-child(7)").all_inner_texts()]
    assert passed == sorted(passed) and len(passed) == 4
    table.locator("th:nth-child(7) button").click()
    passed = [int(t) for t in table.locator("tbody td:nth-child(7)").all_inner_texts()]
    assert passed == sorted(passed, reverse=True)


def test_a_run_page_filters_by_check_agent_flaky_and_cause(
    runs: Runs, viewer: Viewer, browser: Any
) -> None:
    page, _ = open_page(browser, f"{viewer.root()}/runs/{runs.repeated}")
    assert page.inner_text("#case-count") == "5 shown of 5 matching (5 cases, 10 repetitions)"
    page.check("#flaky-filter")
    assert _ids(page, "tr.case-row") == ["greet"]
    page.uncheck("#flaky-filter")
    page.select_option("#check-filter", "not_contains")
    assert _ids(page, "tr.case-row") == ["receipt-md"]
    assert "check: does not contain" in page.inner_text("#check-filter")
    page.select_option("#check-filter", "")
    page.select_option("#agent-filter", "target")
    assert len(_ids(page, "tr.case-row")) == 5
    # The failed repetitions' cause: a flake (another repetition of the case passed).
    options = page.eval_on_selector_all("#cause-filter option", "els => els.map(e => e.value)")
    assert [o for o in options if o] == ["flake"]
    page.select_option("#cause-filter", "flake")
    assert _ids(page, "tr.case-row") == ["greet"]
    page.select_option("#cause-filter", "")
    page.click("button[data-status=failed]")
    assert _ids(page, "tr.case-row") == ["greet"]
    _no_codes(page)


def test_each_judged_assertion_shows_the_judges_prompt_and_reply(
    runs: Runs, viewer: Viewer, browser: Any
) -> None:
    page, _ = open_page(browser, f"{viewer.root()}/runs/{runs.now}/case?id=judged")
    # (The prompt, once opened, is as the judge read it: its own words are not ours.)
    _no_codes(page)
    page.click("details.judge-prompt summary")
    prompt = page.inner_text("details.judge-prompt pre")
    assert "polite" in prompt and "Hello, how can I help you today?" in prompt
    assert "[system]" in prompt and "[user]" in prompt
    page.click("details.judge-reply summary")
    said = json.loads(page.inner_text("details.judge-reply pre"))
    assert said["passed"] is False and said["reason"] == JUDGE_NO
    _safe(page)


@pytest.mark.parametrize("size", [(800, 900), (390, 844)], ids=["800px", "phone"])
def test_no_page_is_wider_than_the_window(
    runs: Runs, viewer: Viewer, browser: Any, size: tuple[int, int]
) -> None:
    root = viewer.root()
    context = browser.new_context(viewport={"width": size[0], "height": size[1]})
    try:
        page = context.new_page()
        for path in [
            "/",
            f"/runs/{runs.repeated}",
            f"/runs/{runs.now}/case?id=judged",
            f"/runs/{runs.now}/diff",
            f"/compare?a={runs.first}&b={runs.now}",
            f"/compare/case?a={runs.first}&b={runs.now}&id=receipt-md",
        ]:
            page.goto(f"{root}{path}")
            page.wait_for_selector("#app[data-ready=true]")
            wide = page.evaluate("() => document.scrollingElement.scrollWidth")
            assert wide <= size[0], (path, wide)
        page.goto(runs.report.as_uri())
        page.wait_for_selector("#app[data-ready=true]")
        assert page.evaluate("() => document.scrollingElement.scrollWidth") <= size[0]
    finally:
        context.close()


def test_the_screenshot_script_draws_every_page(tmp_path: Path) -> None:
    """docs/make_screenshots.py, as a person runs it, into a folder of the test's."""
    import subprocess
    import sys

    script = Path(__file__).parent.parent / "docs" / "make_screenshots.py"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("runs.png", "compare.png", "side-by-side.png", "report-baseline.png"):
        path = tmp_path / name
        assert path.exists(), name
        assert 10_000 < path.stat().st_size < 300_000, (name, path.stat().st_size)


def test_codes_have_words_by_kind_and_unknown_ones_lose_their_underscores() -> None:
    from agenttest_worker.report import worded_label, words

    assert words("awaiting", "content_is_question") == "the reply asks a question"
    # One code, two kinds: an `agent` check is a judge's; an `agent` cause is the agent.
    assert words("assertion", "agent") == "judge" and words("cause", "agent") == "the agent"
    assert words("stop", "some_new_reason") == "some new reason"
    assert worded_label('not_contains "x"') == 'does not contain "x"'
    assert worded_label("agent: polite") == "judge: polite"
    assert worded_label("$.total = 3") == "$.total = 3"  # a json_path label has no code


def test_the_wilson_interval_holds_the_rate_and_stays_within_0_and_1() -> None:
    from agenttest_submit.commands.viewer.analysis import wilson

    low, high = wilson(9, 10)
    assert 0.59 < low < 0.6 and 0.98 < high < 0.99
    assert wilson(10, 10)[1] == 1.0 and wilson(0, 10)[0] == 0.0
    assert wilson(0, 0) == (0.0, 1.0)
