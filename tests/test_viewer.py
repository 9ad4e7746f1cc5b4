"""`agenttest-submit view`: the read-only viewer, checked in headless Chromium and over HTTP.

The viewer runs as a user starts it (`agenttest-submit view --port 0` in a child
process) over the store of a real run against a scripted agent whose replies, tool
calls, judge reasons and case names carry XSS payloads: embedded (SQLite) here, and on
a fleet (Postgres, marked `fleet`). The pages list the runs, a run's cases (sorted,
filtered, searched), its progress live while it runs, and a case's conversation with
every payload shown as text; nothing runs, nothing is fetched from elsewhere, every
response has a Content-Security-Policy, nothing but GET is answered (but a label's POST,
tests/test_judge_audit.py), and a non-loopback address is refused without a token.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser import (
    IMG,
    LISTED,
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
from fleet import Fleet, fleet_on, lines_read, wait_until
from scripted_agent import ScriptedAgent, say

TOKEN = "s3cret-viewer-token"
_LISTENING = re.compile(r"agenttest viewer: (http://\S+)")


class Viewer:
    """`agenttest-submit view ARGS` in a child process; `url` once it listens."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "agenttest_submit.cli", "view", *args],
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.lines, _ = lines_read(self.process.stderr)

    def url(self) -> str:
        def listening() -> str | None:
            if self.process.poll() is not None and not self.lines:
                raise AssertionError(f"the viewer exited with {self.process.returncode}")
            found = [m.group(1) for m in map(_LISTENING.search, self.lines) if m]
            return found[0] if found else None

        found: str = wait_until(listening, 20, "the viewer to listen", step=0.05)
        return found

    def root(self) -> str:
        match = re.match(r"http://[^/]+", self.url())
        assert match
        return match.group(0)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


class Run:
    def __init__(self, folder: Path, env: dict[str, str], run_id: str) -> None:
        self.folder, self.env, self.run_id = folder, env, run_id


def _run_id(console: str) -> str:
    match = re.search(r"ℹ Run: (\S+)", console)
    assert match, console
    return match.group(1)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The XSS run, embedded: its store is the SQLite file under the folder's home."""
    folder = tmp_path_factory.mktemp("viewer")
    with ScriptedAgent() as agent:
        cases, config = xss_project(folder, agent)
        env = environment(folder / ".agenttest")
        done = submit(["-i", str(cases), "-n", "target", "--config", str(config)], env, folder)
        assert done.returncode == 1, done.stderr
        yield Run(folder, env, _run_id(done.stdout))


@pytest.fixture(scope="module")
def viewer(run: Run) -> Iterator[Viewer]:
    started = Viewer(["--port", "0"], run.env, run.folder)
    try:
        started.url()
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


def _listed(page: Any) -> list[tuple[str, str]]:
    return [
        (row.get_attribute("data-case-id"), row.query_selector(".badge").inner_text().lower())
        for row in page.query_selector_all("tr.case-row")
    ]


def _rows(page: Any, count: int) -> None:
    page.wait_for_function(f"() => document.querySelectorAll('tr.case-row').length === {count}")


def _local(seen: list[str], root: str) -> None:
    assert seen and all(url.startswith(f"{root}/") for url in seen), seen


def test_the_runs_page_lists_the_run_and_opens_it(run: Run, viewer: Viewer, browser: Any) -> None:
    page, seen = open_page(browser, f"{viewer.root()}/")
    assert page.title() == "agenttest · runs"
    group = page.inner_text("section.suite h2")
    assert group  # the run's suite (or its inputs)
    page.click(f"a:text('{run.run_id}')")
    page.wait_for_url(f"**/runs/{run.run_id}")
    page.wait_for_selector("tr.case-row")
    assert _listed(page) == LISTED
    _local(seen, viewer.root())


def test_a_run_page_filters_and_searches(run: Run, viewer: Viewer, browser: Any) -> None:
    page, seen = open_page(browser, f"{viewer.root()}/runs/{run.run_id}")
    assert _listed(page) == LISTED
    cards = page.inner_text(".cards")
    assert "7\ncases" in cards and "2\nfailed" in cards and "1\nskipped" in cards
    page.click("button[data-status=skipped]")
    assert _listed(page) == [("xss-ask", "skipped")]
    page.click("button[data-status=all]")
    page.select_option("#tag-filter", "judge")
    assert _listed(page) == [("xss-judge", "failed")]
    page.select_option("#tag-filter", "")
    page.fill("#search", "NOT POLITE")  # searched by the server, in the judge's reason
    _rows(page, 1)
    assert _listed(page) == [("xss-judge", "failed")]
    page.fill("#search", "")
    _rows(page, 7)
    # Finished: no progress bar, and the page stops asking.
    assert page.evaluate("() => document.body.dataset.runStatus") == "done"
    assert page.is_hidden("#progress")
    screenshot(page, run.folder / "artifacts", "viewer.png", docs=True)
    not_pwned(page, f"agenttest · run {run.run_id}")
    _local(seen, viewer.root())


