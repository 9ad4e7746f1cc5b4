"""Bad and hostile case files: every problem names file, line (or test) and field, exit 2.

Checked through the real CLI (`agenttest_submit.cli.main.main` with capsys) and, once, through
the installed `agenttest-submit` console script in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from agenttest_submit.cli.main import main
from agenttest_worker.cases.case_model import Case
from agenttest_worker.cases.files import iter_cases, load_cases
from agenttest_worker.errors import InputError, InputProblem

CONFIG = """\
agents:
  assistants.expense: {base_url: "http://127.0.0.1:9/v1"}
  workers.test.validator: {base_url: "http://127.0.0.1:9/v1"}
  workers.test.user-sim: {base_url: "http://127.0.0.1:9/v1"}
defaults:
  judge: workers.test.validator
"""
KNOWN_TYPES = (
    "contains, equals, regex, not_contains, not_regex, json_path, type, tool_called, "
    "tool_not_called, agent, script, latency, tool_sequence, tool_count, turn_count, "
    "trace_tool_called, trace_span_count, trace_error_spans, trace_duration, "
    "not, any, all, golden"
)
HEADER_1 = "agenttest-submit: 1 input problem; nothing was run:\n"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "agenttest.yaml").write_text(CONFIG, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def jsonl(*cases: object) -> str:
    return "".join(json.dumps(c) + "\n" for c in cases)


def submit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "-n", "assistants.expense", "--dry-run"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, err
    return code, out, err


def problems_of(err: str) -> list[str]:
    lines = err.splitlines()
    assert lines[0].startswith("agenttest-submit: ") and lines[0].endswith("nothing was run:")
    assert all(line.startswith("  ") for line in lines[1:])
    return [line[2:] for line in lines[1:]]


def expect_input_error(capsys: pytest.CaptureFixture[str], source: str, *problems: str) -> None:
    code, out, err = submit(capsys, "-i", source)
    assert code == 2
    assert out == ""
    assert problems_of(err) == list(problems)
    count = len(problems)
    assert err.startswith(
        f"agenttest-submit: {count} input problem{'s' if count > 1 else ''}; nothing was run:\n"
    )


# -- the six bad inputs of the issue --------------------------------------------------------


def test_bad_json_on_line_7(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = [json.dumps({"id": f"C{i}", "input": "hi"}) for i in range(1, 7)]
    write(project / "bad.jsonl", "\n".join([*good, '{"id": "C7", "input": "hi",}', ""]))
    expect_input_error(
        capsys,
        "bad.jsonl",
        "bad.jsonl:7: invalid JSON: Expecting property name enclosed in double quotes (column 28)",
    )


def test_bad_json_on_line_7_through_the_console_script(project: Path) -> None:
    script = Path(sys.executable).with_name("agenttest-submit")
    assert script.exists(), "the project is installed in the venv running the tests"
    good = [json.dumps({"id": f"C{i}", "input": "hi"}) for i in range(1, 7)]
    write(project / "bad.jsonl", "\n".join([*good, '{"id": "C7" "input": "hi"}', ""]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")}
    result = subprocess.run(
        [str(script), "-i", "bad.jsonl", "-n", "assistants.expense", "--dry-run"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (
        HEADER_1 + "  bad.jsonl:7: invalid JSON: Expecting ',' delimiter (column 13)\n"
    )
    assert "Traceback" not in result.stderr


def test_unknown_assertion_type(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(
        project / "cases.jsonl",
        jsonl(
            {"id": "U1", "input": "hi", "assertions": [{"type": "containz", "value": "x"}]},
            {
                "id": "U2",
                "turns": [
                    {
                        "input": "a",
                        "assertions": [
                            {"type": "contains", "value": "a"},
                            {"type": "regexp", "pattern": "a"},
                        ],
                    }
                ],
            },
            {"id": "U3", "input": "hi", "final_assertions": [{"value": "x"}]},
        ),
    )
    expect_input_error(
        capsys,
        "cases.jsonl",
        f"cases.jsonl:1 (test 'U1'): assertions[0]: unknown assertion type 'containz' "
        f"(known: {KNOWN_TYPES})",
        f"cases.jsonl:2 (test 'U2'): turns[0].assertions[1]: unknown assertion type 'regexp' "
        f"(known: {KNOWN_TYPES})",
        f"cases.jsonl:3 (test 'U3'): final_assertions[0]: assertion has no `type` "
        f"(known: {KNOWN_TYPES})",
    )


def test_unknown_assertion_type_in_yaml_names_its_line(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(
        project / "t.yaml",
        "tests:\n"
        "  - name: rounds_test\n"
        "    rounds:\n"
        "      - user_input: hi\n"
        "        assertions:\n"
        "          - type: contains\n"
        "            value: hello\n"
        "          - type: containz\n"
        "            value: x\n",
    )
    expect_input_error(
        capsys,
        "t.yaml",
        f"t.yaml:8 (test 'rounds_test'): rounds[0].assertions[1]: unknown assertion type "
        f"'containz' (known: {KNOWN_TYPES})",
    )


def test_turn_without_input(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(
        project / "t.jsonl",
        jsonl({"id": "N1", "turns": [{"input": "a"}, {"assertions": []}]}),
    )
    expect_input_error(
        capsys, "t.jsonl", "t.jsonl:1 (test 'N1'): turns[1].input: required field is missing"
    )


def test_round_without_user_input(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(
        project / "t.yaml",
        "tests:\n"
        "  - name: r\n"
        "    rounds:\n"
        "      - user_input: first\n"
        "      - criteria: must answer\n",
    )
    expect_input_error(
        capsys, "t.yaml", "t.yaml:5 (test 'r'): rounds[1].user_input: required field is missing"
    )


def test_yaml_test_with_neither_user_input_nor_rounds(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(
        project / "t.yaml",
        "tests:\n"
        "  - name: fine\n"
        "    user_input: hi\n"
        "  - name: empty_test\n"
        "    criteria: Should greet back\n",
    )
    expect_input_error(
        capsys,
        "t.yaml",
        "t.yaml:4 (test 'empty_test'): user_input: a test needs `user_input` (flat format) "
        "or `rounds`",
    )


def test_yaml_test_with_both_forms(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(
        project / "t.yaml",
        "tests:\n"
        "  - name: both\n"
        "    user_input: hi\n"
        "    rounds:\n"
        "      - user_input: again\n"
        "  - name: criteria_outside\n"
        "    criteria: x\n"
        "    rounds:\n"
        "      - user_input: again\n",
    )
    expect_input_error(
        capsys,
        "t.yaml",
        "t.yaml:4 (test 'both'): rounds: a test has either `user_input` (flat format) or "
        "`rounds`, not both",
        "t.yaml:7 (test 'criteria_outside'): criteria: with `rounds`, put criteria and "
        "assertions on each round",
    )


def test_duplicate_ids(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(
        project / "a.jsonl",
        jsonl({"id": "D1", "input": "a"}, {"id": "D2", "input": "a"}, {"id": "D1", "input": "b"}),
    )
    expect_input_error(
        capsys, "a.jsonl", "a.jsonl:3: id: duplicate id 'D1' (first defined at a.jsonl:1)"
    )


def test_a_duplicate_of_a_bad_case_is_reported_with_it(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first B1 has an error of its own; the second is still its duplicate, reported
    in the same attempt rather than after the first is fixed."""
    write(
        project / "a.jsonl",
        jsonl({"id": "B1", "input": "a", "typo": 1}, {"id": "B1", "input": "b"}),
    )
    expect_input_error(
        capsys,
        "a.jsonl",
        "a.jsonl:1 (test 'B1'): typo: unknown field (a typo?)",
        "a.jsonl:2: id: duplicate id 'B1' (first defined at a.jsonl:1)",
    )


