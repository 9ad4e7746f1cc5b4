"""Every example of both specs, loaded from tests/fixtures/spec/ and checked field by field.

Also a YAML file using every tdx field (tests/fixtures/cases/full.yaml), the round trip
of Case.to_record(), and `--dry-run` output read back with -i giving identical output.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from agenttest_submit.cli.main import main
from agenttest_worker.agents.options import Options, Skip, merge_options
from agenttest_worker.assertions import (
    AgentAssertion,
    ContainsAssertion,
    JsonPathAssertion,
    RegexAssertion,
    ToolCalledAssertion,
)
from agenttest_worker.cases.attachments import inline_attachments
from agenttest_worker.cases.case_model import Attachment, Case, InteractiveConfig, SimulatorConfig
from agenttest_worker.cases.files import iter_cases, load_cases
from agenttest_worker.errors import InputError, InputProblem

FIXTURES = Path(__file__).parent / "fixtures"
SPEC = FIXTURES / "spec"
RECEIPT = SPEC / "tests" / "fixtures" / "receipt.jpg"

CONFIG = """\
agents:
  assistants.expense: {base_url: "http://127.0.0.1:9/v1", model: expense}
  assistants.other: {base_url: "http://127.0.0.1:9/v1"}
  workers.test.validator: {base_url: "http://127.0.0.1:9/v1"}
  workers.test.user-sim: {base_url: "http://127.0.0.1:9/v1"}
  workers.test.user-simulator: {base_url: "http://127.0.0.1:9/v1"}
  openai-gpt4: {base_url: "http://127.0.0.1:9/v1"}
defaults:
  judge: workers.test.validator
