"""An agent's secrets masked in what it sends back, before anything keeps it.

A gateway may echo what it was sent: `401 bad key: <the key>`, a reply that quotes its
headers, a chat history that stores them. Whatever an agent answers (a reply, read
whole or streamed, what a broken stream had sent, an error and the body it kept, a chat
history) becomes turns, call records, judge reasons and reports; so it is masked here,
where a client hands it over, with every secret of the agent (`hidden`: its API key,
the values its entry takes from ${VAR}, its URL's and proxy's credentials). Only the
secrets themselves are replaced: the rest of the reply is kept as the agent wrote it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from agenttest_worker.agents.interface import AgentError, AgentReply, HistoryRead
from agenttest_worker.errors import hidden_forms, hide
from agenttest_worker.results import AgentCallRecord


def masked_json(value: Any, forms: tuple[str, ...]) -> Any:
    """A JSON value with `forms` (errors.hidden_forms) masked in every string, keys too."""
    if isinstance(value, str):
        return hide(value, forms)
    if isinstance(value, dict):
        return {hide(str(k), forms): masked_json(v, forms) for k, v in value.items()}
    if isinstance(value, list):
        return [masked_json(item, forms) for item in value]
    return value


def _optional(text: str | None, forms: tuple[str, ...]) -> str | None:
    return hide(text, forms) if text is not None else None


def mask_reply(reply: AgentReply, hidden: Collection[str]) -> AgentReply:
    """`reply` with the agent's secrets masked in all it says (in place; returned)."""
    forms = hidden_forms(hidden)
    if not forms:
        return reply
    reply.content = _optional(reply.content, forms)
    reply.input_hint = _optional(reply.input_hint, forms)
    reply.finish_reason = _optional(reply.finish_reason, forms)
    reply.state = masked_json(reply.state, forms)
    reply.problems = [hide(problem, forms) for problem in reply.problems]
    for call in reply.tool_calls:
        call.name = hide(call.name, forms)
        call.args = masked_json(call.args, forms)
        call.id = _optional(call.id, forms)
    if reply.raw_tool_calls is not None:
        reply.raw_tool_calls = masked_json(reply.raw_tool_calls, forms)
    if reply.call is not None:
        _mask_record(reply.call, forms)
    return reply


def mask_error(error: AgentError, hidden: Collection[str]) -> AgentError:
    """`error` with the agent's secrets masked in its message, the reply body it keeps,
    its call record and what a broken stream had sent (in place; returned). The message
    is masked as errors.redact masks it (URLs too) by the transport; this covers the rest."""
    forms = hidden_forms(hidden)
    if not forms:
        return error
    error.message = hide(error.message, forms)
    error.args = (error.message,)
    error.raw = _optional(error.raw, forms)
    if error.call is not None:
        _mask_record(error.call, forms)
    if error.partial is not None:
        mask_reply(error.partial, hidden)
    return error


def mask_history(read: HistoryRead, hidden: Collection[str]) -> HistoryRead:
    """A chat history with the agent's secrets masked in every round (in place; returned)."""
    forms = hidden_forms(hidden)
    if not forms:
        return read
    for found in read.rounds:
        found.events = masked_json(found.events, forms)
        found.content = _optional(found.content, forms)
        found.tool_results = masked_json(found.tool_results, forms)
        found.problems = [hide(problem, forms) for problem in found.problems]
        for call in found.tool_calls:
            call.name = hide(call.name, forms)
            call.args = masked_json(call.args, forms)
            call.id = _optional(call.id, forms)
    if read.call is not None:
        _mask_record(read.call, forms)
    return read


def _mask_record(record: AgentCallRecord, forms: tuple[str, ...]) -> None:
    record.error = _optional(record.error, forms)
    record.reply = _optional(record.reply, forms)
    record.stop_reason = _optional(record.stop_reason, forms)