def test_case_pages_show_every_payload_as_text(run: Run, viewer: Viewer, browser: Any) -> None:
    page, seen = open_page(browser, f"{viewer.root()}/runs/{run.run_id}")
    page.click("tr[data-case-id=xss-tool]")
    page.wait_for_url("**/case?id=xss-tool")
    page.wait_for_selector("#conversation")
    text = page.inner_text("#conversation")
    assert f"Tool {SCRIPT}" in text and TEXTAREA in text and SCRIPT_END in text
    assert "Tool lookup (mocked result)" in text
    screenshot(page, run.folder / "artifacts", "viewer-conversation.png")
    not_pwned(page, "agenttest · case")
    for case, expected in [
        ("xss-reply", f"Reply {IMG}"),
        ("xss-judge", f"The reply was not polite: {SCRIPT_END} {IMG}"),
        ("xss-ask", f"Input hint: {IMG}"),
    ]:
        page.goto(f"{viewer.root()}/runs/{run.run_id}/case?id={case}")
        page.wait_for_selector("#conversation")
        assert expected in page.inner_text("#conversation")
        not_pwned(page, "agenttest · case")
    page.goto(f"{viewer.root()}/runs/{run.run_id}/case?id=nope")
    page.wait_for_selector("#app[data-ready=true]")
    assert "no case nope" in page.inner_text("#app")
    _local(seen, viewer.root())


def test_the_api_serves_json_with_a_policy_on_every_response(run: Run, viewer: Viewer) -> None:
    root = viewer.root()
    api = f"{root}/api/runs/{run.run_id}"
    with httpx.Client() as client:
        runs = client.get(f"{root}/api/runs").json()
        assert run.run_id in [r["id"] for g in runs["groups"] for r in g["runs"]]
        header = client.get(api).json()
        assert header["status"] == "done" and header["summary"]["failed"] == 2
        assert header["progress"] == {
            "unit": "cases",  # no case repeats: its conversations are its cases
            "total": 7,
            "finished": 7,
            "passed": 4,
            "failed": 2,
            "skipped": 1,
            "played_turns": 7,
        }
        rows = client.get(f"{api}/cases").json()["rows"]
        assert [(r["id"], r["status"]) for r in rows] == LISTED
        assert client.get(f"{api}/cases", params={"q": "polite"}).json() == {"ids": ["xss-judge"]}
        case = client.get(f"{api}/case", params={"id": "xss-tool"}).json()
        record, notes = case["records"][0]
        assert record["turns"][0]["tool_calls"][0]["args"] == {"query": SCRIPT_END, "html": IMG}
        assert notes["labels"] == [['tool called "lookup"']]  # in words, not the code
        assert client.get(f"{api}/case", params={"id": "nope"}).status_code == 404
        assert client.get(f"{root}/api/runs/nope").status_code == 404
        for path in [
            "/",
            f"/runs/{run.run_id}",
            f"/runs/{run.run_id}/case?id=x",
            "/api/runs",
            "/nowhere",
        ]:
            response = client.get(f"{root}{path}")
            policy = response.headers["Content-Security-Policy"]
            assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy, path
            assert response.headers["X-Content-Type-Options"] == "nosniff"
            if response.headers["Content-Type"].startswith("text/html"):
                assert re.search(r"script-src 'sha256-[^']+';", policy), policy


def test_nothing_but_get_is_answered(run: Run, viewer: Viewer) -> None:
    root = viewer.root()
    api = f"{root}/api/runs/{run.run_id}"
    with httpx.Client() as client:
        before = client.get(api).json()["progress"]
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            for url in (f"{root}/", api, f"{api}/cases", f"{root}/api/runs/{run.run_id}/cancel"):
                response = client.request(method, url, json={"status": "cancelled"})
                assert response.status_code == 405, (method, url)
                assert response.headers["Allow"] == "GET,HEAD"
        assert client.get(api).json()["progress"] == before

    from agenttest_submit.commands.viewer.web_app import make_app

    routes = make_app("sqlite://").router.routes()
    assert {route.method for route in routes} == {"GET", "HEAD", "POST"}
    # The one route that writes: a person's label of a judged verdict (test_judge_audit.py).
    posts = [
        route.resource.canonical for route in routes if route.method == "POST" and route.resource
    ]
    assert posts == ["/api/runs/{run}/labels"]