scripts_dir: scripts
"""


def load(name: str) -> list[Case]:
    return load_cases(SPEC / name)


def one(name: str) -> Case:
    [case] = load(name)
    return case


def without_source(case: Case) -> Case:
    return case.model_copy(update={"source_file": None, "source_line": None})


def judge(criteria: str) -> AgentAssertion:
    return AgentAssertion(
        type="agent", conversation=True, options=Options(metadata={"criteria": criteria})
    )


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with agenttest.yaml naming every agent the spec examples use."""
    (tmp_path / "agenttest.yaml").write_text(CONFIG, encoding="utf-8")
    monkeypatch.delenv("AGENTTEST_SCRIPTS_DIR", raising=False)
    script = tmp_path / "scripts" / "tests" / "validate-expense.py"
    script.parent.mkdir(parents=True)
    script.write_text("def validate(response, metadata):\n    return True\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, err
    return code, out, err


# -- the fixtures ------------------------------------------------------------------------


def test_receipt_fixture_is_a_real_jpeg() -> None:
    data = RECEIPT.read_bytes()
    assert data[:3] == b"\xff\xd8\xff" and data[-2:] == b"\xff\xd9"
    assert len(data) < 4096


# -- yao JSON examples ----------------------------------------------------------------------


def test_single_turn_example() -> None:
    case = one("single_turn.json")
    assert case.id == "T001"
    assert case.name is None and case.description is None and case.agent is None
    assert case.type == "single_turn"
    assert case.options is None
    # the single-turn shorthand is folded into turns
    assert case.input is None and case.assertions == [] and case.attachments == []
    assert [t.input for t in case.turns] == ["Hello"]
    [assertion] = case.turns[0].assertions
    assert type(assertion) is ContainsAssertion
    assert assertion.value == "Hi" and assertion.ignore_case is False
    assert case.turns[0].options is None and case.turns[0].attachments == []
    assert case.simulator is None and case.interactive is None
    assert case.on_missing_input is None  # the engine defaults JSONL cases to skip
    assert case.final_assertions == [] and case.tool_mocks == {} and case.tags == []
    assert case.max_turns is None and case.limit_turns() == 20
    assert case.needs_default_judge() is False
    assert case.source_file == str(SPEC / "single_turn.json") and case.source_line == 1


def test_options_field_example() -> None:
    case = one("options_field.json")
    assert case.id == "T001" and case.type == "single_turn"
    assert [t.input for t in case.turns] == ["Hello"]
    assert case.turns[0].assertions == []
    assert case.options == Options(
        connector="openai-gpt4", skip=Skip(history=True), metadata={"scenario": "edge-case"}
    )
    assert case.options.skip is not None and case.options.skip.trace is None
    assert case.options.search is None and case.options.mode is None
    merged = merge_options(case.options, case.turns[0].options)
    assert merged.connector == "openai-gpt4"
    assert merged.metadata == {"scenario": "edge-case"}
    assert merged.skip == Skip(history=True)


def test_multi_turn_example() -> None:
    case = one("multi_turn.json")
    assert case.id == "T001"
    assert case.name == "Expense Reimbursement Flow"
    assert case.type == "multi_turn"
    assert case.options == Options(
        connector="openai-gpt4", skip=Skip(history=True), metadata={"test_scenario": "happy-path"}
    )
    assert [t.input for t in case.turns] == [
        "I want to submit an expense report",
        "Business travel to Beijing, flight $2000, hotel $1500",
        "Yes, confirm",
    ]
    first, second, third = (t.assertions for t in case.turns)
    assert first == [ContainsAssertion(type="contains", value="type of expense")]
    assert second == [ToolCalledAssertion(type="tool_called", name="create_expense")]
    assert second[0].args is None
    assert third == [ContainsAssertion(type="contains", value="submitted")]
    for turn in case.turns:
        assert turn.options is None and turn.attachments == [] and turn.tool_mocks is None
        # options merged case < turn: the case's options reach every turn
        assert merge_options(case.options, turn.options) == case.options

    sim = case.simulator
    assert isinstance(sim, SimulatorConfig)
    assert sim.use == "agents:workers.test.user-simulator"
    assert sim.metadata == {}
    assert sim.effective_metadata() == {
        "persona": "New employee unfamiliar with expense process",
        "goal": "Submit a $3500 travel expense",
        "max_turns": 10,
    }
    assert sim.max_turns() == 10
    assert case.max_turns is None and case.limit_turns() == 10

    assert case.interactive == InteractiveConfig(enabled=False, timeout=300.0)
    assert case.interactive.timeout == 300.0
    assert case.on_missing_input == "skip"

    [final] = case.final_assertions
    assert type(final) is JsonPathAssertion
    assert final.path == "$.expense.status" and final.value == "submitted"
    assert final.expects_value is True
    assert len(case.iter_assertions()) == 4
    assert case.needs_default_judge() is False


def test_hybrid_example_as_written_is_rejected_for_its_missing_id() -> None:
    # The spec's hybrid example is a fragment without `id`, which the field table requires.
    problems = list(iter_cases(SPEC / "hybrid.json"))
    assert problems == [
        InputProblem(
            "required field is missing", file=str(SPEC / "hybrid.json"), line=1, field="id"
        )
    ]


def test_hybrid_example_with_an_id() -> None:
    data = json.loads((SPEC / "hybrid.json").read_text(encoding="utf-8"))
    case = Case.model_validate({"id": "H1", **data})
    assert case.type == "multi_turn"  # a simulator makes it multi-turn
    assert [t.input for t in case.turns] == ["Start expense report", "Travel expense, $500"]
    assert all(t.assertions == [] for t in case.turns)
    assert case.simulator is not None
    assert case.simulator.use == "agents:workers.test.user-sim"
    assert case.simulator.options is None
    assert case.simulator.metadata == {"goal": "Complete the expense submission"}
    assert case.simulator.effective_metadata() == {"goal": "Complete the expense submission"}
    assert case.simulator.max_turns() is None
    assert case.limit_turns() == 20
    assert case.on_missing_input is None and case.interactive is None


def test_simulator_metadata_forms_merge_with_direct_metadata_winning() -> None:
    sim = SimulatorConfig.model_validate(
        {
            "use": "agents:workers.test.user-sim",
            "options": {"metadata": {"goal": "old", "persona": "P", "max_turns": "7"}},
            "metadata": {"goal": "new"},
        }
    )
    assert sim.effective_metadata() == {"goal": "new", "persona": "P", "max_turns": "7"}
    assert sim.max_turns() == 7  # "7" written as text still counts
    for bad in (0, -1, True, "seven", 2.5):
        assert SimulatorConfig(use="agents:x", metadata={"max_turns": bad}).max_turns() is None


def test_limit_turns_priority() -> None:
    sim = {"use": "agents:sim", "metadata": {"max_turns": 6}}
    assert (
        Case.model_validate(
            {"id": "a", "input": "x", "max_turns": 4, "simulator": sim}
        ).limit_turns()
        == 4
    )
    assert Case.model_validate({"id": "a", "input": "x", "simulator": sim}).limit_turns() == 6
    assert Case.model_validate({"id": "a", "input": "x"}).limit_turns() == 20


def test_attachments_example() -> None:
    case = one("attachments.json")
    assert case.id == "T001" and case.name == "Receipt Upload Flow"
    assert case.type == "multi_turn"
    assert [t.input for t in case.turns] == [
        "I want to submit an expense with receipt",
        "The amount is $150",
    ]
    assert case.turns[0].attachments == [
        Attachment(type="image", source="file://./tests/fixtures/receipt.jpg")
    ]
    assert case.turns[0].attachments[0].name is None
    assert case.turns[0].attachments[0].mime_type is None
    assert case.turns[1].attachments == []

    inlined = inline_attachments(case)
    [attachment] = inlined.turns[0].attachments
    prefix = "data:image/jpeg;base64,"
    assert attachment.source.startswith(prefix)
    assert base64.b64decode(attachment.source[len(prefix) :]) == RECEIPT.read_bytes()
    assert attachment.name == "receipt.jpg" and attachment.type == "image"
    assert inlined.turns[1] == case.turns[1]
    assert case.turns[0].attachments[0].source.startswith("file://")  # the original is kept


def test_backward_compatibility_pair_is_the_same_case() -> None:
    short, long = load("backward_compat.jsonl")
    assert (short.source_line, long.source_line) == (1, 2)
    assert without_source(short) == without_source(long)
    assert (
        short.to_record()
        == long.to_record()
        == {
            "id": "T001",
            "type": "single_turn",
            "turns": [{"input": "Hello", "assertions": [{"type": "contains", "value": "Hi"}]}],
        }
    )


def test_generator_output_document_and_its_cases() -> None:
    from_document = load("generator_output.json")
    from_lines = load("generator_cases.jsonl")
    assert [(c.id, c.source_line) for c in from_document] == [("G001", 3), ("G002", 4)]
    assert [(c.id, c.source_line) for c in from_lines] == [("G001", 1), ("G002", 2)]
    for case in from_document:
        assert case.type == "single_turn"
        assert [t.input for t in case.turns] == ["..."]
        assert case.turns[0].assertions == []
    assert [c.to_record() for c in from_document] == [c.to_record() for c in from_lines]


def test_jsonl_output_example_is_a_result_not_a_case() -> None:
    record = json.loads((SPEC / "jsonl_output_example.json").read_text(encoding="utf-8"))
    assert record["id"] == "T001" and record["total_turns"] == 3
    fields = {p.field for p in iter_cases(SPEC / "jsonl_output_example.json")}
    assert {"status", "total_turns", "duration_ms", "turns[0].output"} <= fields


# -- tdx YAML examples ----------------------------------------------------------------------


def test_flat_yaml_example() -> None:
    greeting, calculation = load("flat.yaml")
    assert (greeting.id, greeting.name, greeting.source_line) == (
        "greeting_test",
        "greeting_test",
        2,
    )
    assert (calculation.id, calculation.name, calculation.source_line) == (
        "calculation_test",
        "calculation_test",
        6,
    )
    assert [t.input for t in greeting.turns] == ["What's the weather today?"]
    assert [t.input for t in calculation.turns] == ["What is 2 + 2?"]
    assert greeting.turns[0].assertions == [judge("Should respond with weather information")]
    assert calculation.turns[0].assertions == [judge("Should respond with 4")]
    for case in (greeting, calculation):
        assert case.type == "single_turn"
        assert case.on_missing_input == "end"
        [assertion] = case.turns[0].assertions
        assert type(assertion) is AgentAssertion
        assert assertion.use is None and assertion.conversation is True
        assert assertion.options is not None and assertion.options.connector is None
        assert case.needs_default_judge() is True
        assert case.simulator is None and case.agent is None and case.options is None
        assert case.final_assertions == [] and case.tags == [] and case.tool_mocks == {}
        assert case.limit_turns() == 20


def test_rounds_yaml_example() -> None:
    case = one("rounds.yaml")
    assert case.id == case.name == "multi_turn_conversation"
    assert case.type == "multi_turn" and case.source_line == 2
    # `|` blocks end in a newline the author did not mean to send
    assert [t.input for t in case.turns] == ["First message to agent", "Follow-up message"]
    assert [t.assertions for t in case.turns] == [
        [judge("Agent must do X and Y")],
        [judge("Agent must remember context and do Z")],
    ]
    assert case.on_missing_input == "end"
    assert case.limit_turns() == 20


def test_mixed_yaml_example() -> None:
    simple, memory = load("mixed.yaml")
    assert (simple.id, simple.type, simple.source_line) == ("simple_query", "single_turn", 3)
    assert [t.input for t in simple.turns] == ["Hello"]
    assert simple.turns[0].assertions == [judge("Should greet back")]
    assert (memory.id, memory.type, memory.source_line) == ("context_memory", "multi_turn", 8)
    assert [t.input for t in memory.turns] == ["My name is Alice", "What's my name?"]
    assert [t.assertions for t in memory.turns] == [
        [judge("Should acknowledge the name")],
        [judge("Should remember and respond with Alice")],
    ]
    assert simple.on_missing_input == memory.on_missing_input == "end"


def test_yaml_file_with_every_field() -> None:
    flat, rounds = load_cases(FIXTURES / "cases" / "full.yaml")

    assert (flat.id, flat.name, flat.source_line) == ("Y-FLAT", "flat_with_everything", 4)
    assert flat.description == "A flat test using every optional field"
    assert flat.type == "single_turn"
    assert flat.agent == "assistants.expense"  # the file-level agent
    [turn] = flat.turns
    assert turn.input == "42"  # a YAML number meant as text
    assert turn.assertions == [
        ContainsAssertion(type="contains", value="42"),
        judge("Should answer with the number"),
    ]
    assert turn.attachments == [
        Attachment(type="image", source="data:image/png;base64,iVBORw0KGgo=")
    ]
    assert turn.options is None
    assert flat.options == Options(connector="workers.test.validator", metadata={"locale": "en"})
    assert flat.on_missing_input == "fail"
    assert flat.final_assertions == [ToolCalledAssertion(type="tool_called", name="create_expense")]
    assert flat.tool_mocks == {"create_expense": {"id": "EXP-1"}}
    assert flat.max_turns == 3 and flat.limit_turns() == 3
    assert flat.tags == ["smoke"]

    assert (rounds.id, rounds.source_line) == ("rounds_with_options", 29)
    assert rounds.type == "multi_turn"
    assert rounds.agent == "assistants.other"  # a test's own agent beats the file's
    assert [t.input for t in rounds.turns] == ["Start", "Travel, $500"]
    assert rounds.turns[0].assertions == [judge("Should ask what kind of expense")]
    assert rounds.turns[1].assertions == [RegexAssertion(type="regex", pattern="EXP-[0-9]+")]
    assert [merge_options(rounds.options, t.options).metadata for t in rounds.turns] == [
        {"locale": "en", "tier": "silver"},
        {"locale": "en", "tier": "gold"},
    ]
    assert rounds.simulator is not None
    assert rounds.simulator.use == "agents:workers.test.user-sim"
    assert rounds.simulator.effective_metadata() == {"goal": "finish the expense", "max_turns": 6}
    assert rounds.limit_turns() == 6
    assert rounds.on_missing_input == "end"


def test_yaml_flat_with_simulator_is_multi_turn() -> None:
    from agenttest_worker.cases.yaml_model import YamlTest

    data = YamlTest.model_validate(
        {"name": "t", "user_input": "hi", "simulator": {"use": "agents:sim"}}
    ).to_case_data()
    case = Case.model_validate(data)
    assert case.type == "multi_turn" and case.simulator == SimulatorConfig(use="agents:sim")


# -- type defaults and the record round trip -------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"input": "x"}, "single_turn"),
        ({"input": "x", "simulator": {"use": "agents:sim"}}, "multi_turn"),
        ({"input": "x", "interactive": {"enabled": True}}, "multi_turn"),
        ({"input": "x", "interactive": {"enabled": False}}, "single_turn"),
        ({"turns": [{"input": "x"}]}, "multi_turn"),
        ({"type": "single_turn", "turns": [{"input": "x"}]}, "single_turn"),
        ({}, "multi_turn"),  # no input at all loads; the run fails with "no initial input"
    ],
)
def test_type_defaults(data: dict[str, Any], expected: str) -> None:
    assert Case.model_validate({"id": "c", **data}).type == expected


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5m", 300.0), ("30s", 30.0), ("1h30m", 5400.0), ("250ms", 0.25), (45, 45.0), ("2.5", 2.5)],
)
def test_interactive_timeout_in_seconds(text: Any, seconds: float) -> None:
    case = Case.model_validate({"id": "c", "input": "x", "interactive": {"timeout": text}})
    assert case.interactive is not None and case.interactive.timeout == seconds


