"""A large case file checked on two cores (agenttest_submit/split_check.py).

Its second half is checked by a child process; what the submitter reports and stores
must be what one process checking the whole file gives: every problem at its line, in
the same order, duplicates found across the halves, the same spool bytes. The files
here are small; SPLIT_BYTES is lowered so that they are split (the child is real).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agenttest_submit import split_check
from agenttest_submit.cli import main
from agenttest_submit.expand import CaseStream, Selection, Spool
from agenttest_submit.inputs import FileInput
from agenttest_worker.agents.config import ProjectConfig, load_config
from agenttest_worker.assertions import AssertionOutcome, AssertionSpec, register
from agenttest_worker.assertions.base import unregister
from agenttest_worker.cases.files import half_way
from agenttest_worker.errors import InputError

CONFIG = """\
agents:
  bench: {base_url: "http://127.0.0.1:9/v1"}
  judge: {base_url: "http://127.0.0.1:9/v1"}
defaults:
  judge: judge
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "agenttest.yaml").write_text(CONFIG, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def split(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(split_check, "SPLIT_BYTES", 0)


def case(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "id": f"c{i:05d}",
        "input": f"Hello, this is message {i}",
        "assertions": [{"type": "contains", "value": "Noted"}],
        **extra,
    }


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def many(count: int) -> list[str]:
    return [json.dumps(case(i)) for i in range(count)]


def spooled(
    path: Path, config: ProjectConfig, selection: Selection | None = None, **spool: Any
) -> tuple[Any, ...]:
    """What a run would store of the file (named as in the working directory, the
    project), or the problems it is rejected with."""
    stream = CaseStream([FileInput(Path(path.name))], config, target="bench", selection=selection)
    try:
        with Spool(stream, "bench", **spool) as sp:
            return sp.cases, sp.conversations, stream.warnings, sp.handle.read()
    except InputError as exc:
        return ("rejected", [str(p) for p in exc.problems])


def both_ways(monkeypatch: pytest.MonkeyPatch, path: Path, **kwargs: Any) -> Iterator[Any]:
    config = load_config(path.parent / "agenttest.yaml")
    for limit in (1 << 60, 0):
        monkeypatch.setattr(split_check, "SPLIT_BYTES", limit)
        yield spooled(path, config, **kwargs)


def dry_run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "-n", "bench", "--dry-run"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, err
    return code, out, err


def test_the_stored_cases_are_the_same_split_or_not(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = many(400)
    lines[10] = json.dumps(case(10, repeat=3))  # repetitions, in both halves
    lines[350] = json.dumps(case(350, repeat=2))
    lines[300] = json.dumps(case(300, options={"connector": "nowhere"}))  # a warning
    lines[301] = json.dumps(case(301, tags=["smoke"]))
    lines[200:200] = ["", "   "]  # blank lines keep their numbers
    path = write_lines(project / "cases.jsonl", lines)
    whole, split = both_ways(monkeypatch, path)
    assert whole == split
    assert whole[:2] == (400, 403)
    assert whole[2] == [
        "case c00300: connector 'nowhere' is not an agent in agenttest.yaml; the case's "
        "own target is used"
    ]
    assert b'"source_line": 353' in whole[3]  # c00350, past the blank lines
    # A selection, --repeat and --dry-run's records, too.
    selected = list(both_ways(monkeypatch, path, selection=Selection(tags=["smoke"])))
    assert selected[0] == selected[1] and selected[0][:2] == (1, 1)
    repeated = list(both_ways(monkeypatch, path, repeat=2))
    assert repeated[0] == repeated[1] and repeated[0][:2] == (400, 800)
    written = list(both_ways(monkeypatch, path, sources=False))
    assert written[0] == written[1] and b"source_line" not in written[0][3]


def test_an_error_in_the_second_half_names_its_line(
    project: Path, split: None, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = many(300)
    lines[250] = '{"id": "bad", "input": '  # line 251
    lines[280] = json.dumps(case(280, assertions=[{"type": "containz", "value": "x"}]))
    write_lines(project / "cases.jsonl", lines)
    code, out, err = dry_run(capsys, "-i", "cases.jsonl")
    assert code == 2 and out == ""
    assert err.splitlines()[1:] == [
        "  cases.jsonl:251: invalid JSON: Expecting value (column 24)",
        "  cases.jsonl:281 (test 'c00280'): assertions[0]: unknown assertion type "
        "'containz' (known: contains, equals, regex, json_path, type, tool_called, agent, "
        "script, latency)",
    ]


def test_duplicates_across_the_halves_are_found(
    project: Path, split: None, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = many(300)
    lines[5] = json.dumps(case(5, typo=1))  # a bad case still takes its id
    lines[260] = json.dumps(case(3))  # of the first half
    lines[270] = json.dumps(case(5, agent="nobody"))
    lines[290] = json.dumps(case(262))  # of the second half itself
    write_lines(project / "cases.jsonl", lines)
    code, _, err = dry_run(capsys, "-i", "cases.jsonl")
    assert code == 2
    # The duplicate's own problems are not reported: it is not checked past its id.
    assert err.splitlines()[1:] == [
        "  cases.jsonl:6 (test 'c00005'): typo: unknown field (a typo?)",
        "  cases.jsonl:261: id: duplicate id 'c00003' (first defined at cases.jsonl:4)",
        "  cases.jsonl:271: id: duplicate id 'c00005' (first defined at cases.jsonl:6)",
        "  cases.jsonl:291: id: duplicate id 'c00262' (first defined at cases.jsonl:263)",
    ]


def test_every_problem_is_listed_in_the_same_order_split_or_not(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = many(600)
    for i in range(0, 600, 37):
        lines[i] = json.dumps(case(i, agent="nobody"))
    for i in range(5, 600, 53):
        lines[i] = json.dumps(case(i % 40))  # duplicates, some across the halves
    lines[333] = "[1, 2"
    lines[444] = json.dumps([1, 2])
    lines[555] = json.dumps(case(555, turns=[{"input": "x"}]))  # two forms at once
    lines[590] = json.dumps(case(590, repeat=2))
    lines[591] = json.dumps(case(591, id="c00590#2"))  # a repetition key's clash
    path = write_lines(project / "cases.jsonl", lines)
    whole, split = both_ways(monkeypatch, path)
    assert whole[0] == "rejected" and len(whole[1]) > 25
    assert whole == split


def test_a_repetition_key_taken_in_the_other_half_is_refused(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = many(300)
    lines[1] = json.dumps(case(1, id="T#2"))
    lines[280] = json.dumps(case(280, id="T", repeat=2))
    path = write_lines(project / "cases.jsonl", lines)
    whole, split = both_ways(monkeypatch, path)
    assert (
        whole
        == split
        == (
            "rejected",
            [
                "test 'T#2': id: case id 'T#2' is also the key of repetition 2 of case 'T': "
                "rename it"
            ],
        )
    )


def test_bytes_that_are_no_text_and_crlf_in_the_second_half(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [line.encode() for line in many(300)]
    lines[270] = b'{"id": "x\xff", "input": "a"}'
    raw = b"\xef\xbb\xbf" + b"\r\n".join(lines) + b"\r\n"
    path = project / "cases.jsonl"
    path.write_bytes(raw)
    start, line = half_way(path) or (0, 0)
    assert raw[start - 2 : start] == b"\r\n" and line == raw[:start].count(b"\n") + 1
    whole, split = both_ways(monkeypatch, path)
    assert (
        whole
        == split
        == ("rejected", ["cases.jsonl:271: not valid UTF-8 (byte 10): save the file as UTF-8"])
    )


def child_part(path: Path) -> split_check.CheckedPart | None:
    """The second half of `path` as the child checks it (None if it could not)."""
    config = load_config(path.parent / "agenttest.yaml")
    checker = CaseStream([], config, target="bench").checker
    half = split_check.start_second_half(path, checker, split_check.SpoolShape("bench"))
    assert half is not None
    with half:
        part = half.finish()
        if part is not None:
            assert all(isinstance(event, tuple) for event in part.events())
        return part


def test_the_child_checks_the_second_half(project: Path, split: None) -> None:
    """The other tests would pass as well if the submitter checked every half itself."""
    path = write_lines(project / "cases.jsonl", many(300))
    start, line = half_way(path) or (0, 0)
    assert path.read_bytes()[:start].count(b"\n") == line - 1 and 120 < line < 180
    part = child_part(path)
    assert part is not None and part.totals is not None
    assert part.totals.cases == part.totals.conversations == 300 - line + 1


def test_a_type_registered_here_is_checked_here(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh process does not know an assertion type registered at run time (a
    plugin's, a test's): the submitter checks that half itself, with the same result."""
    from typing import Literal

    class Shouty(AssertionSpec):
        type: Literal["shouty"]

    @register(Shouty)
    def shouty(spec: Shouty, ctx: Any) -> AssertionOutcome:  # pragma: no cover
        raise AssertionError("not run")

    try:
        lines = many(300)
        lines[290] = json.dumps(case(290, assertions=[{"type": "shouty"}]))
        path = write_lines(project / "cases.jsonl", lines)
        monkeypatch.setattr(split_check, "SPLIT_BYTES", 0)
        assert child_part(path) is None
        whole, split = both_ways(monkeypatch, path)
        assert whole == split and whole[0] == 300 and b'"shouty"' in whole[3]
    finally:
        unregister("shouty")


def test_small_files_and_other_kinds_are_not_split(project: Path) -> None:
    config = load_config(project / "agenttest.yaml")
    checker = CaseStream([], config, target="bench").checker
    shape = split_check.SpoolShape("bench")
    small = write_lines(project / "small.jsonl", many(100))
    assert split_check.start_second_half(small, checker, shape) is None
    pretty = project / "pretty.jsonl"  # not read a line at a time
    pretty.write_text(json.dumps([case(i) for i in range(100)], indent=2), encoding="utf-8")
    assert half_way(pretty) is None
    one = write_lines(project / "one.jsonl", many(1))
    assert half_way(one) is None  # no second half


def test_a_file_over_the_limit_through_the_console_script(project: Path) -> None:
    """At the real limit, through the installed script: split (a few long cases make
    the file large), its problems listed, exit 2, no traceback."""
    script = Path(sys.executable).with_name("agenttest-submit")
    padding = "x" * 8000
    lines = [json.dumps(case(i, name=padding)) for i in range(1100)]
    lines[1000] = json.dumps(case(1000, name=padding, agent="nobody"))
    lines[1050] = json.dumps(case(7, name=padding))
    path = write_lines(project / "big.jsonl", lines)
    assert path.stat().st_size >= split_check.SPLIT_BYTES
    assert (half_way(path) or (0, 0))[1] < 1000
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")}
    result = subprocess.run(
        [str(script), "-i", "big.jsonl", "-n", "bench", "--dry-run"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "agenttest-submit: 2 input problems; nothing was run:\n"
        f"  big.jsonl:1001 (test 'c01000'): agent: unknown agent 'nobody' in "
        f"{project / 'agenttest.yaml'} (known: bench, judge)\n"
        "  big.jsonl:1051: id: duplicate id 'c00007' (first defined at big.jsonl:8)\n"
    )


def test_a_line_over_the_limit_across_the_middle(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The middle falls inside a line too long to read: the first half ends with it."""
    lines = many(100)
    lines.append(json.dumps(case(100, name="x" * (9 << 20))))
    lines += [json.dumps(case(i)) for i in range(101, 200)]
    lines[150] = json.dumps(case(3))
    path = write_lines(project / "cases.jsonl", lines)
    start, line = half_way(path) or (0, 0)
    assert line == 102 and start == path.read_bytes().index(b"\n", 9 << 20) + 1
    whole, split = both_ways(monkeypatch, path)
    assert (
        whole
        == split
        == (
            "rejected",
            [
                "cases.jsonl:101: line is 9.4 MB; a case may be at most 8 MB",
                "cases.jsonl:151: id: duplicate id 'c00003' (first defined at cases.jsonl:4)",
            ],
        )
    )
