"""The HTML report of a large run: its size against the JSONL's, and the time to write it.

    python -m benchmarks.html_report                 # 10,000 three-turn cases
    python -m benchmarks.html_report --cases 30000 --browser

Builds N finished three-turn cases (what a real run records per turn: the input, the
reply, a `contains` verdict, usage, the target call; one case in ten failed), held as
stored JSON text as `report RUN` holds them (report/report_model.py StoredResults), and renders
the JSONL report and the HTML report from them in the same process, best of --repeat.
Prints both sizes and their ratio (the HTML report must stay under 2x), and both times:
the JSONL report is the floor (parsing and writing every record once).

With --browser, the page is opened in headless Chromium (Debian's, via Playwright, as
the tests do) and the time until the table shows, a status filter, a text search (the
first one parses the embedded records) and opening a conversation are measured.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from agenttest_worker.report import render
from agenttest_worker.report.report_model import RunReport, StoredResults
from agenttest_worker.results import (
    AgentCallRecord,
    AssertionResult,
    CaseResult,
    RoleUsage,
    TurnResult,
    Usage,
)


def case(number: int) -> CaseResult:
    failed = number % 10 == 0
    turns = []
    for turn in (1, 2, 3):
        usage = Usage(prompt_tokens=120 * turn, completion_tokens=24, total_tokens=120 * turn + 24)
        passed = not (failed and turn == 3)
        reply = "Noted, thank you. Your expense is recorded." if passed else "Sorry, I cannot."
        turns.append(
            TurnResult(
                turn=turn,
                input=f"Message {turn} of case {number}: please file my expense",
                input_source="static",
                output=reply,
                assertions=[
                    AssertionResult(
                        type="contains",
                        value="Noted",
                        passed=passed,
                        reason='reply contains "Noted"' if passed else 'no "Noted" in the reply',
                    )
                ],
                status="passed" if passed else "failed",
                duration_ms=58,
                usage=usage,
                calls=[
                    AgentCallRecord(
                        role="target", agent="assistants.expense", latency_ms=57, usage=usage
                    )
                ],
            )
        )
    return CaseResult(
        id=f"case-{number:05d}",
        name=f"Expense flow {number}",
        status="failed" if failed else "passed",
        agent="assistants.expense",
        turns=turns,
        total_turns=3,
        duration_ms=174,
        tags=["expense", "nightly" if number % 2 else "smoke"],
        usage=Usage(prompt_tokens=720, completion_tokens=72, total_tokens=792),
        usage_by_role={
            "target": RoleUsage(calls=3, prompt_tokens=720, completion_tokens=72, total_tokens=792)
        },
        file="suite/expense.jsonl",
        line=number + 1,
    )


def report(cases: int) -> RunReport:
    texts = [case(n).to_json_line() for n in range(cases)]
    return RunReport(
        results=StoredResults.held(texts),
        agent="assistants.expense",
        input_label="suite/expense.jsonl",
        total_cases=cases,
        duration_s=300.0,
        run_id="bench-html",
    )


def best(repeat: int, fmt: str, run: RunReport) -> tuple[float, str]:
    times, text = [], ""
    for _ in range(repeat):
        started = time.perf_counter()
        text = render(fmt, run)
        times.append(time.perf_counter() - started)
    return min(times), text


def browser(path: Path) -> dict[str, float]:
    from playwright.sync_api import sync_playwright

    args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    args += ["--disable-component-update", "--disable-sync", "--no-first-run"]
    found: dict[str, float] = {}
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=args)
        page = chromium.new_page()

        def timed(name: str, action: Any, ready: str) -> None:
            started = time.perf_counter()
            action()
            page.wait_for_function(ready, timeout=120_000)
            found[name] = time.perf_counter() - started

        rows = "document.querySelectorAll('tr.case-row')"
        timed(
            "open",
            lambda: page.goto(path.as_uri()),
            "() => document.getElementById('app').dataset.ready",
        )
        timed(
            "filter failed",
            lambda: page.click("button[data-status=failed]"),
            f"() => [...{rows}].every(r => r.classList.contains('failed'))",
        )
        timed("search", lambda: page.fill("#search", "case 4240:"), f"() => {rows}.length === 1")
        page.fill("#search", "")
        page.wait_for_function(f"() => {rows}.length > 1")
        timed(
            "open a case",
            lambda: page.click("tr.case-row a"),
            "() => document.getElementById('conversation')",
        )
        chromium.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--browser", action="store_true", help="also open it in Chromium")
    options = parser.parse_args()
    run = report(options.cases)
    jsonl_s, jsonl = best(options.repeat, "jsonl", run)
    html_s, html = best(options.repeat, "html", run)
    jsonl_bytes, html_bytes = len(jsonl.encode()), len(html.encode())
    print(f"{options.cases:,} three-turn cases, best of {options.repeat}:")
    print(f"  jsonl  {jsonl_bytes / 1e6:7.2f} MB  written in {jsonl_s:6.2f} s")
    print(f"  html   {html_bytes / 1e6:7.2f} MB  written in {html_s:6.2f} s")
    print(f"  html/jsonl: size {html_bytes / jsonl_bytes:.2f}x, time {html_s / jsonl_s:.2f}x")
    if options.browser:
        with tempfile.TemporaryDirectory(prefix="html-report-") as folder:
            path = Path(folder) / "report.html"
            path.write_text(html, encoding="utf-8")
            for name, seconds in browser(path).items():
                print(f"  chromium: {name:<14} {seconds * 1000:7.0f} ms")


if __name__ == "__main__":
    main()
