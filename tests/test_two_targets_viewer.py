"""Two targets of one run in the viewer: `/api/compare?run=R&a=A&b=B` is the target
diff's JSON (as `diff R --targets A B`), the run's page links to it, and the compare
page shows the two targets as A | B, in headless Chromium.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser import chromium, environment, open_page, submit
from scripted_agent import ScriptedAgent
from test_two_targets import CASES, _bad
from test_viewer import Viewer


@pytest.fixture
def run(tmp_path: Path) -> Iterator[tuple[str, dict[str, str], Path]]:
    with ScriptedAgent() as agent:
        agent.script("good", lambda body: "right answer")
        agent.script("bad", _bad)
        entries = {name: agent.entry(name, max_retries=0) for name in ("good", "bad")}
        config = tmp_path / "agenttest.yaml"
        config.write_text(json.dumps({"agents": entries}), encoding="utf-8")
        cases = tmp_path / "cases.jsonl"
        cases.write_text("".join(json.dumps(c) + "\n" for c in CASES), encoding="utf-8")
        env = environment(tmp_path / ".agenttest")
        args = ["-i", str(cases), "--config", str(config), "-n", "good", "-n", "bad"]
        done = submit(args, env, tmp_path)
        assert done.returncode == 1, done.stdout + done.stderr
    listed = submit(["runs", "--format", "json"], env, tmp_path)
    yield str(json.loads(listed.stdout)[0]["run_id"]), env, tmp_path


@pytest.fixture
def viewer(run: tuple[str, dict[str, str], Path]) -> Iterator[Viewer]:
    _, env, folder = run
    started = Viewer(["--port", "0"], env, folder)
    try:
        started.url()
        yield started
    finally:
        started.stop()


def test_the_viewer_compares_two_targets_of_a_run(
    run: tuple[str, dict[str, str], Path], viewer: Viewer
) -> None:
    run_id = run[0]
    root = viewer.root()
    found = httpx.get(f"{root}/api/compare", params={"run": run_id, "a": "good", "b": "bad"})
    assert found.status_code == 200, found.text
    document = found.json()
    assert document["labels"] == ["A: good", "B: bad"]
    assert document["targets"] == {"base": "good", "new": "bad"}
    categories = {c["id"]: c["category"] for c in document["cases"]}
    assert categories == {"T1": "still_passing", "T2": "regression", "T3": "still_passing"}
    [t2] = [c for c in document["cases"] if c["id"] == "T2"]
    assert t2["agent"] == "bad"
    missing = httpx.get(f"{root}/api/compare", params={"run": run_id, "a": "good", "b": "nosuch"})
    assert missing.status_code == 404 and "nosuch" in missing.json()["message"]
    header = httpx.get(f"{root}/api/runs/{run_id}").json()
    assert header["targets"] == ["good", "bad"] and header["agent"] == "good, bad"
    # A case's page holds its conversation with each target.
    case = httpx.get(f"{root}/api/runs/{run_id}/case", params={"id": "T2"}).json()
    assert sorted(r[0]["agent"] for r in case["records"]) == ["bad", "good"]


def test_the_compare_page_shows_a_and_b_in_chromium(
    run: tuple[str, dict[str, str], Path], viewer: Viewer
) -> None:
    run_id = run[0]
    with chromium() as browser:
        page: Any
        page, _ = open_page(browser, f"{viewer.root()}/runs/{run_id}")
        # A row per case and target, the target beside the id.
        cells = [c.inner_text() for c in page.query_selector_all("tr.case-row td.id")]
        assert sorted(cells) == sorted(f"T{n} @ {t}" for n in (1, 2, 3) for t in ("good", "bad"))
        facts = page.inner_text("header.run-header .facts")
        assert "Targets good | bad" in " ".join(facts.split())
        link = page.locator("#compare-targets")
        assert link.inner_text() == "Compare its targets: good | bad"
        link.click()
        page.wait_for_url(f"**/compare?run={run_id}&a=good&b=bad")
        page.wait_for_selector("#app[data-ready=true]")
        assert "A: good | B: bad" in page.inner_text("h1")
        rows = page.query_selector_all("tr.compare-row")
        # Newly failing first.
        assert [r.get_attribute("data-case-id") for r in rows] == ["T2", "T1", "T3"]
        assert page.get_attribute("tr.compare-row[data-case-id=T2] td.id a", "href") == (
            f"/runs/{run_id}/case?id=T2"
        )
