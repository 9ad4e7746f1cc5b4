"""agenttest.yaml: ${VAR}, ${VAR:-default}, $$, missing variables located by file/line/field,
api_key refused, and --config versus the working directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agenttest_submit.cli.main import main
from agenttest_worker.agents.config import ProjectConfig
from agenttest_worker.agents.config_loading import interpolate, load_config
from agenttest_worker.errors import ConfigError, InputProblem


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def config_problems(path: Path, env: dict[str, str] | None = None) -> list[InputProblem]:
    with pytest.raises(ConfigError) as caught:
        load_config(path, env=env or {})
    return caught.value.problems


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, err
    return code, out, err


# -- interpolation -------------------------------------------------------------------------


def test_variables_defaults_and_dollars(tmp_path: Path) -> None:
    path = write(
        tmp_path / "agenttest.yaml",
        "agents:\n"
        "  assistants.expense:\n"
        "    base_url: ${EXPENSE_URL}\n"
        "    model: ${MODEL:-expense}\n"
        "    timeout: ${TIMEOUT:-45s}\n"
        "    headers:\n"
        "      X-Price: $$5 per ${UNIT:-call}\n"
        "      X-Literal: $${NOT_A_VAR}\n"
        "      X-Mixed: a${A}b${B:-}c\n"
        "      X-Lone: cost $ 5\n"
        '    tools: ["${TOOL}", plain]\n'
        "    max_retries: 2\n",
    )
    config = load_config(
        path,
        env={"EXPENSE_URL": "http://10.0.0.1:8700/v1", "A": "1", "TOOL": "create_expense"},
    )
    agent = config.agents["assistants.expense"]
    assert agent.base_url == "http://10.0.0.1:8700/v1"
    assert agent.model == "expense"
    assert agent.timeout == 45.0
    assert agent.headers == {
        "X-Price": "$5 per call",
        "X-Literal": "${NOT_A_VAR}",  # $$ escapes: no lookup, no missing-variable error
        "X-Mixed": "a1bc",
        "X-Lone": "cost $ 5",
    }
    assert agent.tools == ["create_expense", "plain"]
    assert agent.max_retries == 2
    assert config.path == str(path)


def test_set_values_beat_defaults_and_empty_values_take_them(tmp_path: Path) -> None:
    path = write(
        tmp_path / "agenttest.yaml",
        "agents:\n"
        "  a:\n"
        "    base_url: ${URL:-http://default/v1}\n"
        "    model: ${MODEL:-fallback}\n"
        '    description: "[${DESC}]"\n',
    )
    config = load_config(path, env={"URL": "http://set/v1", "MODEL": "", "DESC": ""})
    assert config.agents["a"].base_url == "http://set/v1"
    assert config.agents["a"].model == "fallback"  # `:-` also covers set-but-empty, as in sh
    assert config.agents["a"].description == "[]"  # plain ${VAR} keeps an empty value


def test_process_environment_is_used_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path / "agenttest.yaml", "agents:\n  a:\n    base_url: ${AT_TEST_URL}\n")
    monkeypatch.setenv("AT_TEST_URL", "http://from-env/v1")
    assert load_config(path).agents["a"].base_url == "http://from-env/v1"


def test_interpolate_leaves_keys_and_non_strings_alone() -> None:
    missing: list[tuple[tuple[str | int, ...], str]] = []
    data = {"${K}": ["${V}", 3, True, None, {"n": "${N:-x}"}]}
    result = interpolate(data, {"V": "v"}, lambda path, var: missing.append((path, var)))
    assert result == {"${K}": ["v", 3, True, None, {"n": "x"}]}
    assert missing == []


def test_missing_variable_names_file_line_and_field(tmp_path: Path) -> None:
    path = write(
        tmp_path / "agenttest.yaml",
        "# comment\n"
        "agents:\n"
        "  assistants.expense:\n"
        "    base_url: ${EXPENSE_URL}\n"
        "    headers:\n"
        "      Authorization: Bearer ${TOKEN}\n"
        "    tools:\n"
        "      - ${TOOL_ONE}\n"
        "defaults:\n"
        "  judge: ${JUDGE:-}\n",
    )
    problems = config_problems(path)
    assert [str(p) for p in problems] == [
        f"{path}:4: agents.assistants.expense.base_url: environment variable EXPENSE_URL is not "
        "set (write ${EXPENSE_URL:-default} for a default)",
        f"{path}:6: agents.assistants.expense.headers.Authorization: environment variable TOKEN "
        "is not set (write ${TOKEN:-default} for a default)",
        f"{path}:8: agents.assistants.expense.tools[0]: environment variable TOOL_ONE is not set "
        "(write ${TOOL_ONE:-default} for a default)",
    ]
    assert (problems[0].file, problems[0].line, problems[0].field) == (
        str(path),
        4,
        "agents.assistants.expense.base_url",
    )


def test_unset_variables_and_other_problems_are_listed_together(tmp_path: Path) -> None:
    """One attempt shows what is wrong beyond the unset variables, without repeating what
    the variables' empty values cause (here: agent `a` then has no base_url)."""
    path = write(
        tmp_path / "agenttest.yaml",
        "agents:\n"
        "  a:\n"
        "    base_url: ${AT_NOT_SET_URL}\n"
        "  b:\n"
        "    base_url: http://127.0.0.1:9/v1\n"
        "    protocol: grpc\n"
        "    timout: 5s\n",
    )
    problems = config_problems(path)
    assert [(p.line, p.field) for p in problems] == [
        (3, "agents.a.base_url"),
        (6, "agents.b.protocol"),
        (7, "agents.b.timout"),
    ]
    assert "AT_NOT_SET_URL is not set" in problems[0].message
    assert problems[2].message == "unknown field (a typo?)"


