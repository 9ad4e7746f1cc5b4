"""scripts:NAME and the script protocol: resolution, the folder boundary, replies, errors."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from agent_servers import run

from agenttest_worker.agents.config import AgentConfig, ProjectConfig
from agenttest_worker.agents.interface import AgentError, AgentReply, AgentRequest
from agenttest_worker.agents.pool import AgentPool
from agenttest_worker.agents.script_loader import ScriptError, load_script, resolve_script
from agenttest_worker.results import AgentCallRecord, ToolCall

HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    folder = tmp_path / "scripts"
    folder.mkdir()
    return folder


def write(folder: Path, relative: str, source: str) -> Path:
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def project(scripts: Path, **agents: str) -> ProjectConfig:
    return ProjectConfig(
        agents={name: AgentConfig(protocol="script", use=use) for name, use in agents.items()},
        scripts_dir=str(scripts),
    )


def respond_with(scripts: Path, source: str, metadata: dict[str, Any] | None = None) -> AgentReply:
    write(scripts, "local/fake.py", source)
    pool = AgentPool(project(scripts, **{"local.fake": "scripts:local.fake"}))
    request = AgentRequest(role="target", messages=HELLO, metadata=metadata or {})
    return run(pool.client("local.fake").complete(request))


# -- the script protocol -----------------------------------------------------------------------


def test_respond_returning_text(scripts: Path) -> None:
    reply = respond_with(
        scripts,
        """
        def respond(messages, metadata):
            return f"you said {messages[-1]['content']} in {metadata['locale']}"
        """,
        {"locale": "fr"},
    )
    assert reply.content == "you said Hello in fr"
    assert reply.tool_calls == []
    assert reply.call is not None
    assert reply.call.agent == "local.fake" and reply.call.role == "target"
    assert reply.call.error is None


def test_respond_returning_a_dict(scripts: Path) -> None:
    reply = respond_with(
        scripts,
        """
        def respond(messages, metadata):
            return {
                "content": "Which amount?",
                "tool_calls": [{"name": "ask_user", "args": {"field": "amount"}}],
                "awaiting_input": True,
                "input_hint": "amount",
                "state": {"step": 1},
            }
        """,
    )
    assert reply.content == "Which amount?"
    assert reply.tool_calls == [ToolCall(name="ask_user", args={"field": "amount"})]
    assert reply.awaiting_input is True
    assert reply.input_hint == "amount"
    assert reply.state == {"step": 1}


def test_async_respond(scripts: Path) -> None:
    reply = respond_with(
        scripts,
        """
        import asyncio

        async def respond(messages, metadata):
            await asyncio.sleep(0)
            return "async hello"
        """,
    )
    assert reply.content == "async hello"


def test_the_metadata_is_a_copy(scripts: Path) -> None:
    metadata = {"n": 1}
    respond_with(
        scripts,
        """
        def respond(messages, metadata):
            metadata["n"] = 99
            return "ok"
        """,
        metadata,
    )
    assert metadata == {"n": 1}


def test_a_script_that_raises_is_a_script_error(scripts: Path) -> None:
    with pytest.raises(AgentError) as caught:
        respond_with(
            scripts,
            """
            def respond(messages, metadata):
                raise KeyError("amount")
            """,
        )
    error = caught.value
    assert error.kind == "script"
    assert error.message == "agent error: script local.fake raised KeyError: 'amount'"
    assert error.call is not None and error.call.error == error.message


def test_a_script_that_fails_to_import_is_a_script_error(scripts: Path) -> None:
    with pytest.raises(AgentError) as caught:
        respond_with(scripts, "import no_such_module_here\n")
    assert caught.value.kind == "script"
    assert "failed to import: ModuleNotFoundError" in caught.value.message


@pytest.mark.parametrize("value", ["None", "42", "['a']"])
def test_a_script_returning_neither_text_nor_dict_is_an_error(scripts: Path, value: str) -> None:
    with pytest.raises(AgentError) as caught:
        respond_with(scripts, f"def respond(messages, metadata):\n    return {value}\n")
    assert caught.value.kind == "script"
    assert "expected text or" in caught.value.message


def test_a_script_with_a_dataclass_loads(scripts: Path) -> None:
    # dataclasses look their module up in sys.modules while the class is created.
    reply = respond_with(
        scripts,
        """
        from __future__ import annotations

        import dataclasses
        from typing import ClassVar

        @dataclasses.dataclass
        class Answer:
            text: str
            kind: ClassVar[str] = "answer"

        def respond(messages, metadata):
            return Answer("dataclass ok").text
        """,
    )
    assert reply.content == "dataclass ok"


def test_an_edited_script_is_reloaded(scripts: Path) -> None:
    assert respond_with(scripts, "def respond(m, md):\n    return 'v1'\n").content == "v1"
    path = scripts / "local" / "fake.py"
    path.write_text("def respond(m, md):\n    return 'v2'\n")
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    pool = AgentPool(project(scripts, f="scripts:local.fake"))
    reply = run(pool.client("f").complete(AgentRequest(role="target", messages=HELLO)))
    assert reply.content == "v2"


# -- resolution ------------------------------------------------------------------------------


def test_file_with_the_role_function(scripts: Path) -> None:
    write(
        scripts,
        "tests/validate-expense.py",
        """
        def validate(response, metadata): return True
        def simulate(messages, metadata): return {"input": "hi"}
        def generate(params): return []
        def respond(messages, metadata): return "hi"
        """,
    )
    for role, function in [
        ("assertion", "validate"),
        ("simulator", "simulate"),
        ("generator", "generate"),
        ("agent", "respond"),
    ]:
        resolved = resolve_script(scripts, "tests.validate-expense", role)  # type: ignore[arg-type]
        assert resolved.file == (scripts / "tests" / "validate-expense.py").resolve()
        assert resolved.function == function
        assert load_script(scripts, "tests.validate-expense", role).__name__ == function  # type: ignore[arg-type]


def test_module_function_with_dashes_as_underscores(scripts: Path) -> None:
    write(scripts, "tests.py", "def validate_expense(response, metadata): return 'module'\n")
    resolved = resolve_script(scripts, "tests.validate-expense", "assertion")
    assert resolved.file == (scripts / "tests.py").resolve()
    assert resolved.function == "validate_expense"
    assert load_script(scripts, "tests.validate-expense", "assertion")(None, None) == "module"


def test_the_file_wins_over_the_module_function(scripts: Path) -> None:
    write(scripts, "tests.py", "def check(response, metadata): return 'module'\n")
    write(scripts, "tests/check.py", "def validate(response, metadata): return 'file'\n")
    assert load_script(scripts, "tests.check", "assertion")(None, None) == "file"


def test_main_is_the_fallback(scripts: Path) -> None:
    write(scripts, "checks/only_main.py", "def main(*args): return 'main'\n")
    assert load_script(scripts, "checks.only_main", "simulator")() == "main"


def test_missing_function_and_missing_file(scripts: Path) -> None:
    write(scripts, "tests.py", "def other(): pass\n")
    with pytest.raises(ScriptError, match=r"tests\.py has no function validate_expense\(\)"):
        load_script(scripts, "tests.validate-expense", "assertion")
    write(scripts, "lonely.py", "VALUE = 1\n")
    with pytest.raises(ScriptError, match=r"lonely\.py has no function respond\(\)"):
        load_script(scripts, "lonely", "agent")
    with pytest.raises(ScriptError, match="no script found") as caught:
        load_script(scripts, "nowhere.thing", "agent")
    assert "nowhere/thing.py" in str(caught.value) and "nowhere.py" in str(caught.value)


@pytest.mark.parametrize(
    ("source", "reference", "why"),
    [
        ("from subprocess import call\n", "tools.call", "not a function defined in that file"),
        ("import os\nsystem = os.system\n", "tools.system", "not a function defined in that file"),
        ("def _helper(*a): return 'x'\n", "tools._helper", "names starting with _"),
        ("def f(): pass\n", "tools.__init__", "names starting with _"),
        ("class respond:\n    pass\n", "tools.respond", "not a function defined in that file"),
    ],
)
def test_only_functions_the_script_defines_can_be_referenced(
    scripts: Path, source: str, reference: str, why: str
) -> None:
    write(scripts, "tools.py", source)
    with pytest.raises(ScriptError, match="has no function") as refused:
        load_script(scripts, reference, "agent")
    assert why in str(refused.value)


def test_an_imported_name_is_refused_through_the_role_session(scripts: Path) -> None:
    write(scripts, "local/fake.py", "from subprocess import call as respond\n")
    pool = AgentPool(project(scripts, **{"local.fake": "scripts:local.fake"}))
    request = AgentRequest(role="target", messages=HELLO, metadata={})
    with pytest.raises(AgentError, match="not a function defined in that file"):
        run(pool.client("local.fake").complete(request))


@pytest.mark.parametrize(
    "name", ["..", "../outside", "a..b", "/etc/passwd", "tests/check", ".hidden", "a\\b", ""]
)
def test_names_that_are_paths_are_refused(scripts: Path, name: str) -> None:
    with pytest.raises(ScriptError, match="not a valid script name"):
        resolve_script(scripts, name, "agent")


def test_a_symlinked_file_pointing_outside_is_refused(scripts: Path, tmp_path: Path) -> None:
    outside = write(tmp_path, "elsewhere/evil.py", "def respond(m, md): return 'pwned'\n")
    (scripts / "evil.py").symlink_to(outside)
    with pytest.raises(ScriptError, match="points outside the scripts folder"):
        load_script(scripts, "evil", "agent")


def test_a_symlinked_folder_pointing_outside_is_refused(scripts: Path, tmp_path: Path) -> None:
    write(tmp_path, "elsewhere/evil.py", "def respond(m, md): return 'pwned'\n")
    (scripts / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(ScriptError, match="points outside the scripts folder"):
        load_script(scripts, "linked.evil", "agent")


def test_a_symlink_inside_the_folder_is_allowed(scripts: Path) -> None:
    target = write(scripts, "real/impl.py", "def respond(m, md): return 'inside'\n")
    (scripts / "alias.py").symlink_to(target)
    assert load_script(scripts, "alias", "agent")([], {}) == "inside"


def test_a_symlinked_scripts_folder_is_fine(scripts: Path, tmp_path: Path) -> None:
    write(scripts, "ok.py", "def respond(m, md): return 'ok'\n")
    link = tmp_path / "scripts-link"
    link.symlink_to(scripts, target_is_directory=True)
    assert load_script(link, "ok", "agent")([], {}) == "ok"


def test_bad_names_through_the_role_session_are_reported_not_raised(scripts: Path) -> None:
    log: list[AgentCallRecord] = []
    session = AgentPool(project(scripts)).session(log)
    outcome = run(session.run_script_assertion("scripts:../evil", {}, {}))
    assert outcome.passed is False and outcome.error is not None
    assert "not a valid name" in outcome.error
    with pytest.raises(AgentError) as caught:
        run(session.simulate("scripts:../evil", HELLO, {}, session_id=None, case_id="c", turn=1))
    assert caught.value.kind == "config"
    assert log == []


def test_a_script_agent_config_cannot_name_a_path() -> None:
    with pytest.raises(ValueError, match="not a valid name"):
        AgentConfig(protocol="script", use="scripts:../outside")


# -- scripts in the other roles ----------------------------------------------------------------


def test_script_assertion_simulator_and_generator(scripts: Path) -> None:
    write(
        scripts,
        "roles.py",
        """
        def check_total(response, metadata):
            ok = "3500" in response["output"]
            return {"passed": ok, "reason": "total " + ("found" if ok else "missing"), "score": 1}

        def next_input(messages, metadata):
            return {"input": "PO-" + str(metadata["turn_number"]), "reasoning": "asked for PO"}

        def cases(params):
            return {"cases": [{"id": "S1", "input": params["topic"]}]}
        """,
    )
    log: list[AgentCallRecord] = []
    session = AgentPool(project(scripts)).session(log)
    outcome = run(
        session.run_script_assertion("scripts:roles.check-total", {"output": "$3500"}, {})
    )
    assert (outcome.passed, outcome.reason, outcome.score) == (True, "total found", 1.0)
    sim = run(
        session.simulate(
            "scripts:roles.next-input",
            HELLO,
            {"turn_number": 4},
            session_id=None,
            case_id="c",
            turn=4,
        )
    )
    assert (sim.input, sim.goal_achieved, sim.reasoning) == ("PO-4", False, "asked for PO")
    assert [record.role for record in log] == ["simulator"]
    cases = run(session.generate("scripts:roles.cases", {"topic": "travel"}))
    assert cases == [{"id": "S1", "input": "travel"}]
