"""Generated cases: `-i "agents:ID?count=20&focus=edge-cases"` and `-i "scripts:ID?..."`.

Over real HTTP on the embedded default. The generator agent is a scripted agent that keeps
every request and answers with the bundled demo generator's own code, so the test sees
the exact request the spec's generator interface describes; the target is a scripted
agent answering with the demo expense agent's code, so the test knows whether (and for
which case) it was called.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from scripted_agent import Reply, ScriptedAgent, say

from agenttest_submit.cli.main import main
from agenttest_worker.demo import expense, generator
from agenttest_worker.demo._protocol import metadata_of

DESCRIPTION = "Expense reimbursement assistant"
TOOLS = ["create_expense", "get_policy"]


@pytest.fixture
def agent() -> Iterator[ScriptedAgent]:
    with ScriptedAgent() as server:
        server.script("generator", lambda body: Reply(raw=generator.respond(body)))
        server.script("expense", lambda body: Reply(raw=expense.respond(body)))
        yield server


@pytest.fixture
def project(agent: ScriptedAgent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """cwd = tmp_path: agenttest.yaml (target `assistants.expense` with a description and
    tools, generator `workers.test.generator`) and an empty scripts folder."""
    monkeypatch.chdir(tmp_path)
    config = {
        "agents": {
            "assistants.expense": agent.entry(
                "expense", description=DESCRIPTION, tools=TOOLS, max_retries=0
            ),
            "workers.test.generator": agent.entry("generator", max_retries=0),
        },
        "scripts_dir": "scripts",
    }
    (tmp_path / "agenttest.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    (tmp_path / "scripts").mkdir()
    return tmp_path


def submit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([*argv, "-n", "assistants.expense"])
    out, err = capsys.readouterr()
    return code, out, err


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def first_inputs(agent: ScriptedAgent) -> list[str]:
    """The first user message of every conversation the target saw (one per case)."""
    seen = []
    for body in agent.requests("expense"):
        users = [m for m in body["messages"] if m["role"] == "user"]
        if len(users) == 1 and body["messages"][-1]["role"] == "user":
            seen.append(users[0]["content"])
    return seen


# -- the generator agent ---------------------------------------------------------------------


def test_the_generator_agent_gets_the_spec_request_and_its_cases_run(
    project: Path, agent: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    source = "agents:workers.test.generator?count=4&focus=edge-cases&complexity=medium&seed=007"
    code, out, err = submit(capsys, "-i", source, "-o", "out.jsonl")
    assert code == 0, err

    [request] = agent.requests("generator")
    assert metadata_of(request) == {
        "test_mode": "generator",
        "target_agent": "assistants.expense",
        "target_description": DESCRIPTION,
        "target_tools": TOOLS,
        "count": 4,  # typed from the query string, as the spec's example has it
        "focus": "edge-cases",
        "complexity": "medium",
        "seed": "007",  # not a number: "007" is kept as written
    }
    system = request["messages"][0]["content"]
    assert request["messages"][0]["role"] == "system"
    for fact in ("assistants.expense", DESCRIPTION, "get_policy", "Generate 4", "edge-cases"):
        assert fact in system

    recs = records(project / "out.jsonl")
    assert [r["id"] for r in recs] == ["G001", "G002", "G003", "G004"]
    assert all(r["status"] == "passed" for r in recs), recs
    assert all(r["name"].endswith("(edge-cases)") for r in recs)
    assert sorted(first_inputs(agent)) == [
        "Hello",
        "Hello",
        "I want to submit an expense report",
        "Submit $100,000 equipment purchase",
    ]
    assert "ℹ Input: agents:workers.test.generator?count=4" in out


def test_a_bad_generated_case_is_reported_and_left_out_and_the_rest_run(
    project: Path, agent: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    source = "agents:workers.test.generator?count=3&include_invalid=true"
    code, _, err = submit(capsys, "-i", source, "-o", "out.jsonl")
    assert code == 0, err
    assert metadata_of(agent.requests("generator")[0])["include_invalid"] is True
    [warning] = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warning.startswith("warning: generated case 2 (G002) left out: ")
    assert "contanis" in warning
    assert [r["id"] for r in records(project / "out.jsonl")] == ["G001", "G003"]
    assert sorted(first_inputs(agent)) == ["Hello", "Submit $100,000 equipment purchase"]


def bad_cases(body: dict[str, Any]) -> Reply:
    """A generator whose cases are all invalid, each in its own way."""
    cases = [
        {"id": "B1", "input": "Hello", "assertions": [{"type": "contanis", "value": "x"}]},
        {"id": "B2", "input": "Hi", "turns": [{"input": "Hi"}]},  # both forms at once
        {"id": "B3", "input": "Hi", "agent": "assistants.nope"},  # an agent that is not there
        "not a case",
    ]
    return say(json.dumps({"cases": cases}))


def test_a_generator_with_nothing_valid_is_an_input_error(
    project: Path, agent: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    agent.script("generator", bad_cases)
    code, out, err = submit(capsys, "-i", "agents:workers.test.generator")
    assert code == 2, err
    assert out == ""
    assert "no generated case was valid (4 generated" in err and "nothing was run" in err
    warned = [line for line in err.splitlines() if line.startswith("warning: generated case")]
    assert [w.split(" left out")[0] for w in warned] == [
        "warning: generated case 1 (B1)",
        "warning: generated case 2 (B2)",
        "warning: generated case 3 (B3)",
        "warning: generated case 4",
    ]
    assert "unknown agent 'assistants.nope'" in warned[2]
    assert agent.requests("expense") == [], "no target was called"


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (say('{"cases": []}'), "generator returned no cases"),
        (say("I cannot help with that."), "generator failed"),
        (Reply(status=500, error="boom"), "generator failed"),
    ],
)
def test_a_generator_that_gives_nothing_is_exit_2(
    project: Path,
    agent: ScriptedAgent,
    capsys: pytest.CaptureFixture[str],
    reply: Reply,
    expected: str,
) -> None:
    agent.script("generator", [reply])
    code, out, err = submit(capsys, "-i", "agents:workers.test.generator?count=2")
    assert code == 2, err
    assert out == ""
    assert expected in err and "nothing was run" in err
    assert agent.requests("expense") == []


def test_duplicate_ids_from_one_generator_keep_the_first(
    project: Path, agent: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    twice = {"id": "D1", "input": "Hello", "assertions": [{"type": "contains", "value": "help"}]}
    agent.script("generator", [say(json.dumps({"cases": [twice, twice, {"input": "Hello"}]}))])
    code, _, err = submit(capsys, "-i", "agents:workers.test.generator", "-o", "out.jsonl")
    assert code == 0, err
    assert "warning: generated case 2 (D1) left out: id: duplicate id 'D1'" in err
    # A case without an id gets one from the generator's name and its position.
    assert [r["id"] for r in records(project / "out.jsonl")] == ["D1", "workers.test.generator-003"]


# -- a generator script --------------------------------------------------------------------------

SCRIPT = """
import json
from pathlib import Path