def test_missing_variable_through_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AT_MISSING_URL", raising=False)
    write(tmp_path / "agenttest.yaml", "agents:\n  a:\n    base_url: ${AT_MISSING_URL}\n")
    write(tmp_path / "c.jsonl", '{"id": "c", "input": "x"}\n')
    code, out, err = run(capsys, "-i", "c.jsonl", "-n", "a", "--dry-run")
    assert (code, out) == (2, "")
    assert err == (
        "agenttest-submit: 1 input problem; nothing was run:\n"
        f"  {Path.cwd() / 'agenttest.yaml'}:3: agents.a.base_url: environment variable "
        "AT_MISSING_URL is not set (write ${AT_MISSING_URL:-default} for a default)\n"
    )


# -- secrets --------------------------------------------------------------------------------


def test_api_key_in_the_file_is_rejected(tmp_path: Path) -> None:
    path = write(
        tmp_path / "agenttest.yaml",
        "agents:\n"
        "  good:\n"
        "    base_url: http://x/v1\n"
        "  leaky:\n"
        "    base_url: http://x/v1\n"
        "    api_key: sk-123\n",
    )
    assert config_problems(path) == [
        InputProblem(
            "api_key must not be written in the config: put the key in an environment variable "
            "and name it with api_key_env",
            file=str(path),
            line=4,
            field="agents.leaky",
        )
    ]


def test_api_key_from_a_variable_is_rejected_too(tmp_path: Path) -> None:
    path = write(
        tmp_path / "agenttest.yaml", "agents:\n  a:\n    base_url: http://x/v1\n    api_key: ${K}\n"
    )
    [problem] = config_problems(path, env={"K": "sk-secret"})
    assert problem.message.startswith("api_key must not be written in the config")
    assert "sk-secret" not in str(problem)


def test_api_key_env_is_read_at_call_time_and_never_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(
        tmp_path / "agenttest.yaml",
        "agents:\n  a:\n    base_url: http://x/v1\n    api_key_env: AT_TEST_KEY\n",
    )
    monkeypatch.delenv("AT_TEST_KEY", raising=False)
    config = load_config(path)
    agent = config.agents["a"]
    assert agent.api_key() is None
    monkeypatch.setenv("AT_TEST_KEY", "sk-live")
    assert agent.api_key() == "sk-live"
    assert "sk-live" not in json.dumps(config.model_dump(mode="json"))


# -- other config problems are located as well -----------------------------------------


def test_config_typos_and_bad_values(tmp_path: Path) -> None:
    path = write(
        tmp_path / "agenttest.yaml",
        "agents:\n"
        "  a:\n"
        "    base_ur: http://x/v1\n"
        "  b:\n"
        "    base_url: http://x/v1\n"
        "    timeout: soon\n"
        "  c:\n"
        "    protocol: http\n",
    )
    assert [(p.line, p.field, p.message) for p in config_problems(path)] == [
        (3, "agents.a.base_ur", "unknown field (a typo?)"),
        (
            6,
            "agents.b.timeout",
            "'soon' is not a duration (write e.g. 30s, 5m, 1h30m, 250ms or seconds)",
        ),
        (7, "agents.c", "an http agent needs url"),
    ]
    path = write(tmp_path / "agenttest.yaml", "agents:\n  a:\n    model: m\n")
    assert [(p.line, p.field, p.message) for p in config_problems(path)] == [
        (2, "agents.a", "an openai agent needs base_url (e.g. http://127.0.0.1:8700/v1)"),
    ]


def test_defaults_must_name_known_agents(tmp_path: Path) -> None:
    path = write(
        tmp_path / "agenttest.yaml",
        "agents:\n"
        "  workers.test.validator:\n"
        "    base_url: http://x/v1\n"
        "defaults:\n"
        "  judge: workers.test.validater\n"
        "  simulator: agents:nobody\n",
    )
    assert config_problems(path) == [
        InputProblem(
            f"unknown agent 'workers.test.validater' in {path}; did you mean "
            "'workers.test.validator'?",
            file=str(path),
            line=5,
            field="defaults.judge",
        ),
        InputProblem(
            f"unknown agent 'nobody' in {path} (known: workers.test.validator)",
            file=str(path),
            line=6,
            field="defaults.simulator",
        ),
    ]


