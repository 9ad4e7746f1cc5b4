"""Assertion types and agent protocols register where they are defined, and nothing else
changes to add one: a type registered here is read from a case file and evaluated by the
engine, a protocol registered here is accepted by agenttest.yaml and called by the pool,
and the messages for unknown names list what is registered."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from agent_servers import run
from scripted_agent import ScriptedAgent, project, run_case

from agenttest_worker.agents.config import AgentConfig, ProjectConfig
from agenttest_worker.agents.config_loading import load_config
from agenttest_worker.agents.interface import (
    AgentReply,
    AgentRequest,
    protocol,
    protocol_names,
    unregister_protocol,
)
from agenttest_worker.agents.pool import AgentPool
from agenttest_worker.assertions import (
    ASSERTION_TYPES,
    AssertionContext,
    AssertionOutcome,
    AssertionSpec,
    assertion_types,
    register,
)
from agenttest_worker.assertions.checking import unregister
from agenttest_worker.cases.files import iter_cases, load_cases
from agenttest_worker.errors import ConfigError, InputProblem

BUILT_IN_TYPES = (
    "contains, equals, regex, not_contains, not_regex, json_path, type, tool_called, "
    "tool_not_called, agent, script, latency, tool_sequence, tool_count, turn_count, "
    "trace_tool_called, trace_span_count, trace_error_spans, trace_duration, not, any, all, golden"
)


# -- a new assertion type ------------------------------------------------------------------


class WordCountAssertion(AssertionSpec):
    """The reply has at most `at_most` words."""

    type: Literal["word_count"]
    at_most: int


def check_word_count(spec: WordCountAssertion, ctx: AssertionContext) -> AssertionOutcome:
    words = len((ctx.output or "").split())
    return AssertionOutcome(words <= spec.at_most, f"{words} words (at most {spec.at_most})")


@pytest.fixture
def word_count() -> Iterator[None]:
    # Registered for this test only: the case models are rebuilt with it, then without.
    register(WordCountAssertion)(check_word_count)
    try:
        yield
    finally:
        unregister("word_count")


def write_cases(path: Path, *cases: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(case) + "\n" for case in cases), encoding="utf-8")
    return path


def test_a_registered_assertion_type_is_read_from_a_case_file_and_evaluated(
    tmp_path: Path, word_count: None
) -> None:
    assert assertion_types() == (*ASSERTION_TYPES, "word_count")
    cases = load_cases(
        write_cases(
            tmp_path / "cases.jsonl",
            {"id": "short", "input": "go", "assertions": [{"type": "word_count", "at_most": 3}]},
            {"id": "long", "input": "go", "assertions": [{"type": "word_count", "at_most": 3}]},
        )
    )
    assert [type(c.turns[0].assertions[0]) for c in cases] == [WordCountAssertion] * 2

    with ScriptedAgent() as agent:
        agent.script("target", ["Submitted, thank you.", "Your expense was submitted, thanks."])
        config = project({"target": agent.entry("target")})
        results = [run_case(case, config)[0] for case in cases]
    verdicts = [(a.type, a.passed, a.reason) for r in results for a in r.turns[0].assertions]
    assert verdicts == [
        ("word_count", True, "3 words (at most 3)"),
        ("word_count", False, "5 words (at most 3)"),
    ]
    # As the case file wrote it, in the stored record too.
    assert cases[0].to_record()["turns"][0]["assertions"] == [{"type": "word_count", "at_most": 3}]


def test_a_registered_type_is_checked_and_listed_like_the_built_in_ones(
    tmp_path: Path, word_count: None
) -> None:
    path = write_cases(
        tmp_path / "cases.jsonl",
        {"id": "T1", "input": "go", "assertions": [{"type": "word_count", "atmost": 3}]},
        {"id": "T2", "input": "go", "assertions": [{"type": "word_counts", "at_most": 3}]},
    )
    problems = [str(p) for p in iter_cases(path) if isinstance(p, InputProblem)]
    assert problems == [
        f"{path}:1 (test 'T1'): assertions[0].at_most: required field is missing",
        f"{path}:1 (test 'T1'): assertions[0].atmost: unknown field (a typo?)",
        f"{path}:2 (test 'T2'): assertions[0]: unknown assertion type 'word_counts' "
        f"(known: {BUILT_IN_TYPES}, word_count)",
    ]


def test_a_withdrawn_type_is_unknown_again(tmp_path: Path) -> None:
    register(WordCountAssertion)(check_word_count)
    unregister("word_count")
    path = write_cases(
        tmp_path / "cases.jsonl",
        {"id": "T", "input": "go", "assertions": [{"type": "word_count", "at_most": 3}]},
    )
    [problem] = list(iter_cases(path))
    assert isinstance(problem, InputProblem)
    assert problem.message == f"unknown assertion type 'word_count' (known: {BUILT_IN_TYPES})"


def test_a_spec_without_one_type_literal_is_refused_when_registered() -> None:
    def never(spec: AssertionSpec, ctx: AssertionContext) -> AssertionOutcome:
        raise AssertionError("not called")

    class Untyped(AssertionSpec):
        pass

    class Again(AssertionSpec):
        type: Literal["contains"]

    with pytest.raises(TypeError, match=r'`type` is Literal\["name"\]'):
        register(Untyped)(never)
    with pytest.raises(ValueError, match="'contains' registered twice"):
        register(Again)(never)
    assert assertion_types() == ASSERTION_TYPES


# -- a new agent protocol ------------------------------------------------------------------


class EchoClient:
    """Replies with the last user message, prefixed by the agent's `model`."""

    def __init__(self, name: str, config: AgentConfig, project: ProjectConfig) -> None:
        self.name = name
        self.prefix = config.model

    async def complete(self, request: AgentRequest) -> AgentReply:
        return AgentReply(content=f"{self.prefix}: {request.messages[-1]['content']}")


