"""The `openai-responses` protocol: OpenAI's Responses API at `{base_url}/responses`.

The conversation the engine keeps is in Chat Completions shape; here it becomes a
Responses request: system (and developer) messages become `instructions`, sent on every
call; user and assistant messages become input messages (text parts as `input_text`,
images as `input_image`, files as `input_file`); an assistant's tool calls become
`function_call` items and the runner's `tool` messages (the case's `tool_mocks`)
`function_call_output` items with the same `call_id`. Tools are function tools with
`name` and `parameters` at the top level, `strict: false` unless the tool says
otherwise (Chat Completions' default; the Responses API would otherwise make its schema
strict). Replies come back the other way: the text of the `message` items is the
content, `function_call` items are the tool calls, `usage` (input and output tokens) is
recorded, and the status is the finish reason: `stop`, `tool_calls`, or for an
`incomplete` response `length` (`max_output_tokens`) or its other reason. Replies,
whole or streamed, are read in protocols/openai_responses_reply.py.

By default every call sends the whole conversation (`store` is not sent). With
`previous_response_id: true` a target's call sends only what came after its last reply,
with that response's id: the API keeps the rest. The ids are kept in the process that
made the call; a conversation continued elsewhere (another worker) or whose history
changed sends the whole conversation again, without an id.

The case's metadata is not sent unless the entry asks (`metadata: object` or
`strings`), and then with `store: true` unless `params` sets `store`, as for `openai`:
OpenAI keeps metadata only on the responses it stores. The case's other options (skip,
search, mode) are not sent: the API refuses fields it does not know.

With `stream: true` the request asks for Server-Sent Events (`response.output_text.delta`
and `response.function_call_arguments.delta` pieces, `response.completed` with the usage).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from agenttest_worker.agents.config import AgentConfig, ProjectConfig
from agenttest_worker.agents.http.streaming import StreamSpec
from agenttest_worker.agents.interface import (
    AgentError,
    AgentReply,
    AgentRequest,
    object_of,
    protocol,
    text_of,
)
from agenttest_worker.agents.protocols.json_client import JsonAgentClient, body_json, say_api_error
from agenttest_worker.agents.protocols.openai import encode_metadata, streams_whole
from agenttest_worker.agents.protocols.openai_responses_reply import (
    ResponseAssembler,
    ResponsesReply,
    error_text,
    parse_response,
)

# What the runner writes into a Responses request itself, beyond `model` and `stream`.
RUNNER_FIELDS = ("input", "instructions", "previous_response_id")

# Conversations whose last response id a client keeps (the oldest are forgotten first;
# a forgotten one sends its whole conversation again).
KEPT_CONVERSATIONS = 10_000

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def check_entry(config: AgentConfig) -> str | None:
    if not config.base_url:
        return "an openai-responses agent needs base_url (e.g. https://api.openai.com/v1)"
    owned = [name for name in RUNNER_FIELDS if name in config.params]
    if owned:
        return (
            f"{', '.join(owned)} cannot be a param of an openai-responses agent: the runner "
            "writes " + ("it" if len(owned) == 1 else "them")
        )
    if config.previous_response_id and config.params.get("store") is False:
        return "previous_response_id: true needs stored responses: params sets store: false"
    return streams_whole(config, "an openai-responses")


# -- the request ------------------------------------------------------------------------------


def _input_parts(content: Any) -> str | list[dict[str, Any]]:
    """A user message's content as Responses input: a string, or input parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return str(content)
    parts: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text"):
            parts.append({"type": "input_text", "text": str(part.get("text") or "")})
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url", "") if isinstance(image, dict) else str(image or "")
            detail = image.get("detail") if isinstance(image, dict) else None
            parts.append(
                {
                    "type": "input_image",
                    "image_url": url,
                    "detail": detail if detail in ("low", "high", "auto") else "auto",
                }
            )
        elif kind == "file":
            file = object_of(part.get("file"))
            entry: dict[str, Any] = {"type": "input_file"}
            if file.get("filename"):
                entry["filename"] = str(file["filename"])
            data = str(file.get("file_data") or "")
            # A file the case names by URL is fetched by the API; others travel inline.
            if data.startswith(("http://", "https://")):
                entry["file_url"] = data
            elif data:
                entry["file_data"] = data
            if file.get("file_id"):
                entry["file_id"] = str(file["file_id"])
            parts.append(entry)
    return parts


def _function_call(call: Any, index: int) -> dict[str, Any] | None:
    if not isinstance(call, dict):
        return None
    function = object_of(call.get("function"))
    name = function.get("name")
    if not isinstance(name, str) or not name:
        return None
    arguments = function.get("arguments")
    return {
        "type": "function_call",
        "call_id": str(call.get("id") or f"call_{index}"),
        "name": name,
        "arguments": arguments
        if isinstance(arguments, str)
        else json.dumps(arguments or {}, ensure_ascii=False),
    }


def to_input(history: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """(instructions, input items) for a Responses request from a Chat Completions history."""
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    for message in history:
        role = message.get("role")
        if role in ("system", "developer"):
            text = text_of(message.get("content"))
            if text:
                instructions.append(text)
        elif role == "user":
            items.append({"role": "user", "content": _input_parts(message.get("content"))})
        elif role == "assistant":
            text = text_of(message.get("content"))
            if text:
                items.append({"role": "assistant", "content": text})
            calls = message.get("tool_calls")
            for index, call in enumerate(calls if isinstance(calls, list) else []):
                item = _function_call(call, index)
                if item is not None:
                    items.append(item)
        elif role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": str(message.get("tool_call_id")),
                    "output": text_of(message.get("content")) or "",
                }
            )
    return ("\n\n".join(instructions) or None), items