def test_broken_yaml_config(tmp_path: Path) -> None:
    path = write(tmp_path / "agenttest.yaml", "agents:\n  a: [\n")
    [problem] = config_problems(path)
    assert problem.file == str(path) and problem.message.startswith("invalid YAML: ")
    path = write(tmp_path / "agenttest.yaml", "- a\n- b\n")
    assert config_problems(path) == [
        InputProblem("agenttest.yaml must be a mapping", file=str(path), line=1)
    ]


def test_empty_config_is_an_empty_project(tmp_path: Path) -> None:
    path = write(tmp_path / "agenttest.yaml", "# nothing yet\n")
    config = load_config(path)
    assert config.agents == {} and config.defaults.judge is None
    assert config.awaiting_tools == ["request_confirmation", "ask_user", "get_user_input"]


# -- --config versus the working directory ------------------------------------------------


def test_config_is_found_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "agenttest.yaml", "agents:\n  here:\n    base_url: http://x/v1\n")
    monkeypatch.chdir(tmp_path)
    config = load_config()
    assert list(config.agents) == ["here"]
    assert config.path == str(Path.cwd() / "agenttest.yaml")


def test_agenttest_yml_is_found_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "agenttest.yml", "agents:\n  yml:\n    base_url: http://x/v1\n")
    monkeypatch.chdir(tmp_path)
    assert list(load_config().agents) == ["yml"]


def test_no_config_anywhere_is_an_empty_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_config() == ProjectConfig()
    assert ProjectConfig().unknown_agent_message("x") == (
        "unknown agent 'x' (no agenttest.yaml found; use --config)"
    )


def test_explicit_config_beats_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENTTEST_SCRIPTS_DIR", raising=False)
    write(tmp_path / "agenttest.yaml", "agents:\n  here:\n    base_url: http://x/v1\n")
    other = write(
        tmp_path / "elsewhere" / "other.yaml",
        "agents:\n  there:\n    base_url: http://y/v1\nscripts_dir: my_scripts\n",
    )
    monkeypatch.chdir(tmp_path)
    config = load_config("elsewhere/other.yaml")
    assert list(config.agents) == ["there"]
    # relative paths in the file are relative to the file, not the working directory
    assert config.scripts_path == (other.parent / "my_scripts").resolve()
    assert load_config().scripts_path == (tmp_path / "scripts").resolve()


def test_missing_explicit_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "agenttest.yaml", "agents: {}\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        load_config("nothere.yaml")
    assert caught.value.problems == [InputProblem("config file not found", file="nothere.yaml")]


def test_config_flag_through_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path / "agenttest.yaml", "agents:\n  alpha:\n    base_url: http://x/v1\n")
    write(tmp_path / "elsewhere" / "other.yaml", "agents:\n  zulu:\n    base_url: http://y/v1\n")
    write(tmp_path / "c.jsonl", '{"id": "c", "input": "x"}\n')
    monkeypatch.chdir(tmp_path)

    code, out, _ = run(capsys, "-i", "c.jsonl", "-n", "alpha", "--dry-run")
    assert code == 0 and json.loads(out)["id"] == "c"

    code, out, err = run(capsys, "-i", "c.jsonl", "-n", "zulu", "--dry-run")
    assert (code, out) == (2, "")
    assert err.endswith(
        f"  -n: unknown agent 'zulu' in {Path.cwd() / 'agenttest.yaml'} (known: alpha)\n"
    )

    code, out, _ = run(
        capsys, "--config", "elsewhere/other.yaml", "-i", "c.jsonl", "-n", "zulu", "--dry-run"
    )
    assert code == 0 and json.loads(out)["id"] == "c"

    code, _, err = run(
        capsys, "--config", "elsewhere/other.yaml", "-i", "c.jsonl", "-n", "alpha", "--dry-run"
    )
    assert code == 2
    assert err.endswith("  -n: unknown agent 'alpha' in elsewhere/other.yaml (known: zulu)\n")

    code, _, err = run(capsys, "--config", "nothere.yaml", "-i", "c.jsonl", "-n", "alpha")
    assert code == 2
    assert err == (
        "agenttest-submit: 1 input problem; nothing was run:\n"
        "  nothere.yaml: config file not found\n"
    )


def test_no_config_through_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path / "c.jsonl", '{"id": "c", "input": "x"}\n')
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "-i", "c.jsonl", "-n", "assistants.expense", "--dry-run")
    assert code == 2
    assert err.endswith(
        "  -n: unknown agent 'assistants.expense' (no agenttest.yaml found; use --config)\n"
    )
