"""The pytest plugin (entry point `agenttest` in the `pytest11` group): agenttest cases
as pytest tests.

Collected, and nothing else: files named `*.agenttest.jsonl`, `*.agenttest.json`,
`*.agenttest.yaml` or `*.agenttest.yml` wherever pytest looks (`pytest cases/`), and
every case file (`.jsonl`, `.json`, `.yaml`, `.yml`) under a path given to
`--agenttest PATH`, which pytest then collects instead of its `testpaths`. A project's
own test data under other names is never read. Each case is an item `FILE::CASE_ID`
(so `-k`, `--lf`, `--deselect` and JUnit's names are the case ids) with a marker per
tag (registered as collected: `-m smoke` works under `--strict-markers`).

Each item is its own run of that one case (`agenttest-submit -i FILE --id CASE_ID`),
embedded, or on the fleet when AGENTTEST_BROKER_URL names one, stored like any run: an
item that stops on `-x` leaves no case of the session played that pytest does not
report, and xdist's workers share the items without sharing a run. A failed case's
message is its conversation's tree as the console report shows it; a skipped case is
skipped with its reason; a case file with errors is a collection error naming the
file, line and field.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# A tag pytest can take as a marker's name (an ini `markers` line is "NAME: text"):
# others stay keywords only.
_MARKER_NAME = re.compile(r"[A-Za-z][\w.-]*")
PATTERN_SUFFIXES = (".agenttest.jsonl", ".agenttest.json", ".agenttest.yaml", ".agenttest.yml")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("agenttest", "agenttest cases as tests")
    group.addoption(
        "--agenttest",
        action="append",
        default=[],
        metavar="PATH",
        help="collect every case file under PATH as agenttest cases (repeatable)",
    )
    group.addoption(
        "--agenttest-config",
        default=None,
        metavar="FILE",
        help="the agenttest.yaml the cases run with (default: found as agenttest-submit does)",
    )
    group.addoption(
        "--agenttest-agent",
        default=None,
        metavar="NAME",
        help="the target agent (agenttest-submit -n; default: agenttest.yaml's)",
    )


def pytest_configure(config: pytest.Config) -> None:
    paths: list[str] = config.getoption("agenttest")
    if not paths:
        return
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        # No paths on the command line: the cases, not the project's testpaths.
        config.args[:] = []
    config.args.extend(str(Path(p).resolve()) for p in paths)


def _asked_for(file_path: Path, config: pytest.Config) -> bool:
    if file_path.name.lower().endswith(PATTERN_SUFFIXES):
        return True
    given_paths: list[str] = config.getoption("agenttest")
    if not given_paths:
        return False
    # Imported here: the case readers only for a session given --agenttest.
    from agenttest_worker.cases import CASE_SUFFIXES

    if file_path.suffix.lower() not in CASE_SUFFIXES or file_path.name in (
        "agenttest.yaml",
        "agenttest.yml",
    ):
        return False
    for given in given_paths:
        root = Path(given).resolve()
        if file_path == root or root in file_path.parents:
            return True
    return False


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if _asked_for(file_path.resolve(), parent.config):
        return CaseFile.from_parent(parent, path=file_path)
    return None


class CaseFile(pytest.File):
    """A case file: an item per case, or a collection error listing its problems."""

    def collect(self) -> Iterator[pytest.Item]:
        from agenttest_worker.cases import Case, iter_cases
        from agenttest_worker.errors import InputProblem

        cases: list[Case] = []
        problems: list[str] = []
        for found in iter_cases(self.path):
            if isinstance(found, InputProblem):
                problems.append(str(found))
            else:
                cases.append(found)
        if problems:
            raise self.CollectError("\n".join(problems))
        seen: set[str] = set()
        for case in cases:
            if case.id in seen:
                continue  # a case with repeat: is one item, its verdict
            seen.add(case.id)
            item = CaseItem.from_parent(self, name=case.id, line=case.source_line)
            for tag in case.tags:
                # Every tag is a keyword (-k); one a marker can be named by, a marker (-m).
                item.extra_keyword_matches.add(tag)
                if _MARKER_NAME.fullmatch(tag):
                    _register_marker(self.config, tag)
                    item.add_marker(tag)
            yield item


def _register_marker(config: pytest.Config, tag: str) -> None:
    known = config.getini("markers")
    line = f"{tag}: agenttest cases tagged {tag!r}"
    if line not in known:
        config.addinivalue_line("markers", line)


@contextlib.contextmanager
def _not_on_github() -> Iterator[None]:
    """A run per item writes no GitHub step summary or outputs: on GitHub, the session's
    results are pytest's (its JUnit report), not one summary per case."""
    was = os.environ.get("GITHUB_ACTIONS")
    os.environ["GITHUB_ACTIONS"] = "false"
    try:
        yield
    finally:
        if was is None:
            del os.environ["GITHUB_ACTIONS"]
        else:
            os.environ["GITHUB_ACTIONS"] = was


class CaseFailed(Exception):
    """A case that did not pass, with the console report's tree of its conversation."""


class CaseItem(pytest.Item):
    """One case of a case file, played as a run of its own."""

    def __init__(self, *, line: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.line = line

    def runtest(self) -> None:
        # The submitter is imported where it is used: collecting needs none of it.
        from agenttest_submit.cli.main import main
        from agenttest_worker.report import case_text, problems
        from agenttest_worker.results import CaseResult

        with tempfile.TemporaryDirectory(prefix="agenttest-pytest-") as folder:
            output = Path(folder) / "results.jsonl"
            argv = ["-i", str(self.path), "--id", self.name, "-o", str(output)]
            argv += ["--format", "jsonl"]
            if config_file := self.config.getoption("agenttest_config"):
                argv += ["--config", config_file]
            if agent := self.config.getoption("agenttest_agent"):
                argv += ["-n", agent]
            said = io.StringIO()
            with (
                contextlib.redirect_stdout(said),
                contextlib.redirect_stderr(said),
                _not_on_github(),
            ):
                code = main(argv)
            text = output.read_text(encoding="utf-8") if output.exists() else ""
        records = [CaseResult.model_validate_json(line) for line in text.splitlines() if line]
        if code == 0 and records:
            return
        failed = [r for r in records if r.status == "failed"]
        if failed:
            raise CaseFailed("".join(case_text(r) for r in failed))
        if records and all(r.status == "skipped" for r in records):
            pytest.skip(next(problems(records[0]), "skipped"))
        raise CaseFailed(f"agenttest-submit exited {code}:\n{said.getvalue()}")

    def repr_failure(
        self,
        excinfo: pytest.ExceptionInfo[BaseException],
        style: Any = None,
    ) -> str | Any:
        if isinstance(excinfo.value, CaseFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        # pytest's lines count from 0.
        return self.path, (self.line - 1 if self.line else None), f"agenttest case {self.name}"
