"""A scripted agent served over real HTTP with the OpenAI Chat Completions protocol.

Tests tell it what to answer, model by model, and read back every request it got:

    with ScriptedAgent() as agent:
        agent.script("target", ["Hello!", say("Which amount?", awaiting_input=True)])
        agent.script("judge", lambda body: say('{"passed": true, "reason": "ok"}'))
        ... point an `openai` registry entry at agent.base_url with model "target" ...
        agent.requests("target")   # every request body, in order

A script is either a list of replies, used in order (a request past the end gets an
HTTP 500 saying the script ran out), or a function of the request body. A reply is a
`Reply` (content, tool calls, the extra fields `awaiting_input`, `input_hint`, `state`,
any other top-level fields, an HTTP status and error, a delay, a raw body) or a plain
string (content). The server runs on 127.0.0.1, port 0, on a thread with its own event
loop, so the test's own `asyncio.run` loop is free to act as the client.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from agenttest_worker.agents.config import ProjectConfig
from agenttest_worker.agents.http.exchange import close_session
from agenttest_worker.agents.pool import AgentPool
from agenttest_worker.cases.case_model import Case
from agenttest_worker.demo.threaded import ServedOnThread, ThreadedServer
from agenttest_worker.engine import (
    ConversationState,
    RunOptions,
    case_result,
    give_human_input,
    run_turn,
    start_conversation,
)
from agenttest_worker.results import CaseResult

Body = dict[str, Any]
Rule = Sequence["Reply | str"] | Callable[[Body], "Reply | str"]


@dataclass
class Reply:
    """One answer of the scripted agent.

    `tool_calls` items are {"name", "args"} (and optionally "id"); they are sent in
    the Chat Completions shape with `arguments` as a JSON string and ids `call_<n>`
    unless given. `awaiting_input`, `input_hint` and `state` are sent as top-level
    fields next to `choices` when set; `extra` adds any other top-level fields.
    A `status` other than 200 sends {"error": {"message": error}} with that status.
    `raw` replaces the whole body (a str is sent as text/plain). `hold` keeps the
    answer back until the test sets it (after `delay`), so a test can look at a run
    while a call is certainly still in flight.
    """

    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    awaiting_input: bool | None = None
    input_hint: str | None = None
    state: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None
    status: int = 200
    error: str = "scripted failure"
    delay: float = 0.0
    hold: threading.Event | None = None
    raw: Any = None
    headers: dict[str, str] = field(default_factory=dict)


def say(content: str | None, **fields: Any) -> Reply:
    """A text reply, with any other Reply field (awaiting_input=True, state={...})."""
    return Reply(content=content, **fields)


def call(name: str, args: dict[str, Any] | None = None, **fields: Any) -> Reply:
    """A reply that only calls one tool (content null, finish_reason tool_calls)."""
    return Reply(tool_calls=[{"name": name, "args": args or {}}], **fields)


def fail(status: int, message: str = "scripted failure", **fields: Any) -> Reply:
    return Reply(status=status, error=message, **fields)


def judge_verdict(passed: bool, reason: str = "", **more: Any) -> Reply:
    """What a validator agent answers: {passed, score, reason, suggestions} as JSON text."""
    verdict = {"passed": passed, "score": 1.0 if passed else 0.0, "reason": reason, **more}
    return say(json.dumps(verdict))


def simulator_turn(text: str, goal_achieved: bool = False, reasoning: str = "") -> Reply:
    """What a simulator agent answers: {input, goal_achieved, reasoning} as JSON text."""
    return say(json.dumps({"input": text, "goal_achieved": goal_achieved, "reasoning": reasoning}))


def message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def last_user_text(body: Body) -> str:
    """The text of the request's last user message ("" when there is none)."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            return message_text(message)
    return ""


def by_last_user(answers: dict[str, Reply | str], default: Reply | str = "OK.") -> Rule:
    """A rule answering by the last user message: the first key it contains wins."""

    def rule(body: Body) -> Reply | str:
        text = last_user_text(body)
        for key, answer in answers.items():
            if key in text:
                return answer
        return default

    return rule


def _completion(model: str, reply: Reply, index: int) -> Body:
    message: Body = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": tc.get("id", f"call_{index}_{n}"),
                "type": "function",
                "function": {"name": tc["name"], "arguments": json.dumps(tc.get("args", {}))},
            }
            for n, tc in enumerate(reply.tool_calls)
        ]
    finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
    body: Body = {
        "id": f"chatcmpl-scripted-{index}",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }
    for key in ("awaiting_input", "input_hint", "state"):
        if getattr(reply, key) is not None:
            body[key] = getattr(reply, key)
    body.update(reply.extra)
    return body


