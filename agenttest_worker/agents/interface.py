"""The agent extension point: a request, a reply, an error, the client, and the registry.

Every protocol (agents/protocols/: openai, anthropic, http, script) turns an AgentRequest into an
AgentReply or raises AgentError; retries, timing and token accounting are common to
all of them. Messages are Chat Completions messages (role, content, tool_calls,
tool_call_id), the one shape the engine keeps for a conversation.

A protocol registers its client class where it is defined, under the name
agenttest.yaml writes as `protocol:`:

    @protocol("openai", check=needs_base_url)
    class OpenAIClient: ...

The registry is the one list of protocols: agents/config.py checks `protocol:` names
and each protocol's settings against it (and lists its names when one is unknown),
and the pool builds every agent's client from it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from agenttest_worker.json_values import nested_deeper_than, too_deep_message
from agenttest_worker.results import AgentCallRecord, AgentRole, ToolCall, Usage


@dataclass
class AgentRequest:
    role: AgentRole
    messages: list[dict[str, Any]]
    metadata: dict[str, Any] = field(default_factory=dict)
    # The spec's context.Options other than metadata and connector (skip, search, mode),
    # sent beside `metadata` as `options` when any is set.
    options: dict[str, Any] = field(default_factory=dict)
    # Model parameters the case or the role adds to the agent entry's `params` (a
    # case's temperature for its target, a simulator's for itself).
    params: dict[str, Any] = field(default_factory=dict)
    # Identifies the conversation to agents that keep their own state.
    session_id: str | None = None
    case_id: str | None = None
    turn: int | None = None
    # The repetition (--repeat) of the conversation the call is for: it keys a
    # target's or simulator's cached reply, never sent.
    repetition: int | None = None


@dataclass
class AgentReply:
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    # What the agent declared about itself (generic http agents, or extra fields).
    awaiting_input: bool | None = None
    input_hint: str | None = None
    state: Any = None
    usage: Usage | None = None
    call: AgentCallRecord | None = None
    raw_tool_calls: list[dict[str, Any]] | None = None
    # What in the reply could not be used as it came (malformed tool calls), each with
    # its raw text: the turn records them as problems instead of dropping them.
    problems: list[str] = field(default_factory=list)

    def assistant_message(self) -> dict[str, Any]:
        """The reply as the assistant message that goes into the conversation history."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.raw_tool_calls or [
                {
                    "id": call.id or f"call_{i}",
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": call.args
                        if isinstance(call.args, str)
                        else json.dumps(call.args),
                    },
                }
                for i, call in enumerate(self.tool_calls)
            ]
        return message


class AgentError(Exception):
    """A call that failed after its retries, with a message fit for the report.

    `kind` is one of: timeout, connection, http, parse, config, script, stream, state
    (an end state that cannot be read: agents/state_fetch.py), and unexpected
    (anything else a client raised, agents/pool.py `RoleSession.call`).
    """

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        call: AgentCallRecord | None = None,
        raw: str | None = None,
        partial: AgentReply | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.call = call
        self.raw = raw
        # A stream that broke after content arrived: what had been assembled by then,
        # which the turn keeps as its output.
        self.partial = partial

    def __str__(self) -> str:
        return self.message


class AgentClient(Protocol):
    """One configured agent, callable with a request."""

    name: str

    async def complete(self, request: AgentRequest) -> AgentReply: ...


@dataclass
class HistoryRound:
    """What a history-based agent emitted after one input: its events as the history
    wrote them, and what the runner reads of them (text, tool calls, tool results)."""

    events: list[Any]
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_results: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


@dataclass
class HistoryRead:
    """A chat history split into rounds, one per input event, and the call that read it."""

    rounds: list[HistoryRound]
    call: AgentCallRecord | None = None


class HistorySource(Protocol):
    """A client whose replies are read back from the agent's chat history.

    `history_when` is "turn" (fetched after every turn) or "end" (once, after the last
    static turn); the engine asks for the history then and gives each turn its round.
    """

    history_when: str

    async def fetch_history(self, request: AgentRequest) -> HistoryRead: ...


def history_source(client: AgentClient) -> HistorySource | None:
    """The client as a history source, when its agent declares `history:`."""
    when = getattr(client, "history_when", None)
    return client if isinstance(when, str) and hasattr(client, "fetch_history") else None  # type: ignore[return-value]


def parse_arguments(arguments: Any) -> Any:
    """Tool-call arguments as data: JSON strings are parsed; unparseable text is kept as is.

    Arguments nested deeper than the project stores (json_values.MAX_REPLY_DEPTH) raise
    an AgentError: the reply cannot be kept, and its turn fails saying why."""
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except RecursionError:  # nested past the parser's own limit
            raise _too_deep("tool arguments") from None
        except ValueError:
            return arguments
        text: str | None = arguments
    else:
        parsed, text = (arguments if arguments is not None else {}), None
    if nested_deeper_than(parsed, text=text):
        raise _too_deep("tool arguments")
    return parsed


def _too_deep(what: str) -> AgentError:
    return AgentError("parse", f"agent error: {too_deep_message(what)}")


# A problem quotes the agent's raw text up to this many characters (as a call's `reply`).
RAW_TEXT_LIMIT = 4096


def raw_text(value: Any) -> str:
    """A JSON value of the reply as the agent wrote it (JSON text, cut)."""
    return json.dumps(value, ensure_ascii=False, default=str)[:RAW_TEXT_LIMIT]


