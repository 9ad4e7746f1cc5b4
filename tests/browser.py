"""Headless Chromium for the page tests, and a run whose agents answer with XSS payloads.

    with chromium() as browser:               # Debian's /usr/bin/chromium, via Playwright
        page, seen = open_page(browser, url)  # `seen`: every URL the page requested
    cases, config = xss_project(folder, agent)

Chromium is required: a test that needs it fails (never skips) when it is missing, as
the service tests do (`.ci/run` installs it). Screenshots go to a folder pytest made
(printed), and those the README shows also to AGENTTEST_TEST_SCREENSHOTS when set: that
is how docs/*.png are made:

    AGENTTEST_TEST_SCREENSHOTS=docs pytest tests/test_html_report.py tests/test_viewer.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from scripted_agent import Body, Reply, ScriptedAgent, call, judge_verdict, last_user_text, say

CHROMIUM = os.environ.get("AGENTTEST_TEST_CHROMIUM", "/usr/bin/chromium")
# As root and on a closed network: no sandbox, and none of Chromium's own connections.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS_ENV = "AGENTTEST_TEST_SCREENSHOTS"

# Each would set window.__pwned or the title if anything ran it.
SCRIPT = "<script>window.__pwned = 'script'; document.title = 'pwned'</script>"
IMG = "<img src=x onerror=\"window.__pwned = 'img'; document.title = 'pwned'\">"
LINK = "<a href=\"javascript:window.__pwned='link'\">open</a> javascript:alert(1)"
TEXTAREA = "</textarea><script>window.__pwned = 'textarea'</script>"
SCRIPT_END = "</script><script>window.__pwned = 'end'</script><!--"
PAYLOADS = (SCRIPT, IMG, LINK, TEXTAREA, SCRIPT_END)


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (a fresh profile: Playwright makes one per launch)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        pytest.fail(
            f"playwright is required for the browser tests (pip install -e '.[dev]'): {exc}"
        )
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"Chromium is required at {CHROMIUM} for the browser tests "
            "(apt-get install chromium; .ci/run does)"
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser: Any, url: str, **context: Any) -> tuple[Any, list[str]]:
    """A new page at `url`, rendered (app.js marks #app ready); every URL it asked for
    is appended to the list returned, and a script error fails the test."""
    page = browser.new_context(viewport={"width": 1280, "height": 860}, **context).new_page()
    seen: list[str] = []
    errors: list[str] = []
    page.on("request", lambda request: seen.append(request.url))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url)
    page.wait_for_selector("#app[data-ready]")
    assert page.get_attribute("#app", "data-ready") == "true", page.inner_text("#app")
    assert not errors, errors
    return page, seen


def not_pwned(page: Any, title: str) -> None:
    """None of the payloads ran: no global set, the title as the page set it, no element
    a payload would have made."""
    assert page.evaluate("() => window.__pwned") is None
    assert page.title() == title
    assert page.evaluate("() => document.querySelectorAll('#app img, #app textarea').length") == 0
    links = page.evaluate("() => [...document.querySelectorAll('a')].map(a => a.href)")
    assert not [href for href in links if not href.startswith(("file:", "http://127.0.0.1"))]


def screenshot(page: Any, folder: Path, name: str, docs: bool = False) -> Path:
    """Keep a screenshot of the page (one the README shows, `docs`, is also copied to
    AGENTTEST_TEST_SCREENSHOTS)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    wanted = os.environ.get(SCREENSHOTS_ENV)
    if wanted and docs:
        Path(wanted).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(wanted) / name)
    return path


# -- the run ------------------------------------------------------------------------------


def _target(body: Body) -> Reply | str:
    messages = body.get("messages") or []
    if messages and messages[-1].get("role") == "tool":
        return say(f"The lookup said: {TEXTAREA}")
    text = last_user_text(body)
    if "tool" in text:
        return call("lookup", {"query": SCRIPT_END, "html": IMG})
    if "ask" in text:
        return say(f"Which amount? {SCRIPT}", awaiting_input=True, input_hint=IMG)
    if "xss" in text:
        return say(f"Hello! {SCRIPT} {IMG} {LINK}")
    return say("Hello. Nice to meet you.")


def _judge(body: Body) -> Reply:
    return judge_verdict(False, f"The reply was not polite: {SCRIPT_END} {IMG}")


def xss_cases() -> list[dict[str, Any]]:
    """Seven cases: two failed, one skipped, four passed; the payloads everywhere."""
    return [
        {
            "id": "xss-reply",
            "name": f"Reply {IMG}",
            "input": "xss please",
            "tags": ["xss", "reply"],
            "assertions": [{"type": "contains", "value": "Hello"}],
        },
        {
            "id": "xss-tool",
            "name": f"Tool {SCRIPT}",
            "input": "use the tool",
            "tags": ["xss", "tools"],
            "tool_mocks": {"lookup": {"result": SCRIPT_END, "more": TEXTAREA}},
            "assertions": [{"type": "tool_called", "name": "lookup"}],
        },
        {
            "id": "xss-judge",
            "name": "Judge reasons",
            "input": "xss again",
            "tags": ["xss", "judge"],
            "assertions": [
                {
                    "type": "agent",
                    "use": "agents:judge",
                    "options": {"metadata": {"criteria": LINK}},
                }
            ],
        },
        {
            "id": "xss-ask",
            "name": f"Asks {TEXTAREA}",
            "input": "ask me",
            # Multi-turn: its question unanswered, it is skipped (a single-turn case ends).
            "type": "multi_turn",
            "tags": ["xss"],
            "assertions": [{"type": "contains", "value": "amount"}],
        },
        {
            "id": "plain-fail",
            "input": "hello there",
            "tags": ["plain"],
            "assertions": [{"type": "contains", "value": "refund"}],
        },
        *(
            {
                "id": f"plain-{n}",
                # A right-to-left override: "hello 1 exe.txt" would read as a .txt.
                "input": f"hello {n}" + (" \u202etxt.exe" if n == 1 else ""),
                "tags": ["plain"],
                "assertions": [{"type": "contains", "value": "Hello"}],
            }
            for n in (1, 2)
        ),
    ]


# (id, status) in the order the pages list them: by status (failed, skipped, passed), then id.
LISTED = [
    ("plain-fail", "failed"),
    ("xss-judge", "failed"),
    ("xss-ask", "skipped"),
    ("plain-1", "passed"),
    ("plain-2", "passed"),
    ("xss-reply", "passed"),
    ("xss-tool", "passed"),
]


def xss_project(folder: Path, agent: ScriptedAgent) -> tuple[Path, Path]:
    """The cases file and agenttest.yaml of the XSS run, against `agent`."""
    agent.script("target", _target)
    agent.script("judge", _judge)
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "agenttest.yaml"
    agents = {
        "target": agent.entry("target", max_retries=0),
        "judge": agent.entry("judge", max_retries=0),
    }
    config.write_text(json.dumps({"agents": agents}), encoding="utf-8")
    cases = folder / "cases.jsonl"
    cases.write_text("".join(json.dumps(c) + "\n" for c in xss_cases()), encoding="utf-8")
    return cases, config


def environment(home: Path, **more: str) -> dict[str, str]:
    """This process's environment without AGENTTEST_ settings, the store under `home`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")}
    env.update({"AGENTTEST_HOME": str(home), "PYTHONUNBUFFERED": "1", **more})
    return env


def submit(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`agenttest-submit ARGS` in a child process (module-wide runs cannot use the
    per-test settings fixture)."""
    return subprocess.run(
        [sys.executable, "-m", "agenttest_submit.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
