"""A report format registered with `agenttest_worker.report.register` can be chosen.

The CLI's `--format` choices (a run's and `report RUN --format`) are built from the
registry when the parser is built, so a format registered by a plugin is one
`--format NAME` away. Checked end to end: the bundled suite against the demo agents,
through `agenttest_submit.cli.main.main` in-process.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from agenttest_submit.cli.main import main
from agenttest_worker.report import REPORTERS, RunReport, register

SUITE = Path(__file__).resolve().parents[1] / "agenttest_worker" / "demo" / "suite"
SUITE_ARGS = [
    "-i",
    str(SUITE / "expense-suite.jsonl"),
    "-n",
    "assistants.expense",
    "--config",
    str(SUITE / "agenttest.yaml"),
]
NAME = "status-lines"


def _status_lines() -> ModuleType:
    """A reporter as small as a format module can be: one `render` function."""
    module = ModuleType(NAME)

    def render(run: RunReport) -> str:
        lines = [f"{result.id} {result.status}" for result in run.results]
        return f"run {run.run_id}\n" + "".join(f"{line}\n" for line in lines)

    module.render = render  # type: ignore[attr-defined]
    return module


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_registered_format_is_a_format_choice(
    demo_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("AGENTTEST_DEMO_URL", demo_url)
    monkeypatch.chdir(tmp_path)
    register(NAME, _status_lines())
    try:
        code, out, _ = _run(capsys, *SUITE_ARGS, "--format", NAME)
        assert code == 1  # the suite has a failing case, whatever the format
        run_line, *case_lines = out.splitlines()
        assert run_line.startswith("run ")
        assert case_lines == ["T001 passed", "T002 skipped", "T003 passed", "T004 failed"]

        code, out, err = _run(capsys, *SUITE_ARGS, "--format", NAME, "-o", "report.txt")
        assert code == 1
        assert "  Summary\n" in out, "with -o, stdout keeps the console report"
        written = (tmp_path / "report.txt").read_text(encoding="utf-8")
        assert written.splitlines()[1:] == case_lines
        assert "results written to report.txt" in err

        code, out, _ = _run(capsys, "report", "last", "--format", NAME)
        assert code == 1
        assert out.splitlines()[1:] == case_lines

        code, out, _ = _run(capsys, *SUITE_ARGS, "--help")
        assert code == 0
        assert f"jsonl,table,tsv,junit,html,markdown,{NAME}" in out, "the help lists every format"
    finally:
        del REPORTERS[NAME]

    code, _, err = _run(capsys, *SUITE_ARGS, "--format", NAME)
    assert code == 2
    assert f"invalid choice: '{NAME}'" in err