def test_a_request_for_another_host_is_refused(viewer: Viewer) -> None:
    """A page elsewhere reaching 127.0.0.1 through a rebound DNS name sends its own
    name as Host: refused, so it cannot read the runs."""
    response = httpx.get(f"{viewer.root()}/api/runs", headers={"Host": "evil.example:80"})
    assert response.status_code == 421
    assert "runs" not in response.text


def test_a_viewer_bound_to_another_loopback_address_answers_on_it(run: Run) -> None:
    """`--host 127.0.0.2` is loopback, so no token is needed, and a request to that
    address names it as Host: answered, while another name is still refused."""
    viewer = Viewer(["--host", "127.0.0.2", "--port", "0"], run.env, run.folder)
    try:
        root = viewer.root()
        assert root.startswith("http://127.0.0.2:")
        answered = httpx.get(f"{root}/api/runs")
        assert answered.status_code == 200, answered.text
        assert run.run_id in answered.text
        refused = httpx.get(f"{root}/api/runs", headers={"Host": "evil.example"})
        assert refused.status_code == 421
        assert run.run_id not in refused.text
    finally:
        viewer.stop()


def test_a_non_loopback_address_needs_a_token(run: Run, browser: Any) -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "agenttest_submit.cli", "view", "--host", "0.0.0.0", "--port", "0"],
        env=run.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == 2
    assert "--token" in refused.stderr and "agenttest viewer:" not in refused.stderr

    served = Viewer(["--host", "0.0.0.0", "--port", "0", "--token", TOKEN], run.env, run.folder)
    try:
        port = served.url().rsplit(":", 1)[1].split("/")[0]
        root = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{root}/api/runs").status_code == 401
        assert httpx.get(f"{root}/", headers={"Authorization": "Bearer wrong"}).status_code == 401
        good = httpx.get(f"{root}/api/runs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert good.status_code == 200 and TOKEN not in good.text
        # A browser asks for basic auth; the token is the password.
        page, seen = open_page(
            browser,
            f"{root}/runs/{run.run_id}",
            http_credentials={"username": "me", "password": TOKEN},
        )
        assert _listed(page) == LISTED
        assert TOKEN not in page.content()
        _local(seen, root)
        assert TOKEN not in "".join(served.lines)
    finally:
        served.stop()


def test_a_running_run_shows_its_progress_live(tmp_path: Path, browser: Any) -> None:
    """The run page of a run still going refreshes itself: its progress moves and its
    cases appear as they finish, without reloading, until it is done."""
    with ScriptedAgent() as agent:
        # Every answer waits until the page is open (however long a busy machine takes to
        # open it), then comes 0.3 s after its question: the page sees the run moving.
        page_open = threading.Event()
        agent.script("slow", lambda body: say("Hello.", delay=0.3, hold=page_open))
        config = tmp_path / "agenttest.yaml"
        config.write_text(json.dumps({"agents": {"slow": agent.entry("slow", timeout=10)}}))
        cases = tmp_path / "cases.jsonl"
        lines = [
            {"id": f"c{n}", "input": "hi", "assertions": [{"type": "contains", "value": "Hello"}]}
            for n in range(5)
        ]
        cases.write_text("".join(json.dumps(c) + "\n" for c in lines))
        env = environment(tmp_path / ".agenttest")
        viewer = Viewer(["--port", "0"], env, tmp_path)
        running = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agenttest_submit.cli",
                "-i",
                str(cases),
                "-n",
                "slow",
                "--config",
                str(config),
                "--parallel",
                "1",
            ],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            root = viewer.root()

            def listed() -> str | None:
                groups = httpx.get(f"{root}/api/runs").json()["groups"]
                return groups[0]["runs"][0]["id"] if groups else None

            run_id = wait_until(listed, 20, "the run to be stored", step=0.05)
            page, seen = open_page(browser, f"{root}/runs/{run_id}")
            page.evaluate("() => { window.__same_page = true; }")
            assert page.evaluate("() => document.body.dataset.runStatus") in ("pending", "running")
            assert page.is_visible("#progress")
            # The progress moves while the page stays: at least one case later it says more.
            first = page.inner_text("#progress")
            page_open.set()
            page.wait_for_function(
                "(first) => document.getElementById('progress').innerText !== first", arg=first
            )
            page.wait_for_function(
                "() => document.body.dataset.runStatus === 'done'", timeout=30_000
            )
            _rows(page, 5)
            assert page.evaluate("() => window.__same_page") is True  # never reloaded
            assert "5\npassed" in page.inner_text(".cards")
            _local(seen, root)
            assert running.wait(30) == 0
        finally:
            page_open.set()
            if running.poll() is None:
                running.kill()
                running.wait(10)
            viewer.stop()


