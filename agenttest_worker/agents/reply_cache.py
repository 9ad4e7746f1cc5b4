"""Agent replies kept and served again: the key of a request, which calls are cached,
and the store interface the run's store implements (store/sql/cached_replies.py).

A reply is keyed by what determines it: the agent entry's identity (protocol, URL,
model, params, tools, request template; never headers or keys) and the exact request
(messages, metadata, options, params, the role's fields), hashed with sha256. The
conversation's `session_id` is left out: it is new on every run, so a key holding it
would never be found again. A target's or simulator's reply is also keyed by its
repetition (`--repeat`), so that repetitions stay independent samples.

Concurrent identical requests call the agent once: the first to `claim` a key holds a
lease on it; the others wait for its reply until the lease runs out, then call the
agent themselves.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from agenttest_worker.agents.config import AgentConfig
from agenttest_worker.agents.interface import AgentReply, AgentRequest
from agenttest_worker.results import AgentCallRecord, AgentRole, ToolCall, Usage

KEY_VERSION = 1
CacheMode = Literal["on", "off", "refresh"]

# What of an agent entry decides its replies. Headers, key variables, timeouts,
# retries, rate limits, pricing and network settings do not, and are left out.
_IDENTITY_FIELDS = (
    "protocol",
    "base_url",
    "url",
    "model",
    "params",
    "tools",
    "method",
    "request",
    "response",
    "history",
    "use",
    "stream",
    "anthropic_version",
    "max_tokens",
    "previous_response_id",
    "deployment",
    "api_version",
    "messages",
    "metadata",
)
# Roles whose repetitions must not share a reply (repeats sample them again).
_PER_REPETITION: frozenset[AgentRole] = frozenset({"target", "simulator"})
# Roles cached by default when their replies are meant to be stable.
_STABLE_ROLES: frozenset[AgentRole] = frozenset({"validator", "simulator", "generator"})


@dataclass(frozen=True)
class CachePolicy:
    """The run's choices: `mode` (--no-cache: off, --cache-refresh: refresh) and whether
    targets are cached (--cache target)."""

    mode: CacheMode = "on"
    target: bool = False


@dataclass(frozen=True)
class Hit:
    reply: dict[str, Any]


@dataclass(frozen=True)
class Leased:
    """This caller holds the key's lease: it calls the agent and fills or releases it."""


@dataclass(frozen=True)
class Busy:
    """Another caller holds the key's lease."""


Claim = Hit | Leased | Busy


@dataclass(frozen=True)
class CacheEntry:
    key: str
    agent: str
    role: AgentRole
    reply: dict[str, Any]


class ReplyCacheStore(Protocol):
    """Where replies are kept: the run's store (blocking calls, run on a thread)."""

    def claim(self, key: str, agent: str, role: AgentRole) -> Claim: ...

    def fill(self, entry: CacheEntry) -> None: ...

    def release(self, key: str) -> None: ...

    def lease_seconds(self) -> float: ...


def cacheable(entry: AgentConfig, request: AgentRequest, policy: CachePolicy) -> bool:
    """Whether a call of `entry` for `request` goes through the cache."""
    if policy.mode == "off" or entry.cache is False:
        return False
    if entry.cache is True:
        return True
    if request.role == "target":
        return policy.target
    if request.role in _STABLE_ROLES:
        params = {**entry.params, **request.params}
        return params.get("temperature") == 0 or params.get("seed") is not None
    return False


def request_key(entry: AgentConfig, request: AgentRequest) -> str:
    """The sha256 of the agent's identity and the request, as canonical JSON."""
    identity = entry.model_dump(mode="json", include=set(_IDENTITY_FIELDS))
    metadata = {k: v for k, v in request.metadata.items() if k != "session_id"}
    asked: dict[str, Any] = {
        "role": request.role,
        "messages": request.messages,
        "metadata": metadata,
        "options": request.options,
        "params": request.params,
        "case_id": request.case_id,
        "turn": request.turn,
    }
    if request.role in _PER_REPETITION:
        asked["repetition"] = request.repetition
    document = {"v": KEY_VERSION, "agent": identity, "request": asked}
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def reply_document(reply: AgentReply) -> dict[str, Any]:
    """A reply as the cache stores it: everything but the call's record."""
    return {
        "content": reply.content,
        "tool_calls": [call.model_dump(mode="json") for call in reply.tool_calls],
        "finish_reason": reply.finish_reason,
        "awaiting_input": reply.awaiting_input,
        "input_hint": reply.input_hint,
        "state": reply.state,
        "raw_tool_calls": reply.raw_tool_calls,
        "problems": list(reply.problems),
        "stop_reason": reply.call.stop_reason if reply.call is not None else None,
    }


def cached_reply(document: dict[str, Any], role: AgentRole, agent: str) -> AgentReply:
    """A stored reply served again: its call record says `cached` and used nothing."""
    call = AgentCallRecord(
        role=role,
        agent=agent,
        latency_ms=0,
        attempts=0,
        usage=Usage(),
        stop_reason=document.get("stop_reason"),
        cached=True,
    )
    return AgentReply(
        content=document.get("content"),
        tool_calls=[ToolCall.model_validate(c) for c in document.get("tool_calls") or []],
        finish_reason=document.get("finish_reason"),
        awaiting_input=document.get("awaiting_input"),
        input_hint=document.get("input_hint"),
        state=document.get("state"),
        usage=Usage(),
        call=call,
        raw_tool_calls=document.get("raw_tool_calls"),
        problems=list(document.get("problems") or []),
    )


async def claim(store: ReplyCacheStore, key: str, agent: str, role: AgentRole) -> Claim:
    """The key's cached reply, or its lease; waits out another caller's lease (polling)
    and answers Busy when it ran out without a reply, so that the caller calls itself."""
    deadline = time.monotonic() + store.lease_seconds()
    delay = 0.05
    while True:
        found = await asyncio.to_thread(store.claim, key, agent, role)
        if not isinstance(found, Busy) or time.monotonic() >= deadline:
            return found
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)