def function_tools(tools: list[Any]) -> list[dict[str, Any]]:
    """agenttest.yaml's tools as Responses tools: a bare name, a Chat Completions tool
    ({type, function: {...}}) or function ({name, parameters}) becomes a function tool
    with its fields at the top level; a tool already in Responses shape (or a built-in
    tool, another `type`) is sent as written."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        if isinstance(tool, str):
            tool = {"name": tool}
        if not isinstance(tool, dict):
            continue
        nested = tool.get("function")
        if isinstance(nested, dict):
            function = nested
        elif tool.get("type") in (None, "function"):
            function = tool
        else:
            out.append(tool)
            continue
        entry: dict[str, Any] = {
            "type": "function",
            "name": function.get("name"),
            "parameters": function.get("parameters") or EMPTY_PARAMETERS,
            "strict": bool(function.get("strict", False)),
        }
        if function.get("description"):
            entry["description"] = function["description"]
        out.append(entry)
    return out


def _fingerprint(messages: list[dict[str, Any]]) -> str:
    text = json.dumps(messages, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class LastResponse:
    """A conversation's last response: its id, how many messages its request held, and
    the fingerprint of those messages followed by its reply (as the history keeps it)."""

    response_id: str
    covered: int
    fingerprint: str


class ResponseChain:
    """The last response of each conversation a client continues (`previous_response_id`)."""

    def __init__(self, limit: int = KEPT_CONVERSATIONS) -> None:
        self.limit = limit
        self._last: OrderedDict[str, LastResponse] = OrderedDict()
        # Calls of one client run on one event loop, but a fleet worker may build the
        # pool's clients on one thread and call them from another.
        self._lock = threading.Lock()

    def continuation(self, session: str, messages: list[dict[str, Any]]) -> LastResponse | None:
        """The last response, when `messages` are its request's, its reply, and more."""
        with self._lock:
            last = self._last.get(session)
        if last is None or len(messages) <= last.covered + 1:
            return None
        if _fingerprint(messages[: last.covered + 1]) != last.fingerprint:
            return None
        return last

    def remember(
        self, session: str, response_id: str, sent: list[dict[str, Any]], reply: AgentReply
    ) -> None:
        history = [*sent, reply.assistant_message()]
        last = LastResponse(response_id, len(sent), _fingerprint(history))
        with self._lock:
            self._last[session] = last
            self._last.move_to_end(session)
            while len(self._last) > self.limit:
                self._last.popitem(last=False)


@protocol("openai-responses", check=check_entry)
class OpenAIResponsesClient(JsonAgentClient):
    records_stop_reason = True

    def __init__(
        self, name: str, config: AgentConfig, project: ProjectConfig | None = None
    ) -> None:
        super().__init__(name, config, project)
        self.chain = ResponseChain() if config.previous_response_id else None

    def endpoint(self) -> str:
        assert self.config.base_url is not None
        return self.config.base_url.rstrip("/") + "/responses"

    def body(self, request: AgentRequest) -> dict[str, Any]:
        return self.request_body(request, self._continuation(request))

    def request_body(self, request: AgentRequest, last: LastResponse | None) -> dict[str, Any]:
        instructions, items = to_input(request.messages)
        body: dict[str, Any] = {"model": self.config.model or self.name}
        if last is not None:
            # What came after the last response's reply; the API holds the rest.
            _, items = to_input(request.messages[last.covered + 1 :])
            body["previous_response_id"] = last.response_id
        body["input"] = items
        if instructions is not None:
            body["instructions"] = instructions
        metadata = encode_metadata(request.metadata, self.config.metadata_mode())
        if metadata is not None:
            body["metadata"] = metadata
            # OpenAI keeps metadata only on responses it stores.
            body["store"] = True
        if self.config.tools and request.role == "target":
            body["tools"] = function_tools(self.config.tools)
        if self.config.stream:
            body["stream"] = True
        body.update(self.params(request))
        return body

    def _continuation(self, request: AgentRequest) -> LastResponse | None:
        if self.chain is None or request.role != "target" or not request.session_id:
            return None
        return self.chain.continuation(request.session_id, request.messages)

    def parse(self, data: Any) -> AgentReply:
        return parse_response(data, self.name)

    def stream_spec(self) -> StreamSpec | None:
        if not self.config.stream:
            return None
        return StreamSpec("sse", lambda: ResponseAssembler(self.name))

    async def complete(self, request: AgentRequest) -> AgentReply:
        # The messages as sent: the engine's list grows once the reply is in.
        sent = list(request.messages)
        try:
            reply = await super().complete(request)
        except AgentError as error:
            if error.kind == "http":  # its body is an API error object
                say_api_error(error, self.name, error_text(_error_of(error.raw)))
            raise
        if (
            self.chain is not None
            and request.role == "target"
            and request.session_id
            and isinstance(reply, ResponsesReply)
            and reply.response_id
        ):
            self.chain.remember(request.session_id, reply.response_id, sent, reply)
        return reply


def _error_of(text: str | None) -> Any:
    data = body_json(text)
    return data.get("error") if isinstance(data, dict) else None