def generate(params):
    Path("params.json").write_text(json.dumps(params))
    cases = [
        {"id": f"S{i}", "name": f"{params['scenario']} {i}", "input": "Hello",
         "assertions": [{"type": "contains", "value": "expense reports"}]}
        for i in range(1, params["count"] + 1)
    ]
    cases[0]["assertions"][0]["type"] = "contanis"  # one bad case
    return {"cases": cases}
"""


def test_a_generator_script_gets_the_parameters_and_its_cases_run(
    project: Path, agent: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "scripts" / "tests").mkdir()
    (project / "scripts" / "tests" / "expense.py").write_text(SCRIPT, encoding="utf-8")
    source = "scripts:tests.expense.generate?scenario=approval-flow&count=3&strict=false"
    code, _, err = submit(capsys, "-i", source, "-o", "out.jsonl")
    assert code == 0, err
    params = json.loads((project / "params.json").read_text())
    assert params == {
        "target_agent": "assistants.expense",
        "target_description": DESCRIPTION,
        "target_tools": TOOLS,
        "scenario": "approval-flow",
        "count": 3,
        "strict": False,
    }
    assert "warning: generated case 1 (S1) left out: " in err and "contanis" in err
    recs = records(project / "out.jsonl")
    assert [(r["id"], r["name"], r["status"]) for r in recs] == [
        ("S2", "approval-flow 2", "passed"),
        ("S3", "approval-flow 3", "passed"),
    ]
    assert agent.requests("generator") == []

    code, _, err = submit(capsys, "-i", "scripts:tests.missing")
    assert code == 2 and "no script found" in err


# -- --dry-run -o, then -i -----------------------------------------------------------------------


def test_dry_run_writes_generated_cases_that_read_back_unchanged(
    project: Path, agent: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "scripts" / "gen.py").write_text(SCRIPT, encoding="utf-8")
    source = "agents:workers.test.generator?count=5&include_invalid=true"
    code, out, err = submit(
        capsys,
        "-i",
        source,
        "-i",
        "scripts:gen?scenario=s&count=2",
        "--dry-run",
        "-o",
        "generated.jsonl",
    )
    assert code == 0, err
    assert out == "" and "5 case(s) written to generated.jsonl" in err
    assert agent.requests("expense") == [], "a dry run calls no target"
    written = (project / "generated.jsonl").read_bytes()
    cases = [json.loads(line) for line in written.decode().splitlines()]
    assert [c["id"] for c in cases] == ["G001", "G003", "G004", "G005", "S2"]
    assert cases[1]["type"] == "multi_turn" and len(cases[1]["turns"]) == 2

    # Read back: the very same bytes, and no generator is called again.
    calls = len(agent.requests("generator"))
    code, _, err = submit(capsys, "-i", "generated.jsonl", "--dry-run", "-o", "again.jsonl")
    assert code == 0, err
    assert (project / "again.jsonl").read_bytes() == written
    code, out, _ = submit(capsys, "-i", "generated.jsonl", "--dry-run")
    assert out.encode() == written
    assert len(agent.requests("generator")) == calls

    # And the file runs like the generator's own cases do.
    code, _, err = submit(capsys, "-i", "generated.jsonl", "-o", "out.jsonl")
    assert code == 0, err
    assert [r["status"] for r in records(project / "out.jsonl")] == ["passed"] * 5
    assert len(first_inputs(agent)) == 5


def test_a_key_in_a_generator_reference_is_masked_in_labels_and_suite_names(
    project: Path, agent: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    """`-i agents:GEN?api_key=...`: the key reaches the generator (as its parameter) and
    shows nowhere: not in the console's input line, the run's suite name or the store."""
    secret = "sk-generator-7f3a9c"
    source = f"agents:workers.test.generator?count=2&api_key={secret}"
    code, out, err = submit(capsys, "-i", source, "-o", "out.jsonl")
    assert code == 0, err
    [request] = agent.requests("generator")
    assert metadata_of(request)["api_key"] == secret
    assert "ℹ Input: agents:workers.test.generator?count=2&api_key=***" in out
    code, runs, err = submit_subcommand(capsys, "runs")
    assert code == 0, err
    assert "api_key=***" in runs
    for text in (out, err, runs):
        assert secret not in text
    for stored in (project / ".agenttest").rglob("*"):
        if stored.is_file():
            assert secret.encode() not in stored.read_bytes(), stored


def submit_subcommand(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err