class ScriptedAgent(ServedOnThread):
    """Scripted Chat Completions models on one HTTP server (see the module docstring)."""

    path = "/v1"

    def __init__(self) -> None:
        self._rules: dict[str, Rule] = {}
        self._used: dict[str, int] = {}
        self._requests: dict[str, list[Body]] = {}
        self._headers: dict[str, list[dict[str, str]]] = {}
        self._lock = threading.Lock()
        # A handler whose client gave up (a timed-out call) is cancelled, so that a long
        # `delay` does not hold up `stop()`.
        self._server = ThreadedServer(
            self._app, name="scripted-agent", shutdown_timeout=0.2, handler_cancellation=True
        )

    # -- what the tests use ------------------------------------------------------------

    def script(self, model: str, rule: Rule) -> ScriptedAgent:
        """Answer requests for `model` by `rule` (replaces an earlier rule, resets its count)."""
        with self._lock:
            self._rules[model] = rule
            self._used[model] = 0
        return self

    def requests(self, model: str) -> list[Body]:
        """Every request body received for `model`, in order."""
        with self._lock:
            return list(self._requests.get(model, []))

    def request_headers(self, model: str) -> list[dict[str, str]]:
        """The headers of every request received for `model` (names in lower case)."""
        with self._lock:
            return list(self._headers.get(model, []))

    def entry(self, model: str, **settings: Any) -> Body:
        """An agenttest.yaml agent entry for `model` (timeout 2s, one retry unless given)."""
        return {
            "protocol": "openai",
            "base_url": self.base_url,
            "model": model,
            "timeout": 2,
            "max_retries": 1,
            **settings,
        }

    # -- serving ---------------------------------------------------------------------

    def _next_reply(self, model: str, body: Body) -> tuple[Reply, int]:
        with self._lock:
            self._requests.setdefault(model, []).append(body)
            rule = self._rules.get(model)
            index = self._used.get(model, 0)
            self._used[model] = index + 1
        if rule is None:
            return fail(404, f"The model '{model}' is not scripted"), index
        if callable(rule):
            answer = rule(body)
        elif index < len(rule):
            answer = rule[index]
        else:
            answer = fail(500, f"scripted model {model!r} has no reply left (got {index + 1})")
        return (say(answer) if isinstance(answer, str) else answer), index

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
        model = str(body.get("model"))
        with self._lock:
            headers = {name.lower(): value for name, value in request.headers.items()}
            self._headers.setdefault(model, []).append(headers)
        try:
            reply, index = self._next_reply(model, body)
        except Exception as exc:  # a broken rule in a test: answer, and say what broke
            return web.json_response(
                {"error": {"message": f"rule raised {exc!r}", "type": "server_error"}},
                status=500,
            )
        if reply.delay:
            await asyncio.sleep(reply.delay)
        while reply.hold is not None and not reply.hold.is_set():
            await asyncio.sleep(0.02)
        if reply.raw is not None:
            if isinstance(reply.raw, str):
                return web.Response(text=reply.raw, status=reply.status, headers=reply.headers)
            return web.json_response(reply.raw, status=reply.status, headers=reply.headers)
        if reply.status != 200:
            return web.json_response(
                {"error": {"message": reply.error, "type": "scripted_error"}},
                status=reply.status,
                headers=reply.headers,
            )
        return web.json_response(_completion(model, reply, index), headers=reply.headers)

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=32 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        return app


# -- driving the engine ----------------------------------------------------------------


def project(agents: dict[str, Body], **settings: Any) -> ProjectConfig:
    """A ProjectConfig with these agent entries (and defaults, scripts_dir, ...)."""
    return ProjectConfig.model_validate({"agents": agents, **settings})


def run_case(
    case: Case | Body,
    config: ProjectConfig,
    options: RunOptions | None = None,
    *,
    human: Callable[[ConversationState], str | None] | None = None,
) -> tuple[CaseResult, ConversationState]:
    """Play one conversation with the engine (no Celery, no store) on a fresh event loop.

    `human` answers when the conversation parks for a person (None: nobody answered).
    The target is "target" unless the case or the options say otherwise.
    """
    model = case if isinstance(case, Case) else Case.model_validate(case)
    run = options or RunOptions(target="target")

    async def play() -> tuple[CaseResult, ConversationState]:
        pool = AgentPool(config)
        try:
            state = start_conversation(model, f"session-{model.id}")
            while state.phase != "done":
                while state.phase == "ready":
                    state = await run_turn(model, state, pool, run)
                if state.phase == "awaiting_human":
                    answer = human(state) if human is not None else None
                    state = await give_human_input(model, state, answer, pool, run)
            return case_result(model, state, model.agent or run.target), state
        finally:
            await close_session()

    return asyncio.run(play())


def demo_entry(demo_url: str, model: str, **settings: Any) -> Body:
    """An agenttest.yaml entry for one of the bundled demo agents (see agenttest_worker/demo)."""
    return {
        "protocol": "openai",
        "base_url": demo_url,
        "model": model,
        "timeout": 5,
        "max_retries": 0,
        **settings,
    }