def test_a_diff_page_shows_what_changed_since_the_suites_previous_run(
    tmp_path: Path, browser: Any
) -> None:
    """Two runs of one suite, the second with the agent answering otherwise: the second
    run's page links to its diff, which lists the regression with what the agent said
    then and now (a payload, as text), and what still passes."""
    replies = {"greet": "Hello."}

    def target(body: dict[str, Any]) -> Any:
        return say(replies["greet"] if "greet" in str(body["messages"]) else "Hello there.")

    with ScriptedAgent() as agent:
        agent.script("target", target)
        config = tmp_path / "agenttest.yaml"
        config.write_text(json.dumps({"agents": {"target": agent.entry("target")}}))
        cases = tmp_path / "cases.jsonl"
        lines = [
            {
                "id": case,
                "input": f"{case} me",
                "assertions": [{"type": "contains", "value": "Hello"}],
            }
            for case in ("greet", "other")
        ]
        cases.write_text("".join(json.dumps(c) + "\n" for c in lines))
        env = environment(tmp_path / ".agenttest")
        args = ["-i", str(cases), "-n", "target", "--config", str(config)]
        first = submit(args, env, tmp_path)
        assert first.returncode == 0, first.stderr
        replies["greet"] = f"Bye. {SCRIPT}"
        second = submit(args, env, tmp_path)
        assert second.returncode == 1, second.stderr
    base, new = _run_id(first.stdout), _run_id(second.stdout)
    viewer = Viewer(["--port", "0"], env, tmp_path)
    try:
        page, seen = open_page(browser, f"{viewer.root()}/runs/{new}")
        page.click("p.compare a")
        page.wait_for_url(f"**/runs/{new}/diff")
        page.wait_for_selector("#app[data-ready=true]")
        assert base in page.inner_text("header")
        regression = page.inner_text("section[data-category=regression]")
        assert "greet" in regression and f"Now: Bye. {SCRIPT}" in regression
        assert "Then:" in regression and "Hello." in regression
        assert "other" in page.inner_text("section[data-category=still_passing]")
        not_pwned(page, "agenttest · diff")
        screenshot(page, tmp_path / "artifacts", "viewer-diff.png")
        api = httpx.get(f"{viewer.root()}/api/runs/{new}/diff").json()
        assert {c["id"]: c["category"] for c in api["cases"]} == {
            "greet": "regression",
            "other": "still_passing",
        }
        first_run = httpx.get(f"{viewer.root()}/api/runs/{base}/diff")
        assert first_run.status_code == 404 and "no finished run before" in first_run.text
        _local(seen, viewer.root())
    finally:
        viewer.stop()


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


@pytest.mark.fleet
def test_the_viewer_over_a_fleets_store(fleet: Fleet, tmp_path: Path, browser: Any) -> None:
    """The same pages over Postgres: a run on a one-worker fleet, watched until done."""
    fleet.start("view", concurrency=2)
    with ScriptedAgent() as agent:
        cases, config = xss_project(tmp_path / "project", agent)
        run_id = fleet.submit_no_wait(["-i", str(cases), "-n", "target", "--config", str(config)])
        viewer = Viewer(["--port", "0"], fleet.env, tmp_path)
        try:
            page, seen = open_page(browser, f"{viewer.root()}/runs/{run_id}")
            page.wait_for_function(
                "() => document.body.dataset.runStatus === 'done'", timeout=60_000
            )
            _rows(page, 7)
            assert _listed(page) == LISTED
            page.click("tr[data-case-id=xss-tool]")
            page.wait_for_selector("#conversation")
            text = page.inner_text("#conversation")
            assert f"Tool {SCRIPT}" in text and TEXTAREA in text and SCRIPT_END in text
            not_pwned(page, "agenttest · case")
            screenshot(page, tmp_path / "artifacts", "viewer-fleet.png")
            # A judged assertion keeps the judge's prompt and reply on a fleet too.
            page.goto(f"{viewer.root()}/runs/{run_id}/case?id=xss-judge")
            page.wait_for_selector("#conversation")
            page.click("details.judge-prompt summary")
            assert "[system]" in page.inner_text("details.judge-prompt pre")
            page.click("details.judge-reply summary")
            assert '"passed": false' in page.inner_text("details.judge-reply pre")
            not_pwned(page, "agenttest · case")
            _local(seen, viewer.root())
        finally:
            viewer.stop()
