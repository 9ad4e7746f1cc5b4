"""The agents of one project: clients by name, and the role calls the engine makes.

`AgentPool` builds one client per agenttest.yaml entry on first use, with the client
its protocol registered (agents/interface.py, agents/protocols/). `RoleSession` binds it
to a list where every call's record (latency, attempts, tokens) is kept, and is what
assertions see as their `roles`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from agenttest_worker.agents.config import ProjectConfig
from agenttest_worker.agents.interface import (
    AgentClient,
    AgentError,
    AgentReply,
    AgentRequest,
    get_protocol,
    history_source,
)
from agenttest_worker.agents.options import Options
from agenttest_worker.agents.refs import Ref, RefKind, parse_ref
from agenttest_worker.agents.reply_cache import (
    CacheEntry,
    CachePolicy,
    Hit,
    Leased,
    ReplyCacheStore,
    cacheable,
    cached_reply,
    claim,
    reply_document,
    request_key,
)
from agenttest_worker.agents.roles import (
    ReplyParseError,
    SimulatorTurn,
    Verdict,
    bounded,
    generator_request,
    judge_prompt,
    last_response_of,
    parse_failure,
    read_generator_reply,
    read_simulator_reply,
    read_validator_reply,
    simulator_request,
    validator_request,
)
from agenttest_worker.agents.script_loader import ScriptError, call_script, load_script
from agenttest_worker.errors import redact
from agenttest_worker.observe import tracing
from agenttest_worker.results import AgentCallRecord, AssertionOutcome

log = logging.getLogger(__name__)


class AgentPool:
    """`replies`: where replies are cached (None: nowhere), used as `policy` says."""

    def __init__(
        self,
        config: ProjectConfig,
        replies: ReplyCacheStore | None = None,
        policy: CachePolicy | None = None,
    ) -> None:
        self.config = config
        self.replies = replies
        self.policy = policy or CachePolicy()
        self._clients: dict[str, AgentClient] = {}

    def client(self, name: str) -> AgentClient:
        ident = name.split(":", 1)[1] if name.startswith("agents:") else name
        client = self._clients.get(ident)
        if client is None:
            try:
                cfg = self.config.agent(ident)
                make = get_protocol(cfg.protocol).client
            except LookupError as exc:
                raise AgentError("config", str(exc)) from None
            client = make(ident, cfg, self.config)
            self._clients[ident] = client
        return client

    def session(self, log: list[AgentCallRecord]) -> RoleSession:
        return RoleSession(self, log)


class RoleSession:
    """Role calls for one turn (or one judgement), recording every call in `log`."""

    def __init__(self, pool: AgentPool, log: list[AgentCallRecord]) -> None:
        self.pool = pool
        self.log = log

    async def call(
        self,
        agent: str,
        request: AgentRequest,
        readable: Callable[[str | None], object] | None = None,
    ) -> AgentReply:
        """`agent`'s reply to `request`, from the reply cache when it is cached there.
        `readable`: the role's reader of the reply's content; a reply it refuses (raises
        ReplyParseError) is not stored, so that a junk reply is never served again."""
        key = self._cache_key(agent, request)
        if key is None:
            return await self._call_agent(agent, request)
        ident = agent.removeprefix("agents:")
        replies = self.pool.replies
        assert replies is not None  # a key is made only with a cache
        # --cache-refresh calls without looking, and stores what it got.
        claimed = (
            None
            if self.pool.policy.mode == "refresh"
            else await claim(replies, key, ident, request.role)
        )
        if isinstance(claimed, Hit):
            reply = cached_reply(claimed.reply, request.role, ident)
            assert reply.call is not None
            self.log.append(reply.call)
            return reply
        try:
            reply = await self._call_agent(agent, request)
        except BaseException:
            if isinstance(claimed, Leased):
                # Those waiting for this reply call for themselves now.
                await asyncio.to_thread(replies.release, key)
            raise
        if (reply.call is None or reply.call.error is None) and _reads(readable, reply):
            entry = CacheEntry(key, ident, request.role, reply_document(reply))
            await asyncio.to_thread(replies.fill, entry)
        elif isinstance(claimed, Leased):
            # Not kept (an error, or a reply the role cannot read): those waiting for it
            # call for themselves now, not once the lease has run out.
            await asyncio.to_thread(replies.release, key)
        return reply

    def _cache_key(self, agent: str, request: AgentRequest) -> str | None:
        """The request's cache key, or None when this call is not cached."""
        if self.pool.replies is None:
            return None
        client = self.pool.client(agent)
        # The entry by the name the call uses: a registered client need not keep one.
        entry = self.pool.config.agents.get(agent.removeprefix("agents:"))
        if entry is None or history_source(client) is not None:
            # A history-based agent's turn is read from its chat history afterwards.
            return None
        if not cacheable(entry, request, self.pool.policy):
            return None
        return request_key(entry, request)

    async def _call_agent(self, agent: str, request: AgentRequest) -> AgentReply:
        with tracing.call_span(self._call_target(agent, request), request.messages) as span:
            try:
                reply = await self._complete(agent, request)
            except AgentError as exc:
                span.failed(exc.message, exc.call)
                raise
            span.finish(reply.content, reply.finish_reason, reply.call)
            return reply

    def _call_target(self, agent: str, request: AgentRequest) -> tracing.CallTarget:
        ident = agent.removeprefix("agents:")
        entry = self.pool.config.agents.get(ident)
        protocol, model = (entry.protocol, entry.model) if entry is not None else ("", None)
        return tracing.CallTarget(request.role, ident, protocol, model)

    async def _complete(self, agent: str, request: AgentRequest) -> AgentReply:
        try:
            reply = await self.pool.client(agent).complete(request)
        except AgentError as exc:
            if exc.call is not None:
                exc.call.error = exc.call.error or exc.message
                exc.call.reply = exc.call.reply or exc.raw
                self.log.append(exc.call)
            raise
        except TimeoutError:
            raise  # the turn's or the case's time limit: the engine says which
        except Exception as exc:
            # Anything else a client raises (a library refusing the request before it
            # is sent, a bug) fails this call with its reason, like an agent error:
            # the turn records it and the conversation goes on or ends, instead of the
            # step failing and its conversation waiting for the stall sweep.
            reason = redact(f"{type(exc).__name__}: {exc}")
            log.warning("calling agent %s raised %s", agent, reason)
            raise AgentError("unexpected", f"calling {agent} failed: {reason}") from exc
        if reply.call is not None:
            self.log.append(reply.call)
        return reply

    # -- simulator -----------------------------------------------------------------

    async def simulate(
        self,
        use: str,
        history: list[dict[str, Any]],
        metadata: dict[str, Any],
        *,
        session_id: str | None,
        case_id: str,
        turn: int,
        params: dict[str, Any] | None = None,
        repetition: int | None = None,
    ) -> SimulatorTurn:
        """The simulator's next user input; AgentError when it fails or replies junk.

        `metadata` carries test_mode "simulator", persona, goal, turn_number, turn_count,
        max_turns, last_response (the engine sets them; test_mode, turn_number,
        turn_count and last_response are filled in when missing).
        """
        ref = _ref(use, "agents", allow_params=False)
        defaults = {
            "test_mode": "simulator",
            "turn_number": turn,
            "turn_count": turn,
            "last_response": last_response_of(history),
        }
        metadata = {**{k: v for k, v in defaults.items() if k not in metadata}, **metadata}
        if ref.kind == "scripts":
            started = time.monotonic()
            try:
                fn = load_script(self.pool.config.scripts_path, ref.id, "simulator")
                result = await call_script(fn, history, dict(metadata))
            except ScriptError as exc:
                raise AgentError("script", str(exc)) from exc
            except Exception as exc:
                raise AgentError(
                    "script", f"script {ref.id} raised {type(exc).__name__}: {exc}"
                ) from exc
            finally:
                self.log.append(
                    AgentCallRecord(
                        role="simulator",
                        agent=str(ref),
                        latency_ms=int((time.monotonic() - started) * 1000),
                    )
                )
            content = result if isinstance(result, str) else _json_text(result)
            try:
                return read_simulator_reply(content)
            except ReplyParseError as exc:
                raise parse_failure("simulator", str(ref), exc, self.log[-1]) from exc
        entry = self.pool.config.agents.get(ref.id)
        # (An unknown agent fails in the call, with the message every role gets.)
        mode = entry.messages if entry is not None else "transcript"
        request = simulator_request(history, metadata, session_id, case_id, turn, mode)
        request.params = params or {}
        request.repetition = repetition
        reply = await self.call(ref.id, request, read_simulator_reply)
        try:
            return read_simulator_reply(reply.content)
        except ReplyParseError as exc:
            raise parse_failure("simulator", ref.id, exc, reply.call) from exc

    # -- validator (RoleCaller) ----------------------------------------------------------

    async def judge(
        self,
        use: str | None,
        messages: list[dict[str, Any]],
        metadata: dict[str, Any],
        options: Options | None,
    ) -> AssertionOutcome:
        """One judge (None: `defaults.judge`) asked once."""
        agent = self._judge_agent(use, options.connector if options else None)
        if isinstance(agent, AssertionOutcome):
            return agent
        return await self._ask_judge(agent, messages, metadata, options)

    async def judge_panel(
        self,
        use: str | Sequence[str] | None,
        votes: int | None,
        messages: list[dict[str, Any]],
        metadata: dict[str, Any],
        options: Options | None,
    ) -> list[tuple[str, AssertionOutcome]]:
        """Every judge of `use` (one, a panel, or None: `defaults.judge`) asked `votes`
        times (None: `defaults.judge_votes`), all at once: each ask's (judge, outcome),
        judge by judge. Each ask is a call of its own, logged, rate limited and counted
        against budgets like any other; a failed one is an outcome with `error`. The
        assertion's `options` name a `connector` and add `params` to the judge's."""
        count = votes if votes is not None else self.pool.config.defaults.judge_votes
        judges = [use] if use is None or isinstance(use, str) else list(use)
        asks: list[tuple[str, str | AssertionOutcome]] = []
        for judge in judges:
            agent = self._judge_agent(judge, options.connector if options else None)
            label = f"agents:{agent}" if isinstance(agent, str) else judge or "(no judge)"
            asks.extend((label, agent) for _ in range(count))

        async def ask(agent: str | AssertionOutcome) -> AssertionOutcome:
            if isinstance(agent, AssertionOutcome):
                return agent  # not callable (no judge configured, a malformed name)
            return await self._ask_judge(agent, messages, metadata, options)

        outcomes = await asyncio.gather(*(ask(agent) for _, agent in asks))
        return [(label, outcome) for (label, _), outcome in zip(asks, outcomes, strict=True)]

    def _judge_agent(self, use: str | None, connector: str | None) -> str | AssertionOutcome:
        """The registry entry a judge's call goes to, or the failed outcome saying why none."""
        agent = use or self.pool.config.defaults.judge
        if agent is None:
            return AssertionOutcome(
                False, "no judge: set defaults.judge in agenttest.yaml", error="no judge configured"
            )
        try:
            name = parse_ref(agent, default_kind="agents").id
        except ValueError as exc:
            return AssertionOutcome(False, f"judge: {exc}", error=str(exc))
        if connector and connector in self.pool.config.agents:
            return connector
        return name

    async def _ask_judge(
        self,
        name: str,
        messages: list[dict[str, Any]],
        metadata: dict[str, Any],
        options: Options | None,
    ) -> AssertionOutcome:
        whole = len([m for m in messages if m.get("role") in ("user", "assistant")]) > 2
        request = validator_request(messages, {"test_mode": "validator", **metadata}, whole)
        request.params = dict(options.params) if options else {}
        try:
            reply = await self.call(name, request, read_validator_reply)
        except AgentError as exc:
            return AssertionOutcome(False, f"judge {name} failed: {exc.message}", error=exc.message)
        # What it was sent and what it said, kept with the verdict for the reader.
        prompt, said = judge_prompt(request.messages), bounded(reply.content)
        try:
            verdict: Verdict = read_validator_reply(reply.content)
        except ReplyParseError as exc:
            failure = parse_failure("judge", name, exc, reply.call)
            return AssertionOutcome(
                False,
                failure.message,
                error=failure.message,
                judge_prompt=prompt,
                judge_reply=said,
            )
        return AssertionOutcome(
            passed=verdict.passed,
            reason=verdict.reason or ("passed" if verdict.passed else "failed"),
            score=verdict.score,
            suggestions=verdict.suggestions,
            plan=verdict.plan,
            thinking=verdict.thinking,
            judge_prompt=prompt,
            judge_reply=said,
        )

    async def run_script_assertion(
        self, use: str, response: dict[str, Any], metadata: dict[str, Any]
    ) -> AssertionOutcome:
        try:
            ref = parse_ref(use, default_kind="scripts")
            fn = load_script(self.pool.config.scripts_path, ref.id, "assertion")
        except (ScriptError, ValueError) as exc:
            return AssertionOutcome(False, str(exc), error=str(exc))
        try:
            result = await call_script(fn, response, dict(metadata))
        except Exception as exc:
            message = f"script {ref.id} raised {type(exc).__name__}: {exc}"
            return AssertionOutcome(False, message, error=message)
        return _script_outcome(ref.id, result)

    # -- generator -------------------------------------------------------------------

    async def generate(self, use: str, metadata: dict[str, Any]) -> list[Any]:
        """Raw generated cases from a generator agent or script (validated by the caller)."""
        ref = _ref(use, None, allow_params=True)
        if ref.kind == "scripts":
            try:
                fn = load_script(self.pool.config.scripts_path, ref.id, "generator")
                result = await call_script(fn, dict(metadata))
            except ScriptError as exc:
                raise AgentError("script", str(exc)) from exc
            except Exception as exc:
                raise AgentError(
                    "script", f"generator script {ref.id} raised {type(exc).__name__}: {exc}"
                ) from exc
            if isinstance(result, dict) and isinstance(result.get("cases"), list):
                return list(result["cases"])
            if isinstance(result, list):
                return result
            raise AgentError(
                "script",
                f"generator script {ref.id} returned {type(result).__name__}, "
                'expected a list of cases or {"cases": [...]}',
            )
        request = generator_request({"test_mode": "generator", **metadata})
        reply = await self.call(ref.id, request, read_generator_reply)
        try:
            return read_generator_reply(reply.content)
        except ReplyParseError as exc:
            raise parse_failure("generator", ref.id, exc, reply.call) from exc