def test_interactive_defaults() -> None:
    assert InteractiveConfig() == InteractiveConfig(enabled=False, timeout=300.0)


SPEC_CASE_FILES = [
    "single_turn.json",
    "options_field.json",
    "multi_turn.json",
    "attachments.json",
    "backward_compat.jsonl",
    "generator_output.json",
    "generator_cases.jsonl",
    "assertion_examples.jsonl",
    "flat.yaml",
    "rounds.yaml",
    "mixed.yaml",
]


@pytest.mark.parametrize("name", SPEC_CASE_FILES)
def test_to_record_round_trip(name: str) -> None:
    for case in load(name):
        record = case.to_record()
        assert json.loads(json.dumps(record)) == record  # JSON-ready
        assert Case.model_validate(record) == without_source(case)
        assert Case.model_validate(record).to_record() == record


def test_to_record_round_trip_full_yaml_and_inlined_attachments() -> None:
    cases = [
        *load_cases(FIXTURES / "cases" / "full.yaml"),
        inline_attachments(one("attachments.json")),
    ]
    for case in cases:
        assert Case.model_validate(case.to_record()) == without_source(case)


@pytest.mark.parametrize(
    "data",
    [
        {"id": "e", "input": "x", "interactive": {}, "options": {}},
        {"id": "e", "turns": [{"input": "x", "options": {}, "tool_mocks": {}}]},
        {
            "id": "e",
            "input": "x",
            "assertions": [{"type": "json_path", "path": "$.a", "value": None}],
        },
        {"id": "e", "input": "x", "assertions": [{"type": "equals", "value": []}]},
        {"id": 7, "input": "x", "tags": "one", "max_turns": 2},
        {"id": "e", "turns": [], "final_assertions": [{"type": "agent"}]},
    ],
)
def test_to_record_round_trip_of_explicit_empty_values(data: dict[str, Any]) -> None:
    case = Case.model_validate(data)
    assert Case.model_validate(case.to_record()) == case