@dataclass
class ToolCallsRead:
    """The tool calls of a reply that could be read, the raw items they came from (in
    the same order, for the conversation history), and what could not be read."""

    calls: list[ToolCall] = field(default_factory=list)
    raw_items: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def read_tool_calls(raw: Any) -> ToolCallsRead:
    """Read `tool_calls` (Chat Completions items, or simpler {name, args} items).

    Nothing malformed is dropped in silence: a `tool_calls` that is not a list, an item
    that is not an object or has no name becomes a problem quoting its raw text; a call
    whose arguments are not a JSON object is kept (arguments as the raw text) and is a
    problem too.
    """
    read = ToolCallsRead()
    if raw is None:
        return read
    if not isinstance(raw, list):
        read.problems.append(f"tool_calls is not a list: {raw_text(raw)}")
        return read
    for index, item in enumerate(raw, start=1):
        if not isinstance(item, dict):
            read.problems.append(f"tool call {index} is not an object: {raw_text(item)}")
            continue
        function = item.get("function") if isinstance(item.get("function"), dict) else None
        name = (function or item).get("name")
        if not isinstance(name, str) or not name.strip():
            read.problems.append(f"tool call {index} has no name: {raw_text(item)}")
            continue
        args = (
            (function or {}).get("arguments")
            if function
            else item.get("args", item.get("arguments"))
        )
        parsed = parse_arguments(args)
        if isinstance(args, str) and args.strip() and not isinstance(parsed, dict):
            what = "not JSON" if parsed is args else "not a JSON object"
            # Arguments are JSON text inside the JSON reply: quoted as that text.
            quoted = args[:RAW_TEXT_LIMIT]
            read.problems.append(f"tool call {name}: arguments are {what}: {quoted}")
        call_id = item.get("id")
        read.calls.append(ToolCall(name=name, args=parsed, id=str(call_id) if call_id else None))
        read.raw_items.append(item)
    return read


def object_of(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty one (fields of a reply read leniently)."""
    return value if isinstance(value, dict) else {}


def text_of(content: Any) -> str | None:
    """The text of a message content: a string, or the text parts of a parts list."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and part.get("type") in ("text", "output_text")
        ]
        return "".join(texts)
    return str(content)


# -- the protocol registry ---------------------------------------------------------------


class ClientFactory(Protocol):
    """Makes one agent's client from its name, its AgentConfig and the ProjectConfig.

    The configs are typed Any because agents/config.py checks `protocol:` against this
    registry: this module cannot import it back.
    """

    def __call__(self, name: str, config: Any, project: Any, /) -> AgentClient: ...


# What an agent of a protocol lacks in its settings, said for the user; None when complete.
SettingsCheck = Callable[[Any], "str | None"]

# How the case's metadata (and its options) reach an agent's request body: as given, as
# short strings (what OpenAI's `metadata` takes), or not at all.
MetadataMode = Literal["object", "strings", "none"]


@dataclass(frozen=True)
class AgentProtocol:
    name: str
    client: ClientFactory
    check: SettingsCheck | None = None
    # `metadata:` when the agent entry says nothing: hosted APIs refuse a `metadata`
    # field they do not know (OpenAI's only with `store: true`), so only the generic
    # http protocol sends it unasked. The role prompts carry it regardless.
    metadata: MetadataMode = "none"
    # Settings the protocol cannot do without, each refused as its own field when unset.
    needs: tuple[str, ...] = ()


_PROTOCOLS: dict[str, AgentProtocol] = {}

FactoryT = TypeVar("FactoryT", bound=ClientFactory)


def protocol(
    name: str,
    *,
    check: SettingsCheck | None = None,
    metadata: MetadataMode = "none",
    needs: tuple[str, ...] = (),
) -> Callable[[FactoryT], FactoryT]:
    """Register a client class (or factory) under `name`, the `protocol:` agenttest.yaml writes.

    The pool calls it as client(agent_name, agent_config, project_config). `check`, given
    an agent's config, says what the protocol needs and it lacks; agenttest.yaml is
    checked with it when it is loaded. `metadata` is the protocol's default `metadata:`.
    `needs` names settings of agenttest.yaml (among those agents/config.py validates
    with `needed_setting`) that the protocol requires, each reported at its own field.
    """

    def decorate(client: FactoryT) -> FactoryT:
        if name in _PROTOCOLS:
            raise ValueError(f"agent protocol {name!r} registered twice")
        _PROTOCOLS[name] = AgentProtocol(name, client, check, metadata, needs)
        return client

    return decorate


def unregister_protocol(name: str) -> None:
    """Withdraw a protocol (one a test registered for itself, a plugin's)."""
    if _PROTOCOLS.pop(name, None) is None:
        raise LookupError(f"no agent protocol {name!r} registered")


def protocol_names() -> tuple[str, ...]:
    """The registered protocols, in the order they were registered."""
    return tuple(_PROTOCOLS)


def protocol_choices() -> str:
    """The registered names as a choice: "'openai', 'http' or 'script'"."""
    quoted = [repr(name) for name in _PROTOCOLS]
    return " or ".join(filter(None, (", ".join(quoted[:-1]), *quoted[-1:])))


def get_protocol(name: str) -> AgentProtocol:
    try:
        return _PROTOCOLS[name]
    except KeyError:
        raise LookupError(
            f"unknown agent protocol {name!r}: should be {protocol_choices()}"
        ) from None
