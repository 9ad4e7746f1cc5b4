"""`agenttest-submit schema [cases|yaml|config]`: JSON Schemas for editors, generated from
the models the loaders use. Every case file and agenttest.yaml the project ships (the
examples, the demo suite, the spec's examples) validates; what the loader refuses, the
schema refuses too (typos, unknown assertion types and protocols); `${VAR}` is allowed
wherever agenttest.yaml is interpolated."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from agenttest_submit.cli.main import main
from agenttest_submit.commands.schema import SCHEMA_KINDS, schema_text
from agenttest_worker.agents.config_loading import load_config
from agenttest_worker.cases.files import iter_cases
from agenttest_worker.errors import ConfigError, InputProblem

ROOT = Path(__file__).resolve().parents[1]
CASE_FILES = sorted(
    p
    for folder in ("examples", "agenttest_worker/demo/suite", "tests/fixtures")
    for p in (ROOT / folder).rglob("*")
    if p.suffix in (".jsonl", ".json", ".yaml", ".yml")
    and p.name != "agenttest.yaml"
    # CI pipelines that run agenttest, not case files.
    and not p.is_relative_to(ROOT / "examples" / "ci")
)
CONFIG_FILES = sorted(ROOT.glob("**/agenttest.yaml"))


@functools.cache  # read-only: each kind's schema is built and checked once per module
def schema(kind: str) -> jsonschema.protocols.Validator:
    loaded = json.loads(schema_text(kind))
    jsonschema.Draft7Validator.check_schema(loaded)
    return jsonschema.Draft7Validator(loaded)


def errors(kind: str, value: Any) -> list[str]:
    return [e.message for e in schema(kind).iter_errors(value)]


def loads(path: Path) -> bool:
    return not any(isinstance(item, InputProblem) for item in iter_cases(path))


def json_documents(text: str) -> list[Any]:
    decoder, pos, found = json.JSONDecoder(), 0, []
    while pos < len(text.rstrip()):
        while text[pos].isspace():
            pos += 1
        value, pos = decoder.raw_decode(text, pos)
        found.append(value)
    return found


def documents(path: Path) -> list[tuple[str, Any]]:
    """(schema kind, value) of each document an editor (or a line check) validates."""
    text = path.read_text(encoding="utf-8-sig")
    if path.suffix in (".yaml", ".yml"):
        return [("yaml", yaml.safe_load(text))]
    if path.suffix == ".jsonl":
        try:
            return [("cases", json.loads(line)) for line in text.splitlines() if line.strip()]
        except ValueError:
            pass  # cases written as the spec prints them: one pretty object after another
    return [("cases", value) for value in json_documents(text)]


# Spec examples that are not case files the loader takes: a case without an id, and
# the spec's example of the results a run writes.
NOT_CASE_FILES = {"hybrid.json", "jsonl_output_example.json"}
LOADING = [p for p in CASE_FILES if p.name not in NOT_CASE_FILES]


def test_the_corpus_is_there() -> None:
    names = {p.name for p in CASE_FILES}
    assert {"expense.jsonl", "tdx-flat.yaml", "tdx-rounds.yaml", "tdx-mixed.yaml"} <= names
    assert "expense-suite.jsonl" in names
    assert len(CONFIG_FILES) >= 2
    assert {p.name for p in CASE_FILES if not loads(p)} == NOT_CASE_FILES


@pytest.mark.parametrize("path", LOADING, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_case_file_that_loads_validates(path: Path) -> None:
    for kind, value in documents(path):
        assert errors(kind, value) == [], (path, value)


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_agenttest_yaml_validates(path: Path) -> None:
    load_config(path, env={})  # it loads
    assert errors("config", yaml.safe_load(path.read_text(encoding="utf-8"))) == []


# -- what the loader accepts beyond the fields' types ------------------------------------

GOOD_CASES: list[Any] = [
    {"id": 7, "input": 42, "tags": "smoke"},
    {"id": "a", "input": "Hi", "assertions": [{"type": "contains", "value": 3500}]},
    {"id": "b", "input": "Hi", "assertions": [{"type": "regex", "value": "^Hi"}]},
    {"id": "c", "input": "Hi", "assertions": [{"type": "type", "path": "$", "value": "str"}]},
    {"id": "d", "turns": [{"input": "Hi"}], "interactive": {"enabled": True, "timeout": "5m"}},
    {"id": "e", "turns": [{"input": "Hi"}], "interactive": {"timeout": 30}},
    {"id": "f", "input": "Hi", "simulator": {"use": "sim", "metadata": {"max_turns": 3}}},
    [{"id": "g", "input": "Hi"}, {"id": "h", "input": "Ho"}],
    {"cases": [{"id": "i", "input": "Hi"}]},
    {"id": "j", "input": "Hi", "final_assertions": [{"type": "golden", "match": "exact"}]},
    {"id": "k", "input": "Hi", "final_assertions": [{"type": "golden", "args": "ignore"}]},
]
BAD_CASES: list[tuple[Any, str]] = [
    ({"id": "a", "inptu": "Hi"}, "typo in a field"),
    ({"id": "b", "input": "Hi", "assertions": [{"type": "contians", "value": "x"}]}, "type"),
    ({"id": "c", "input": "Hi", "assertions": [{"type": "contains"}]}, "value missing"),
    ({"id": "d", "input": "Hi", "assertions": [{"type": "regex"}]}, "no pattern"),
    ({"id": "", "input": "Hi"}, "empty id"),
    ({"input": "Hi"}, "no id"),
    ({"id": "e", "turns": [{"input": "Hi"}], "interactive": {"timeout": "soon"}}, "duration"),
    ({"id": "f", "input": "Hi", "max_turns": 0}, "max_turns"),
    ({"id": "g", "input": "Hi", "final_assertions": [{"type": "golden", "match": "x"}]}, "golden"),
    ([], "no cases"),
    ({"$schema": "./agenttest-cases.json", "id": "h", "input": "Hi"}, "$schema in a case"),
]


@pytest.mark.parametrize("value", GOOD_CASES, ids=lambda v: json.dumps(v)[:40])
def test_what_the_loader_accepts_the_schema_accepts(tmp_path: Path, value: Any) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(value), encoding="utf-8")
    assert loads(path)
    assert errors("cases", value) == []


@pytest.mark.parametrize(("value", "why"), BAD_CASES, ids=[w for _, w in BAD_CASES])
def test_what_the_loader_refuses_the_schema_refuses(tmp_path: Path, value: Any, why: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(value), encoding="utf-8")
    assert not loads(path), why
    assert errors("cases", value), why


def test_yaml_files_flat_rounds_and_mixed() -> None:
    good = {
        "agent": "local.assistant",
        "tests": [
            {"name": "flat", "user_input": "Hello", "criteria": "greets", "tags": "smoke"},
            {"name": "rounds", "rounds": [{"user_input": 1, "criteria": "x"}], "max_turns": 3},
        ],
    }
    assert errors("yaml", good) == []
    assert errors("yaml", {"tests": [{"name": "neither"}]})
    assert errors("yaml", {"tests": [{"name": "t", "user_input": "x", "critera": "typo"}]})
    assert errors("yaml", {"tests": [], "agent": "a"})
    assert errors("yaml", {"tets": [{"name": "t", "user_input": "x"}]})


# -- agenttest.yaml and ${VAR} -----------------------------------------------------------


def test_config_values_may_be_environment_references(tmp_path: Path) -> None:
    text = (
        "agents:\n"
        "  a:\n"
        "    protocol: ${PROTOCOL:-openai}\n"
        "    base_url: ${URL}\n"
        "    model: ${MODEL}\n"
        "    timeout: ${TIMEOUT:-10s}\n"
        "    base_delay: 250ms\n"
        "    max_retries: ${RETRIES}\n"
        "    metadata: ${METADATA_MODE:-object}\n"
        "    headers: {X-Team: '${TEAM}'}\n"
        "    rate_limit: {requests_per_second: '${RPS:-5}', concurrency: 2}\n"
        "    pricing: {prompt_per_million: '${PRICE:-0.5}'}\n"
        "defaults: {judge: a}\n"
        "scripts_dir: ${SCRIPTS:-scripts}\n"
    )
    path = tmp_path / "agenttest.yaml"
    path.write_text(text, encoding="utf-8")
    env = {"URL": "http://127.0.0.1:8700/v1", "MODEL": "m", "RETRIES": "2", "TEAM": "t"}
    config = load_config(path, env=env)
    assert config.agents["a"].max_retries == 2
    assert errors("config", yaml.safe_load(text)) == []


@pytest.mark.parametrize(
    ("agent", "why"),
    [
        ({"protocol": "grpc", "base_url": "http://h/v1"}, "unknown protocol"),
        ({"base_url": "http://h/v1", "max_retries": "many"}, "not a number"),
        ({"base_url": "http://h/v1", "timeout": "soon"}, "not a duration"),
        ({"base_url": "http://h/v1", "modle": "m"}, "typo"),
        ({"base_url": "http://h/v1", "method": "GET"}, "method"),
    ],
)
def test_config_mistakes_are_refused(tmp_path: Path, agent: dict[str, Any], why: str) -> None:
    data = {"agents": {"a": agent}}
    path = tmp_path / "agenttest.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ConfigError):
        load_config(path, env={})
    assert errors("config", data), why


def test_internal_config_fields_are_not_offered() -> None:
    loaded = json.loads(schema_text("config"))
    assert "path" not in loaded["properties"]
    assert errors("config", {"path": "/etc/agenttest.yaml"})


# -- the command -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", SCHEMA_KINDS)
def test_the_command_prints_each_schema(capsys: pytest.CaptureFixture[str], kind: str) -> None:
    assert main(["schema", kind]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert json.loads(out) == json.loads(schema_text(kind))


def test_schema_alone_prints_the_case_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(schema_text("cases"))


def test_an_unknown_schema_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "junit"]) == 2
    assert "invalid choice: 'junit'" in capsys.readouterr().err


def test_the_console_script_needs_no_database(tmp_path: Path) -> None:
    # Written for editors on any machine: no store, broker or agenttest.yaml involved.
    done = subprocess.run(
        [sys.executable, "-m", "agenttest_submit.cli", "schema", "config"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "AGENTTEST_DATABASE_URL": "postgresql://nowhere:1/x"},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["title"] == "agenttest.yaml"
    assert not (tmp_path / ".agenttest").exists()


def test_the_guide_wires_the_schemas_it_generates() -> None:
    guide = (ROOT / "docs" / "reports.md").read_text(encoding="utf-8")
    section = guide.split("## Schemas for editors", 1)[1].split("\n## ", 1)[0]
    settings = json.loads(section.split("```json", 1)[1].split("```", 1)[0])
    generated = {
        line.split("> ")[1].strip()
        for line in section.splitlines()
        if "agenttest-submit schema" in line and "> " in line
    }
    wired = {settings["json.schemas"][0]["url"].removeprefix("./")}
    wired |= {path.removeprefix("./") for path in settings["yaml.schemas"]}
    assert wired == generated