def test_duplicate_ids_across_files_and_formats(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(project / "cases" / "a.jsonl", jsonl({"id": "greeting", "input": "a"}))
    write(
        project / "cases" / "b.yaml",
        "tests:\n  - name: other\n    user_input: x\n  - name: greeting\n    user_input: hi\n",
    )
    a, b = os.path.join("cases", "a.jsonl"), os.path.join("cases", "b.yaml")
    expect_input_error(
        capsys, "cases", f"{b}:4: id: duplicate id 'greeting' (first defined at {a}:1)"
    )


def test_unknown_agent_name_on_a_case(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = project / "agenttest.yaml"
    write(
        project / "t.jsonl",
        jsonl(
            {"id": "A1", "input": "a", "agent": "assistants.expens"},
            {"id": "A2", "input": "a", "simulator": {"use": "agents:nobody"}},
            {
                "id": "A3",
                "input": "a",
                "assertions": [{"type": "agent", "use": "agents:workers.test.validater"}],
            },
        ),
    )
    expect_input_error(
        capsys,
        "t.jsonl",
        f"t.jsonl:1 (test 'A1'): agent: unknown agent 'assistants.expens' in {config}; "
        "did you mean 'assistants.expense'?",
        f"t.jsonl:2 (test 'A2'): simulator.use: unknown agent 'nobody' in {config} (known: "
        "assistants.expense, workers.test.user-sim, workers.test.validator)",
        f"t.jsonl:3 (test 'A3'): assertions[0].use: unknown agent "
        f"'workers.test.validater' in {config}; did you mean 'workers.test.validator'?",
    )


def test_unknown_agent_name_for_a_yaml_file(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = project / "agenttest.yaml"
    write(
        project / "t.yaml",
        "agent: assistants.expence\ntests:\n  - name: first\n    user_input: hi\n",
    )
    expect_input_error(
        capsys,
        "t.yaml",
        f"t.yaml:3 (test 'first'): agent: unknown agent 'assistants.expence' in {config}; "
        "did you mean 'assistants.expense'?",
    )


def test_problems_found_after_the_schema_name_fields_as_written(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checks of references and files run on the normalized case (one-turn forms become
    `turns[0]`, YAML rounds become turns and `criteria` an agent assertion), but report
    the field, and in YAML its line, as the author wrote them."""
    (project / "agenttest.yaml").write_text(
        CONFIG.replace("defaults:\n  judge: workers.test.validator\n", ""), encoding="utf-8"
    )
    config = project / "agenttest.yaml"
    write(
        project / "t.yaml",
        """\
tests:
  - name: flat
    user_input: hello
    criteria: be nice
  - name: rounds
    rounds:
      - user_input: x
      - user_input: y
        assertions:
          - type: contains
            value: z
          - type: agent
            use: agents:nobody
        criteria: be helpful
        attachments:
          - source: "file://./gone.png"
""",
    )
    write(
        project / "t.jsonl",
        jsonl(
            {"id": "S", "input": "a", "assertions": [{"type": "agent", "use": "agents:nope"}]},
            {"id": "M", "turns": [{"input": "a"}, {"input": "b", "attachments": [
                {"source": "file://gone.png"}]}]},
        ),
    )  # fmt: skip
    code, out, err = submit(capsys, "-i", "t.yaml", "-i", "t.jsonl")
    assert code == 2 and out == ""
    judge = "criteria need a judge: set defaults.judge in agenttest.yaml"
    assert problems_of(err) == [
        f"t.yaml:4 (test 'flat'): criteria: {judge}",
        f"t.yaml:13 (test 'rounds'): rounds[1].assertions[1].use: unknown agent 'nobody' in "
        f"{config} (known: assistants.expense, workers.test.user-sim, workers.test.validator)",
        f"t.yaml:14 (test 'rounds'): rounds[1].criteria: {judge}",
        f"t.yaml:16 (test 'rounds'): rounds[1].attachments[0].source: 'file://./gone.png': "
        f"file not found ({project / 'gone.png'})",
        f"t.jsonl:1 (test 'S'): assertions[0].use: unknown agent 'nope' in {config} (known: "
        "assistants.expense, workers.test.user-sim, workers.test.validator)",
        f"t.jsonl:2 (test 'M'): turns[1].attachments[0].source: 'file://gone.png': file not "
        f"found ({project / 'gone.png'})",
    ]


def test_what_runs_differently_than_it_reads_is_warned_about(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Allowed, but probably not meant: the run goes on, with a warning on stderr. A bare
    simulator name is an agent, as in an agent assertion's `use`."""
    write(
        project / "t.jsonl",
        jsonl(
            {"id": "J", "input": "a", "assertions": [
                {"type": "agent", "use": "agents:workers.test.validator",
                 "options": {"connector": "no.such.agent"}}]},
            {"id": "M", "input": "a", "simulator": {"use": "workers.test.user-sim"}},
        ),
    )  # fmt: skip
    code, out, err = submit(capsys, "-i", "t.jsonl")
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: case J: judge connector 'no.such.agent' is not an agent in agenttest.yaml; "
        "the judge's own agent is called",
    ]
    assert '"id": "M", "type": "multi_turn"' in out
    assert '"simulator": {"use": "agents:workers.test.user-sim"}' in out


def test_a_simulator_named_nowhere_is_the_configs_default(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """defaults.simulator plays the user for a case whose simulator names no agent, and
    for every case when `--simulator` is given alone; without it, both are input errors."""
    write(
        project / "t.jsonl",
        jsonl(
            {"id": "OWN", "input": "a", "simulator": {"metadata": {"goal": "file it"}}},
            {"id": "NONE", "input": "b"},
        ),
    )
    code, out, err = submit(capsys, "-i", "t.jsonl")
    assert code == 2
    assert problems_of(err) == [
        "t.jsonl:1 (test 'OWN'): simulator.use: no simulator named: set simulator.use, or "
        "defaults.simulator in agenttest.yaml"
    ]
    code, out, err = submit(capsys, "-i", "t.jsonl", "--simulator")
    assert code == 2
    assert "--simulator: names no simulator, and agenttest.yaml has no defaults.simulator" in err

    (project / "agenttest.yaml").write_text(
        CONFIG + "  simulator: workers.test.user-sim\n", encoding="utf-8"
    )
    code, out, err = submit(capsys, "-i", "t.jsonl")
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r.get("simulator") for r in records] == [
        {"use": "agents:workers.test.user-sim", "metadata": {"goal": "file it"}},
        None,
    ]
    code, out, err = submit(capsys, "-i", "t.jsonl", "--simulator")
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["simulator"]["use"] for r in records] == ["agents:workers.test.user-sim"] * 2


def test_unknown_target_agent_flag(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(project / "t.jsonl", jsonl({"id": "A1", "input": "a"}))
    code = main(["-i", "t.jsonl", "-n", "assistants.expens", "--dry-run"])
    _, err = capsys.readouterr()
    assert code == 2
    assert err == (
        HEADER_1 + f"  -n: unknown agent 'assistants.expens' in {project / 'agenttest.yaml'}; "
        "did you mean 'assistants.expense'?\n"
    )


def test_every_problem_of_a_file_is_listed(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(
        project / "t.jsonl",
        '{"id": "ok", "input": "a"}\n'
        "not json\n"
        '{"id": "x1", "input": "a", "asserts": []}\n'
        '["not", "an", "object"]\n'
        '{"id": "", "input": "a"}\n',
    )
    expect_input_error(
        capsys,
        "t.jsonl",
        "t.jsonl:2: invalid JSON: Expecting value (column 1)",
        "t.jsonl:3 (test 'x1'): asserts: unknown field (a typo?)",
        "t.jsonl:4: a case is a JSON object, got an array",
        "t.jsonl:5: id: String should have at least 1 character",
    )


def test_every_problem_of_a_long_file_is_listed_in_order_at_its_line(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Blank lines keep their numbers; a bad case still takes its id; a duplicate's own
    problems are not reported (it is not checked past its id)."""
    lines = [json.dumps({"id": f"c{i:03d}", "input": f"message {i}"}) for i in range(300)]
    lines[5] = json.dumps({"id": "c005", "input": "a", "typo": 1})
    lines[250] = '{"id": "bad", "input": '
    lines[260] = json.dumps({"id": "c003", "input": "a"})
    lines[270] = json.dumps({"id": "c005", "input": "a", "agent": "nobody"})
    lines[280] = json.dumps(
        {"id": "c280", "input": "a", "assertions": [{"type": "containz", "value": "x"}]}
    )
    lines[200:200] = ["", "   "]
    write(project / "cases.jsonl", "".join(line + "\n" for line in lines))
    expect_input_error(
        capsys,
        "cases.jsonl",
        "cases.jsonl:6 (test 'c005'): typo: unknown field (a typo?)",
        "cases.jsonl:253: invalid JSON: Expecting value (column 24)",
        "cases.jsonl:263: id: duplicate id 'c003' (first defined at cases.jsonl:4)",
        "cases.jsonl:273: id: duplicate id 'c005' (first defined at cases.jsonl:6)",
        f"cases.jsonl:283 (test 'c280'): assertions[0]: unknown assertion type 'containz' "
        f"(known: {KNOWN_TYPES})",
    )


def test_cross_field_problems_name_their_field(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(
        project / "t.jsonl",
        jsonl(
            {"id": "B1", "input": "a", "turns": [{"input": "b"}]},
            {"id": "S1", "type": "single_turn", "turns": [{"input": "a"}, {"input": "b"}]},
            {
                "id": "T1",
                "turns": [{"input": "a"}],
                "assertions": [{"type": "contains", "value": "x"}],
            },
            {"id": "Z1", "input": "a", "max_turns": 0},
        ),
    )
    expect_input_error(
        capsys,
        "t.jsonl",
        "t.jsonl:1 (test 'B1'): turns: give either `input` (single-turn) or `turns` "
        "(multi-turn), not both",
        "t.jsonl:2 (test 'S1'): type: type is single_turn but the case has 2 turns",
        "t.jsonl:3 (test 'T1'): assertions: top-level `assertions` belongs to the single-turn "
        "form (with `input`); put them on a turn, or use final_assertions",
        "t.jsonl:4 (test 'Z1'): max_turns: Input should be greater than or equal to 1",
    )


def test_max_turns_below_yaml_rounds_is_not_an_input_error(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The case loads; when run it fails with `max turns (1) exceeded` (engine tests)."""
    write(
        project / "t.yaml",
        "tests:\n"
        "  - name: short\n"
        "    max_turns: 1\n"
        "    rounds:\n"
        "      - user_input: a\n"
        "      - user_input: b\n",
    )
    code, out, err = submit(capsys, "-i", "t.yaml")
    assert code == 0, err
    assert '"max_turns": 1' in out


def test_yaml_problems_point_at_the_field_line(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(
        project / "t.yaml",
        "tests:\n"
        "  - name: typo\n"
        "    user_input: hi\n"
        "    critera: should greet\n"
        "    on_missing_input: later\n"
        "extra: 1\n",
    )
    expect_input_error(
        capsys,
        "t.yaml",
        "t.yaml:6: extra: unknown top-level key",
        "t.yaml:5 (test 'typo'): on_missing_input: Input should be 'skip', 'fail' or 'end'",
        "t.yaml:4 (test 'typo'): critera: unknown field (a typo?)",
    )


def test_yaml_syntax_error_and_shape(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(project / "a.yaml", "tests:\n  - name: x\n    user_input: [unclosed\n")
    write(project / "b.yaml", "- name: x\n")
    write(project / "c.yaml", "tests:\n  - just a string\n")
    expect_input_error(
        capsys, "a.yaml", "a.yaml:4: invalid YAML: expected ',' or ']', but got '<stream end>'"
    )
    expect_input_error(
        capsys,
        "b.yaml",
        "b.yaml:1: a YAML case file is a mapping with a `tests:` list (tdx format)",
    )
    expect_input_error(capsys, "c.yaml", "c.yaml:2: a test is a mapping, got a string")


# -- encodings and line endings ------------------------------------------------------------


def test_bom_and_crlf_are_accepted(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bom = b"\xef\xbb\xbf"
    write(
        project / "a.jsonl",
        bom + b'{"id": "J1", "input": "a"}\r\n\r\n{"id": "J2", "input": "b"}\r\n',
    )
    write(
        project / "b.json",
        bom + b'[\r\n  {"id": "K1", "input": "c"},\r\n  {"id": "K2", "input": "d"}\r\n]\r\n',
    )
    write(
        project / "c.yaml",
        bom + b"tests:\r\n  - name: Y1\r\n    rounds:\r\n      - user_input: |\r\n          e\r\n"
        b"        criteria: f\r\n",
    )
    cases = load_cases(project)
    assert [(c.id, Path(c.source_file or "").name, c.source_line) for c in cases] == [
        ("J1", "a.jsonl", 1),
        ("J2", "a.jsonl", 3),
        ("K1", "b.json", 2),
        ("K2", "b.json", 3),
        ("Y1", "c.yaml", 2),
    ]
    assert [c.turns[0].input for c in cases] == ["a", "b", "c", "d", "e"]
    assert cases[-1].turns[0].assertions[0].options.metadata == {"criteria": "f"}  # type: ignore[union-attr]
    code, out, _ = submit(capsys, "-i", ".")
    assert code == 0 and len(out.splitlines()) == 5


def test_invalid_utf8_line_is_reported_with_its_line(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(
        project / "t.jsonl",
        b'{"id": "U1", "input": "a"}\n'
        b'{"id": "U2", "input": "caf\xe9"}\n'
        b'{"id": "U3", "input": "c"}\n',
    )
    items = list(iter_cases(project / "t.jsonl"))
    assert [i.id for i in items if isinstance(i, Case)] == ["U1", "U3"]  # the reader goes on
    expect_input_error(
        capsys, "t.jsonl", "t.jsonl:2: not valid UTF-8 (byte 27): save the file as UTF-8"
    )
    write(project / "t.yaml", b"tests:\n  - name: a\n    user_input: caf\xe9\n")
    expect_input_error(capsys, "t.yaml", "t.yaml:3: not valid UTF-8: save the file as UTF-8")
    write(project / "t.json", b'{\n"id": "x",\n"input": "\xff"}\n')
    expect_input_error(capsys, "t.json", "t.json:3: not valid UTF-8: save the file as UTF-8")


# -- hostile input: bounded, quick, never a traceback -------------------------------------


def test_line_over_8_mb_is_rejected_without_reading_it_whole(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = project / "big.jsonl"
    with path.open("wb") as handle:
        handle.write(b'{"id": "small1", "input": "a"}\n')
        handle.write(b'{"id": "huge", "input": "' + b"x" * 40_000_000 + b'"}\n')
        handle.write(b'{"id": "small2", "input": "b"}\n')
    tracemalloc.start()
    try:
        items = list(iter_cases(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 25_000_000, f"peak {peak / 1e6:.1f} MB: the 40 MB line was read whole"
    assert [i.id if isinstance(i, Case) else str(i) for i in items] == [
        "small1",
        f"{path}:2: line is 40.0 MB; a case may be at most 8 MB",
        "small2",
    ]
    expect_input_error(
        capsys, "big.jsonl", "big.jsonl:2: line is 40.0 MB; a case may be at most 8 MB"
    )


def test_a_line_of_exactly_8_mb_is_read(tmp_path: Path) -> None:
    head, tail = b'{"id": "edge", "input": "', b'"}'
    size = 8 * 1024 * 1024
    path = write(
        tmp_path / "edge.jsonl", head + b"y" * (size - len(head) - len(tail)) + tail + b"\n"
    )
    [case] = load_cases(path)
    assert case.id == "edge" and len(case.turns[0].input) == size - len(head) - len(tail)
    write(path, head + b"y" * (size - len(head) - len(tail) + 1) + tail + b"\n")
    [problem] = list(iter_cases(path))
    assert isinstance(problem, InputProblem)
    assert problem.line == 1 and problem.message.endswith("a case may be at most 8 MB")


def _nested(levels: int) -> dict[str, object]:
    """A case whose JSON depth is `levels`: the case object, tool_mocks, then lists."""
    inner: list[object] = []
    for _ in range(levels - 3):
        inner = [inner]
    return {"id": f"deep{levels}", "input": "x", "tool_mocks": {"t": inner}}


def test_json_nested_100_levels_is_rejected(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(project / "t.jsonl", jsonl({"id": "ok", "input": "a"}, _nested(100)))
    expect_input_error(capsys, "t.jsonl", "t.jsonl:2: JSON nested deeper than 64 levels")
    write(project / "t.json", json.dumps(_nested(100), indent=1))
    expect_input_error(capsys, "t.json", "t.json:1: JSON nested deeper than 64 levels")
    # deep enough to exhaust Python's recursion while parsing
    write(project / "r.jsonl", "[" * 100_000 + "]" * 100_000 + "\n")
    expect_input_error(capsys, "r.jsonl", "r.jsonl:1: JSON nested deeper than 64 levels")
    write(project / "r.json", "[" * 100_000 + "]" * 100_000 + "\n")
    expect_input_error(capsys, "r.json", "r.json:1: JSON nested deeper than 64 levels")


def test_json_depth_limit_boundary(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", jsonl(_nested(64), _nested(65)))
    items = list(iter_cases(path))
    assert isinstance(items[0], Case) and items[0].id == "deep64"
    assert items[1] == InputProblem("JSON nested deeper than 64 levels", file=str(path), line=2)


def _billion_laughs() -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    previous = "a"
    for name in "bcdefghi":
        lines.append(f"{name}: &{name} [" + ",".join([f"*{previous}"] * 10) + "]")
        previous = name
    lines.append("tests: *i")
    return "\n".join(lines) + "\n"


def test_yaml_alias_bomb_is_rejected_quickly(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(project / "bomb.yaml", _billion_laughs())
    started = time.monotonic()
    expect_input_error(
        capsys, "bomb.yaml", "bomb.yaml: YAML expands to more than 200,000 values (an alias bomb?)"
    )
    assert time.monotonic() - started < 3.0


def test_recursive_and_deep_yaml_are_rejected(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(project / "r.yaml", "x: 1\ntests: &a\n  - *a\n")
    expect_input_error(capsys, "r.yaml", "r.yaml:2: recursive YAML alias: a value contains itself")
    write(project / "m.yaml", "tests:\n  - &t\n    name: loop\n    self: *t\n")
    expect_input_error(capsys, "m.yaml", "m.yaml:2: recursive YAML alias: a value contains itself")
    write(project / "d.yaml", "tests:\n" + "- " * 5000 + "x\n")
    expect_input_error(capsys, "d.yaml", "d.yaml: YAML nested too deeply")


def test_yaml_anchors_that_are_not_bombs_still_work(tmp_path: Path) -> None:
    path = write(
        tmp_path / "t.yaml",
        "common: &common\n"
        "  criteria: Should be polite\n"
        "tests:\n"
        "  - name: one\n"
        "    user_input: hi\n"
        "    <<: *common\n"
        "  - name: two\n"
        "    user_input: bye\n"
        "    <<: *common\n",
    )
    # `common` is an unknown top-level key; the tests themselves merge it fine
    problems = [i for i in iter_cases(path) if isinstance(i, InputProblem)]
    cases = [i for i in iter_cases(path) if isinstance(i, Case)]
    assert problems == [
        InputProblem("unknown top-level key", file=str(path), line=1, field="common")
    ]
    assert [c.turns[0].assertions[0].options.metadata for c in cases] == [  # type: ignore[union-attr]
        {"criteria": "Should be polite"},
        {"criteria": "Should be polite"},
    ]


# -- .json arrays, {"cases": [...]}, folders ---------------------------------------------


def test_json_array_reports_the_line_of_each_element(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(
        project / "t.json",
        "[\n"
        '  {"id": "J1", "input": "a"},\n'
        "  {\n"
        '    "id": "J2",\n'
        '    "input": "b",\n'
        '    "assertions": [{"type": "nope"}]\n'
        "  },\n"
        '  {"id": "J3", "turns": [{"input": "c"}, {}]},\n'
        "  42\n"
        "]\n",
    )
    expect_input_error(
        capsys,
        "t.json",
        f"t.json:6 (test 'J2'): assertions[0]: unknown assertion type 'nope' "
        f"(known: {KNOWN_TYPES})",
        "t.json:8 (test 'J3'): turns[1].input: required field is missing",
        "t.json:9: a case is a JSON object, got 42",
    )


def test_json_cases_document_reports_element_lines(tmp_path: Path) -> None:
    # "cases" also appears inside an earlier member: the top-level array is the one read
    path = write(
        tmp_path / "t.json",
        '{"meta": {"cases": []},\n'
        ' "cases": [\n'
        '  {"id": "K1", "input": "a"},\n'
        '  {"id": "K2", "turns": [{}]}\n'
        "]}\n",
    )
    items = list(iter_cases(path))
    assert isinstance(items[0], Case) and (items[0].id, items[0].source_line) == ("K1", 3)
    assert items[1] == InputProblem(
        "required field is missing", file=str(path), line=4, field="turns[0].input", test="K2"
    )


def test_json_file_with_one_case_per_line_is_read_as_jsonl(tmp_path: Path) -> None:
    path = write(tmp_path / "t.json", '{"id": "L1", "input": "a"}\n{"id": "L2", "input": "b"}\n')
    assert [(c.id, c.source_line) for c in load_cases(path)] == [("L1", 1), ("L2", 2)]


def test_pretty_printed_cases_one_after_another_are_read_in_either_extension(
    tmp_path: Path,
) -> None:
    """The spec prints its cases as indented JSON objects; saved one after another, as
    .jsonl or .json, they are read as the cases they are, each with its first line."""
    first = json.dumps({"id": "P1", "input": "a"}, indent=2)
    second = json.dumps({"id": "P2", "turns": [{"input": "b"}, {"input": "c"}]}, indent=2)
    text = f"{first}\n\n{second}\n"
    for name in ("t.jsonl", "t.json"):
        path = write(tmp_path / name, text)
        cases = load_cases(path)
        assert [(c.id, c.source_line, len(c.turns)) for c in cases] == [
            ("P1", 1, 1),
            ("P2", first.count("\n") + 3, 2),
        ]


def test_problems_in_an_indented_json_case_point_at_their_own_line(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A case spread over many lines: each problem names the line of its field, not the
    line where the case starts (schema errors and the checks after them alike)."""
    write(
        project / "t.json",
        """\
[
  {"id": "OK", "input": "x"},
  {
    "id": "T9",
    "turns": [
      {"input": "a"},
      {"input": "b",
       "assertions": [{"type": "contains", "valeu": "z"}]}
    ]
  },
  {
    "id": "T10",
    "turns": [
      {"input": "a"},
      {
        "input": "b",
        "attachments": [{"source": "file://gone.png"}]
      }
    ],
    "simulator": {
      "use": "agents:nobody"
    }
  }
]
""",
    )
    code, out, err = submit(capsys, "-i", "t.json")
    assert code == 2 and out == ""
    assert [p.split(": ")[0:2] for p in problems_of(err)] == [
        ["t.json:8 (test 'T9')", "turns[1].assertions[0].value"],
        ["t.json:8 (test 'T9')", "turns[1].assertions[0].valeu"],
        ["t.json:21 (test 'T10')", "simulator.use"],
        ["t.json:17 (test 'T10')", "turns[1].attachments[0].source"],
    ]


def test_a_jsonl_file_that_is_not_json_either_way_lists_its_bad_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", '{\n  "id": "P1",\n  "input": "a",\n}\n')
    problems = [i for i in iter_cases(path) if isinstance(i, InputProblem)]
    assert [p.line for p in problems] == [1, 2, 3, 4]
    assert all(p.message.startswith("invalid JSON") for p in problems)


def test_bad_json_document_names_its_line(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(project / "t.json", '{\n  "id": "x",\n  "input": "a"\n  "turns": []\n}\n')
    expect_input_error(
        capsys, "t.json", "t.json:4: invalid JSON: Expecting ',' delimiter (column 3)"
    )


def test_directory_loads_every_case_file_and_skips_config(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(project / "suite" / "agenttest.yaml", "this: is not a case file\n")
    write(project / "suite" / "agenttest.yml", "neither: is this\n")
    write(project / "suite" / "a.jsonl", jsonl({"id": "A", "input": "a"}))
    write(project / "suite" / "b.json", json.dumps([{"id": "B", "input": "b"}]))
    write(project / "suite" / "nested" / "c.yaml", "tests:\n  - name: C\n    user_input: c\n")
    write(project / "suite" / "nested" / "d.yml", "tests:\n  - name: D\n    user_input: d\n")
    write(project / "suite" / "e.ndjson", jsonl({"id": "E", "input": "e"}))
    write(project / "suite" / "notes.txt", "not a case file\n")
    write(project / "suite" / ".cache" / "old.jsonl", "stale, never read\n")
    assert [c.id for c in load_cases(project / "suite")] == ["A", "B", "E", "C", "D"]
    code, out, _ = submit(capsys, "-i", "suite")
    assert code == 0
    assert [json.loads(line)["id"] for line in out.splitlines()] == ["A", "B", "E", "C", "D"]


def test_project_directory_with_its_own_config(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(project / "t.jsonl", jsonl({"id": "only", "input": "a"}))
    code, out, _ = submit(capsys, "-i", ".")
    assert code == 0 and json.loads(out)["id"] == "only"


def test_empty_folder_and_unknown_extension(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "empty").mkdir()
    write(project / "cases.txt", "hello\n")
    expect_input_error(capsys, "empty", "no case files (*.jsonl, *.json, *.yaml, *.yml) in empty")
    expect_input_error(
        capsys,
        "cases.txt",
        "cases.txt: unknown case file type '.txt': use .jsonl or .json (yao format) or "
        ".yaml/.yml (tdx format)",
    )


# -- attachments --------------------------------------------------------------------------


def test_attachment_outside_the_case_folder_is_rejected(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(project / "secret.txt", "do not send\n")
    write(project / "cases" / "inside.txt", "fine\n")
    cases_dir = (project / "cases").resolve()
    write(
        project / "cases" / "t.jsonl",
        jsonl(
            {
                "id": "OK",
                "turns": [{"input": "a", "attachments": [{"source": "file://inside.txt"}]}],
            },
            {
                "id": "UP",
                "turns": [
                    {"input": "a"},
                    {
                        "input": "b",
                        "attachments": [
                            {"source": "file://./inside.txt"},
                            {"source": "file://../secret.txt"},
                        ],
                    },
                ],
            },
            {
                "id": "ABS",
                "input": "a",
                "attachments": [{"source": f"file://{project / 'secret.txt'}"}],
            },
            {"id": "GONE", "input": "a", "attachments": [{"source": "file://missing.png"}]},
            {"id": "FTP", "input": "a", "attachments": [{"source": "ftp://host/x.png"}]},
        ),
    )
    t = os.path.join("cases", "t.jsonl")
    expect_input_error(
        capsys,
        t,
        f"{t}:2 (test 'UP'): turns[1].attachments[1].source: 'file://../secret.txt' is outside "
        f"the case file's folder {cases_dir}",
        f"{t}:3 (test 'ABS'): attachments[0].source: "
        f"'file://{project / 'secret.txt'}' is outside the case file's folder {cases_dir}",
        f"{t}:4 (test 'GONE'): attachments[0].source: 'file://missing.png': file not "
        f"found ({cases_dir / 'missing.png'})",
        f"{t}:5 (test 'FTP'): attachments[0].source: 'ftp://host/x.png': an attachment source "
        "is file://PATH, data:..., or http(s)://URL",
    )


def test_attachment_symlink_pointing_outside_is_rejected(tmp_path: Path) -> None:
    from agenttest_worker.cases.attachments import inline_attachments

    write(tmp_path / "secret.txt", "do not send\n")
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "link.txt").symlink_to(tmp_path / "secret.txt")
    path = write(
        tmp_path / "cases" / "t.jsonl",
        jsonl({"id": "L", "input": "a", "attachments": [{"source": "file://link.txt"}]}),
    )
    [case] = load_cases(path)
    with pytest.raises(InputError) as caught:
        inline_attachments(case)
    [problem] = caught.value.problems
    assert problem.field == "attachments[0].source" and problem.line == 1
    assert "is outside the case file's folder" in problem.message


def test_no_traceback_for_an_unreadable_path(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "dir.jsonl").mkdir()  # a folder named like a case file holds no cases
    code, _, err = submit(capsys, "-i", "dir.jsonl")
    assert code == 2
    assert problems_of(err) == ["no case files (*.jsonl, *.json, *.yaml, *.yml) in dir.jsonl"]
