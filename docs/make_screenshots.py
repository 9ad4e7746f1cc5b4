"""Draw the screenshots of docs/reading-results.md: the runs page, two runs compared,
a case side by side, and an HTML report with its baseline diff.

    python docs/make_screenshots.py [FOLDER]     # FOLDER: docs/ unless given

It plays four small runs of one suite against a scripted agent (tests/analysis_runs.py:
the CLI, embedded, in a temporary folder), starts `agenttest-submit view` over their
store and photographs each page in Debian's Chromium (tests/browser.py), 1100 px wide.
Needs the project installed with its dev extras (Playwright) and /usr/bin/chromium;
tests/test_viewer_compare.py runs it into a temporary folder to keep it working.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from analysis_runs import make_runs  # noqa: E402
from browser import chromium  # noqa: E402
from scripted_agent import ScriptedAgent  # noqa: E402
from test_viewer import Viewer  # noqa: E402

WIDTH = 1100


def main(folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work, ScriptedAgent() as agent:
        runs = make_runs(Path(work) / "project", agent)
        viewer = Viewer(["--port", "0"], runs.env, runs.folder)
        try:
            root = viewer.root()
            pages = {
                "runs.png": f"{root}/",
                "compare.png": f"{root}/compare?a={runs.first}&b={runs.now}",
                "side-by-side.png": f"{root}/compare/case?a={runs.first}&b={runs.now}&id=greet",
                "report-baseline.png": runs.report.as_uri(),
            }
            with chromium() as browser:
                context = browser.new_context(viewport={"width": WIDTH, "height": 800})
                page = context.new_page()
                for name, url in pages.items():
                    page.goto(url)
                    page.wait_for_selector("#app[data-ready=true]")
                    # The report: its top (the baseline diff and the summary) only.
                    whole = name != "report-baseline.png"
                    page.screenshot(path=str(folder / name), full_page=whole)
                    print(f"wrote {folder / name}")
                context.close()
        finally:
            viewer.stop()
    return 0


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent
    sys.exit(main(out))