def test_to_record_keeps_explicit_null_value_and_omits_absent_one() -> None:
    with_null = Case.model_validate(
        {
            "id": "n",
            "input": "x",
            "assertions": [{"type": "json_path", "path": "$.a", "value": None}],
        }
    )
    without = Case.model_validate(
        {"id": "n", "input": "x", "assertions": [{"type": "json_path", "path": "$.a"}]}
    )
    assert with_null.to_record()["turns"][0]["assertions"] == [
        {"type": "json_path", "path": "$.a", "value": None}
    ]
    assert without.to_record()["turns"][0]["assertions"] == [{"type": "json_path", "path": "$.a"}]
    assert Case.model_validate(with_null.to_record()).turns[0].assertions[0].expects_value is True
    assert Case.model_validate(without.to_record()).turns[0].assertions[0].expects_value is False


def test_with_default_simulator_is_in_the_record() -> None:
    case = Case.model_validate({"id": "s", "input": "x"}).with_default_simulator("agents:sim")
    assert case.type == "multi_turn"
    assert case.to_record() == {
        "id": "s",
        "type": "multi_turn",
        "turns": [{"input": "x"}],
        "simulator": {"use": "agents:sim"},
    }
    own = Case.model_validate({"id": "s", "input": "x", "simulator": {"use": "agents:mine"}})
    assert own.with_default_simulator("agents:sim") is own


