"""History-based http agents: replies read back from the agent's chat history.

Some agents answer an input with little or nothing in the response itself (a stream to
wait for, an acknowledgement) and keep the conversation in a chat history of their own,
as tdx's runner expects: it sends the input, waits for the reply to complete, then
fetches the history. `history: {url, when, response}` in agenttest.yaml says where that
history is and how its events are written.

The history is split into rounds at each input event (role `input_role`); a round is
everything the agent emitted after that input and before the next: several assistant
messages, tool calls and tool results, kept in order as the history wrote them. Events
before the first input (a greeting) belong to no round.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any
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
        if _first(mapping.role, event) == mapping.input_role:
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
        role = _first(mapping.role, event)
        raw_calls = _first(mapping.tool_calls, event)
        if raw_calls is not None:
            read = read_tool_calls(raw_calls)
            found.tool_calls.extend(read.calls)
            found.problems.extend(read.problems)
            names.update({call.id: call.name for call in read.calls if call.id})
        if role == mapping.tool_role:
            name = _first(mapping.tool_name, event)
            if not isinstance(name, str):
                name = names.get(str(_first(mapping.tool_call_id, event)))
            if isinstance(name, str):
                result = _first(mapping.content, event)
                is_json, value = parse_json(result) if isinstance(result, str) else (False, None)
                # Kept as its text when nested deeper than a state holds (json_values.py).
                is_json = is_json and not nested_deeper_than(value)
                found.tool_results[name] = value if is_json else result
        elif role == mapping.assistant_role:
            text = text_of(_first(mapping.content, event))
            if text:
                texts.append(text)
    found.content = "\n\n".join(texts)
    return found