def needs_model(config: AgentConfig) -> str | None:
    return None if config.model else "an echo agent needs model"


@pytest.fixture
def echo() -> Iterator[None]:
    protocol("echo", check=needs_model)(EchoClient)
    try:
        yield
    finally:
        unregister_protocol("echo")


def config_problems(path: Path) -> list[tuple[int | None, str | None, str]]:
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    return [(p.line, p.field, p.message) for p in caught.value.problems]


def test_an_unknown_protocol_lists_the_registered_ones(tmp_path: Path) -> None:
    path = tmp_path / "agenttest.yaml"
    path.write_text("agents:\n  b:\n    protocol: grpc\n", encoding="utf-8")
    assert protocol_names() == (
        "openai",
        "azure",
        "openai-responses",
        "anthropic",
        "http",
        "script",
    )
    assert config_problems(path) == [
        (
            3,
            "agents.b.protocol",
            "Input should be 'openai', 'azure', 'openai-responses', 'anthropic', 'http' or "
            "'script'",
        )
    ]
    protocol("echo", check=needs_model)(EchoClient)
    try:
        assert config_problems(path) == [
            (
                3,
                "agents.b.protocol",
                "Input should be 'openai', 'azure', 'openai-responses', 'anthropic', 'http', "
                "'script' or 'echo'",
            )
        ]
    finally:
        unregister_protocol("echo")


def test_a_registered_protocol_is_configured_and_called(tmp_path: Path, echo: None) -> None:
    path = tmp_path / "agenttest.yaml"
    path.write_text("agents:\n  e:\n    protocol: echo\n", encoding="utf-8")
    assert config_problems(path) == [(2, "agents.e", "an echo agent needs model")]

    path.write_text("agents:\n  e:\n    protocol: echo\n    model: parrot\n", encoding="utf-8")
    pool = AgentPool(load_config(path, env={}))
    client = pool.client("agents:e")
    assert isinstance(client, EchoClient)
    reply = run(client.complete(AgentRequest("target", [{"role": "user", "content": "hi"}])))
    assert reply.content == "parrot: hi"


# -- how a turn's assertions run ---------------------------------------------------------------


class SlowAssertion(AssertionSpec):
    """Waits `seconds`, then passes unless `broken` (it raises)."""

    type: Literal["slow_check"]
    seconds: float
    broken: bool = False


async def check_slow(spec: SlowAssertion, ctx: AssertionContext) -> AssertionOutcome:
    started.append(spec.seconds)
    await asyncio.sleep(spec.seconds)
    if spec.broken:
        raise RuntimeError("the judge fell over")
    return AssertionOutcome(True, f"waited {spec.seconds}")


started: list[float] = []


@pytest.fixture
def slow_check() -> Iterator[None]:
    register(SlowAssertion)(check_slow)
    register(WordCountAssertion)(check_word_count)
    try:
        yield
    finally:
        unregister("slow_check")
        unregister("word_count")


def test_a_turns_async_assertions_run_together_and_fail_alone(slow_check: None) -> None:
    """Plain checkers are done at once, async ones concurrently (two 0.3 s judges take
    0.3 s, not 0.6), one that raises fails only itself, and the results keep the order
    the assertions were written in."""
    from agenttest_worker.engine.assess import run_assertions

    specs: list[Any] = [
        SlowAssertion(type="slow_check", seconds=0.3),
        WordCountAssertion(type="word_count", at_most=1),
        SlowAssertion(type="slow_check", seconds=0.31, broken=True),
        WordCountAssertion(type="word_count", at_most=5),
    ]
    ctx = AssertionContext(
        output="three short words", document={}, tool_calls=[], input="hi", messages=[],
        final=False, case_id="c1",
    )  # fmt: skip
    started.clear()
    began = time.monotonic()
    results = asyncio.run(run_assertions(specs, ctx))
    assert time.monotonic() - began < 0.55
    assert started == [0.3, 0.31]
    assert [(r.type, r.passed) for r in results] == [
        ("slow_check", True),
        ("word_count", False),
        ("slow_check", False),
        ("word_count", True),
    ]
    assert results[2].error == "RuntimeError: the judge fell over"
    assert results[1].reason == "3 words (at most 1)"

    one = asyncio.run(run_assertions([specs[0]], ctx))  # a lone async one: awaited as it is
    assert [r.passed for r in one] == [True]


def test_a_type_registered_later_is_accepted_inside_groups(tmp_path: Path) -> None:
    # The group models are built (a dump needs their serializer) before the type exists.
    from agenttest_worker.assertions import NotAssertion

    built = NotAssertion.model_validate(
        {"type": "not", "assertion": {"type": "contains", "value": "x"}}
    )
    assert built.model_dump()["assertion"]["value"] == "x"
    words = {"type": "word_count", "at_most": 3}
    nested = {
        "type": "not",
        "assertion": {"type": "any", "assertions": [{"type": "all", "assertions": [words]}]},
    }
    path = tmp_path / "cases.jsonl"
    register(WordCountAssertion)(check_word_count)
    try:
        [case] = load_cases(write_cases(path, {"id": "G", "input": "go", "assertions": [nested]}))
        group = case.turns[0].assertions[0]
        assert isinstance(group, NotAssertion)
        assert group.model_dump(exclude_unset=True) == nested
    finally:
        unregister("word_count")
    problems = [str(p) for p in iter_cases(path) if isinstance(p, InputProblem)]
    assert len(problems) == 1
    assert "unknown assertion type 'word_count'" in problems[0]