def _ref(use: str, default_kind: RefKind | None, *, allow_params: bool) -> Ref:
    """A role's reference; a malformed one (a path, `..`) is a config error, not a crash."""
    try:
        return parse_ref(use, default_kind=default_kind, allow_params=allow_params)
    except ValueError as exc:
        raise AgentError("config", str(exc)) from None


def _reads(readable: Callable[[str | None], object] | None, reply: AgentReply) -> bool:
    if readable is None:
        return True
    try:
        readable(reply.content)
    except ReplyParseError:
        return False
    return True


def _json_text(value: Any) -> str:
    return json.dumps(value, default=str)


def _script_outcome(script: str, result: Any) -> AssertionOutcome:
    if isinstance(result, bool):
        return AssertionOutcome(result, f"script {script} returned {str(result).lower()}")
    if isinstance(result, dict) and isinstance(result.get("passed", result.get("pass")), bool):
        passed = bool(result.get("passed", result.get("pass")))
        reason = result.get("reason") or f"script {script} returned passed={str(passed).lower()}"
        score = result.get("score")
        return AssertionOutcome(
            passed,
            str(reason),
            score=float(score)
            if isinstance(score, int | float) and not isinstance(score, bool)
            else None,
        )
    message = f'script {script} returned {result!r:.80}; expected a bool or {{"passed": bool}}'
    return AssertionOutcome(False, message, error=message)