# -- through the CLI: --dry-run prints the normalized cases ------------------------------


def test_dry_run_prints_normalized_records(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copy(SPEC / "single_turn.json", project / "single_turn.json")
    shutil.copy(SPEC / "mixed.yaml", project / "mixed.yaml")
    code, out, err = run_cli(
        capsys,
        "-i",
        "single_turn.json",
        "-i",
        "mixed.yaml",
        "-n",
        "assistants.expense",
        "--dry-run",
    )
    assert code == 0
    assert [json.loads(line) for line in out.splitlines()] == [
        {
            "id": "T001",
            "type": "single_turn",
            "turns": [{"input": "Hello", "assertions": [{"type": "contains", "value": "Hi"}]}],
        },
        {
            "id": "simple_query",
            "name": "simple_query",
            "type": "single_turn",
            "turns": [
                {
                    "input": "Hello",
                    "assertions": [
                        {
                            "type": "agent",
                            "options": {"metadata": {"criteria": "Should greet back"}},
                            "conversation": True,
                        }
                    ],
                }
            ],
            "on_missing_input": "end",
        },
        {
            "id": "context_memory",
            "name": "context_memory",
            "type": "multi_turn",
            "turns": [
                {
                    "input": "My name is Alice",
                    "assertions": [
                        {
                            "type": "agent",
                            "options": {"metadata": {"criteria": "Should acknowledge the name"}},
                            "conversation": True,
                        }
                    ],
                },
                {
                    "input": "What's my name?",
                    "assertions": [
                        {
                            "type": "agent",
                            "options": {
                                "metadata": {"criteria": "Should remember and respond with Alice"}
                            },
                            "conversation": True,
                        }
                    ],
                },
            ],
            "on_missing_input": "end",
        },
    ]
    assert err.startswith("3 case(s) (dry run")


def _copy_spec_file(name: str, project: Path) -> str:
    shutil.copy(SPEC / name, project / name)
    if name == "attachments.json":
        (project / "tests" / "fixtures").mkdir(parents=True)
        shutil.copy(RECEIPT, project / "tests" / "fixtures" / "receipt.jpg")
    return name


@pytest.mark.parametrize("name", [n for n in SPEC_CASE_FILES if n != "backward_compat.jsonl"])
def test_dry_run_output_read_back_gives_identical_output(
    name: str, project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _copy_spec_file(name, project)
    code, first, _ = run_cli(capsys, "-i", source, "-n", "assistants.expense", "--dry-run")
    assert code == 0 and first
    code, _, err = run_cli(
        capsys, "-i", source, "-n", "assistants.expense", "--dry-run", "-o", "out.jsonl"
    )
    assert code == 0
    assert "written to out.jsonl (dry run" in err
    assert (project / "out.jsonl").read_text(encoding="utf-8") == first
    code, second, _ = run_cli(capsys, "-i", "out.jsonl", "-n", "assistants.expense", "--dry-run")
    assert code == 0
    assert second == first
    for line in first.splitlines():
        record = json.loads(line)
        assert Case.model_validate(record).to_record() == record


def test_dry_run_inlines_attachments(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _copy_spec_file("attachments.json", project)
    code, out, _ = run_cli(
        capsys, "-i", "attachments.json", "-n", "assistants.expense", "--dry-run"
    )
    assert code == 0
    [record] = [json.loads(line) for line in out.splitlines()]
    [attachment] = record["turns"][0]["attachments"]
    assert attachment == {
        "type": "image",
        "source": "data:image/jpeg;base64," + base64.b64encode(RECEIPT.read_bytes()).decode(),
        "name": "receipt.jpg",
    }
    assert "attachments" not in record["turns"][1]


def test_dry_run_with_default_simulator(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _copy_spec_file("single_turn.json", project)
    code, out, _ = run_cli(
        capsys,
        "-i",
        "single_turn.json",
        "-n",
        "assistants.expense",
        "--dry-run",
        "--simulator",
        "agents:workers.test.user-sim",
    )
    assert code == 0
    record = json.loads(out)
    assert record["type"] == "multi_turn"
    assert record["simulator"] == {"use": "agents:workers.test.user-sim"}


def test_load_cases_on_the_spec_examples_raises_nothing() -> None:
    for name in SPEC_CASE_FILES:
        try:
            load(name)
        except InputError as exc:  # pragma: no cover - the message is the diagnosis
            pytest.fail(f"{name}: {exc}")
