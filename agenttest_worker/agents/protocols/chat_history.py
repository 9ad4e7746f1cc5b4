"""History-based http agents: replies read back from the agent's chat history.

Some agents answer an input with little or nothing in the response itself (a stream to
wait for, an acknowledgement) and keep the conversation in a chat history of their own,
as tdx's runner expects: it sends the input, waits for the reply to complete, then
fetches the history. `history: {url, when, response}` in agenttest.yaml says where that
history is and how its events are written.

The history is split into rounds at each input event; a round is everything the agent
emitted after that input and before the next: several assistant messages, tool calls
and tool results, kept in order as the history wrote them. Events before the first
input (a greeting) belong to no round. An event says what it is by its role (a Chat
Completions-like history) or, in tdx's history, by the key it carries (`input`,
`content`, `tool`): the mapping says which (config.HistoryMapping).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Literal
from urllib.parse import quote

from agenttest_worker.agents.config import AgentConfig
from agenttest_worker.agents.http.exchange import Route
from agenttest_worker.agents.http.transport import post_json
from agenttest_worker.agents.interface import (
    AgentError,
    AgentRequest,
    HistoryRead,
    HistoryRound,
    read_tool_calls,
    text_of,
)
from agenttest_worker.agents.limits.retry import RetryPolicy
from agenttest_worker.agents.reply_mappings import HistoryMapping
from agenttest_worker.json_values import find, nested_deeper_than, parse_json
from agenttest_worker.results import ToolCall


def _tool_args(args: Any) -> Any:
    """A tool event's arguments: parsed when they are JSON text, {} when none."""
    if args is None:
        return {}
    if isinstance(args, str):
        is_json, value = parse_json(args)
        return value if is_json else args
    return args


def history_url(template: str, request: AgentRequest) -> str:
    values = {"session_id": request.session_id or "", "case_id": request.case_id or ""}
    url = template
    for key, value in values.items():
        for written in (f"{{{{{key}}}}}", f"{{{{ {key} }}}}"):
            url = url.replace(written, quote(str(value), safe=""))
    return url


async def fetch_history(
    agent: str,
    config: AgentConfig,
    request: AgentRequest,
    hidden: Collection[str],
    route: Route,
) -> HistoryRead:
    """GET (or POST {session_id, case_id}) the history and split it into rounds."""
    history = config.history
    assert history is not None
    key = config.api_key()
    headers = dict(config.headers)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    headers.update(history.headers)
    body = (
        {"session_id": request.session_id, "case_id": request.case_id}
        if history.method == "POST"
        else None
    )
    result = await post_json(
        url=history_url(history.url, request),
        body=body,
        headers=headers,
        timeout=config.timeout,
        policy=RetryPolicy(max_retries=config.max_retries, base_delay=config.base_delay),
        role=request.role,
        agent=agent,
        method=history.method,
        hidden=hidden,
        route=route,
    )
    data = result.json(agent)
    try:
        rounds = split_rounds(data, history.response, agent)
    except AgentError as error:
        result.record.error = error.message
        error.call = result.record
        error.raw = result.text[:4096]
        raise
    return HistoryRead(rounds, result.record)


def _first(path: str, data: Any) -> Any:
    found = find(path, data) if isinstance(data, dict | list) else []
    return found[0] if found else None


EventKind = Literal["input", "assistant", "tool"]


def event_kind(event: Any, mapping: HistoryMapping) -> EventKind | None:
    """What an event is: an input, the agent's, a tool's; None for anything else."""
    if mapping.by_key:
        if mapping.input is not None and _has(mapping.input, event):
            return "input"
        if mapping.tool is not None and _has(mapping.tool, event):
            return "tool"
        if _has(mapping.content, event) or _has(mapping.tool_calls, event):
            return "assistant"
        return None
    role = _first(mapping.role, event)
    if role == mapping.input_role:
        return "input"
    if role == mapping.assistant_role:
        return "assistant"
    if role == mapping.tool_role:
        return "tool"
    return None


def _has(path: str, event: Any) -> bool:
    return isinstance(event, dict | list) and bool(find(path, event))


def split_rounds(data: Any, mapping: HistoryMapping, agent: str) -> list[HistoryRound]:
    events = _first(mapping.events, data)
    if events is None and isinstance(data, list):
        events = data  # the history is the list itself
    if not isinstance(events, list):
        raise AgentError(
            "parse", f"agent error: {agent}'s history has no list of events at {mapping.events}"
        )
    rounds: list[list[Any]] = []
    for event in events:
        if event_kind(event, mapping) == "input":
            rounds.append([])
        elif rounds:
            rounds[-1].append(event)
    return [read_round(round_events, mapping) for round_events in rounds]


def read_round(events: list[Any], mapping: HistoryMapping) -> HistoryRound:
    """A round's text (its assistant messages, joined by blank lines), calls and results."""
    texts: list[str] = []
    found = HistoryRound(events=events, content=None)
    names: dict[str, str] = {}
    for event in events:
        kind = event_kind(event, mapping)
        raw_calls = _first(mapping.tool_calls, event)
        if raw_calls is not None:
            read = read_tool_calls(raw_calls)
            found.tool_calls.extend(read.calls)
            found.problems.extend(read.problems)
            names.update({call.id: call.name for call in read.calls if call.id})
        if kind == "tool":
            name = _first(mapping.tool_name, event)
            if not isinstance(name, str):
                name = names.get(str(_first(mapping.tool_call_id, event)))
            if isinstance(name, str):
                if mapping.by_key:
                    # A tdx tool event is the call and its result in one.
                    args = _first(mapping.tool_args, event) if mapping.tool_args else None
                    found.tool_calls.append(ToolCall(name=name, args=_tool_args(args)))
                result = _first(mapping.tool_content or mapping.content, event)
                is_json, value = parse_json(result) if isinstance(result, str) else (False, None)
                # Kept as its text when nested deeper than a state holds (json_values.py).
                is_json = is_json and not nested_deeper_than(value)
                found.tool_results[name] = value if is_json else result
        elif kind == "assistant":
            text = text_of(_first(mapping.content, event))
            if text:
                texts.append(text)
    found.content = "\n\n".join(texts)
    return found
