"""A stand-in for OpenAI's Responses API (`POST /v1/responses`), for tests.

Written from OpenAI's API reference for creating a response: the request's fields and
their types as the official `openai` package declares them (`types/responses/
response_create_params.py`, the input item and tool params), the `response` object it
answers with, and the streamed events. It refuses what the API refuses, with HTTP 400
and the API's error body `{"error": {"message", "type": "invalid_request_error",
"param", "code"}}`:

- a field the API does not define, at the top level or in an input item, content part
  or tool: "Unknown parameter: 'seed'." (`unknown_parameter`). `seed` is one: it is a
  Chat Completions parameter the Responses API does not have. So is a tool written in
  Chat Completions' nested `{"type": "function", "function": {...}}` shape (its `name`
  is missing at the top level, and `function` is unknown);
- a value of the wrong type, "Invalid type for 'temperature': expected a decimal, but
  got a string instead." (`invalid_type`), out of its range (`temperature` 0-2, `top_p`
  0-1, `max_output_tokens` at least 16) or not one of its values (`invalid_value`);
- a required field left out (`missing_required_parameter`): `model`, an item's `role`
  or `content`, a `function_call`'s `call_id`, `name` and `arguments`, ...;
- `metadata` that is not at most 16 string values (keys of up to 64 characters,
  values of up to 512);
- a `function_call_output` whose `call_id` answers no earlier `function_call`, and a
  `function_call` left without its output;
- a `previous_response_id` it does not hold (never created, or created with
  `store: false`).

Input items are messages (`role` user, assistant, system or developer; `content` a
string or parts: `input_text`, `input_image`, `input_file`, or for the assistant
`output_text` and `refusal`), `function_call` and `function_call_output`; tools are
function tools. The API's other item and tool types (built-in tools, reasoning items,
item references) are not served here: they are refused as values the stand-in does not
take, saying so.

Tests script what each model answers, as a list of answers used in order or a function
of the request (`Answer`: text, function calls, a reply cut off at
`max_output_tokens`), and read back every request received and every response sent.
A scripted function call to a tool the request did not offer is answered with HTTP 500
naming it: the client under test forgot its tools. Responses are kept (unless `store:
false`) so that `previous_response_id` continues a conversation as the API does: the
earlier response's input and output come before the new input.

Usage counts are the whitespace-separated words: `input_tokens` of the instructions
and of the whole conversation the model sees, `output_tokens` of its output.

    with ResponsesStandIn() as api:
        api.script("gpt-test", [say("Hello!"), call_function("lookup", city="Oslo")])
        client = openai.OpenAI(base_url=api.base_url, api_key="sk-test")
        client.responses.create(model="gpt-test", input="Hi")
        api.requests("gpt-test")[0].body
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from agenttest_worker.demo.threaded import ServedOnThread, ThreadedServer

Body = dict[str, Any]
Item = dict[str, Any]

# -- what tests script --------------------------------------------------------------------


@dataclass(frozen=True)
class FunctionCall:
    """A call to one of the request's function tools; `arguments` an object or raw text."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    call_id: str | None = None


@dataclass(frozen=True)
class Answer:
    """What a model answers: text, function calls (after the text), or both.

    `incomplete` ("max_output_tokens" or "content_filter") ends the response with status
    `incomplete` for that reason, its text cut: to `max_output_tokens` words when the
    request sets it, else to half its words. `delay` holds the answer back (seconds).
    `cut_after`: a streamed answer drops the connection after that many events.
    `failure`: the model fails with this message: a streamed response ends with
    `response.failed` (its `error` a `server_error`), a whole one is an HTTP 500.
    """

    text: str | None = None
    calls: tuple[FunctionCall, ...] = ()
    incomplete: str | None = None
    delay: float = 0.0
    cut_after: int | None = None
    failure: str | None = None


def say(text: str, **fields: Any) -> Answer:
    return Answer(text=text, **fields)


def call_function(name: str, **arguments: Any) -> Answer:
    """An answer that only calls `name` with these arguments."""
    return Answer(calls=(FunctionCall(name, arguments),))


@dataclass(frozen=True)
class Received:
    """One request as it arrived: its body, its headers, and the conversation the model
    sees (the earlier responses' input and output when it continues one, then its input,
    as input items; a string input as one user message)."""

    body: Any
    headers: dict[str, str]
    context: list[Item]

    @property
    def last_user_text(self) -> str:
        for item in reversed(self.context):
            if item.get("type", "message") == "message" and item.get("role") == "user":
                return message_text(item)
        return ""


Rule = Sequence[Answer | str] | Callable[[Received], Answer | str]


def message_text(item: Item) -> str:
    """The text of a message item: its string content, or its text parts joined."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    texts = [p.get("text") or p.get("refusal") or "" for p in parts if isinstance(p, dict)]
    return " ".join(t for t in texts if isinstance(t, str) and t)


# -- refusing what the API refuses ----------------------------------------------------------


class Refusal(Exception):
    """An error the API answers with: its status and its `error` object."""

    def __init__(
        self,
        message: str,
        param: str | None,
        code: str | None,
        *,
        status: int = 400,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": kind, "param": param, "code": code}}


Check = Callable[[Any, str], None]


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _wrong_type(value: Any, path: str, expected: str) -> Refusal:
    got = _type_name(value)
    return Refusal(
        f"Invalid type for '{path}': expected {expected}, but got {got} instead.",
        path,
        "invalid_type",
    )


def string(max_length: int | None = None) -> Check:
    def check(value: Any, path: str) -> None:
        if not isinstance(value, str):
            raise _wrong_type(value, path, "a string")
        if max_length is not None and len(value) > max_length:
            raise Refusal(
                f"Invalid '{path}': string too long. Expected a string with maximum length "
                f"{max_length}, but got a string with length {len(value)} instead.",
                path,
                "string_above_max_length",
            )

    return check


def boolean(value: Any, path: str) -> None:
    if not isinstance(value, bool):
        raise _wrong_type(value, path, "a boolean")


def integer(minimum: int | None = None, maximum: int | None = None) -> Check:
    def check(value: Any, path: str) -> None:
        if not isinstance(value, int) or isinstance(value, bool):
            raise _wrong_type(value, path, "an integer")
        if minimum is not None and value < minimum:
            raise Refusal(
                f"Invalid '{path}': integer below minimum value. Expected a value >= "
                f"{minimum}, but got {value} instead.",
                path,
                "integer_below_min_value",
            )
        if maximum is not None and value > maximum:
            raise Refusal(
                f"Invalid '{path}': integer above maximum value. Expected a value <= "
                f"{maximum}, but got {value} instead.",
                path,
                "integer_above_max_value",
            )

    return check


def decimal(minimum: float, maximum: float) -> Check:
    def check(value: Any, path: str) -> None:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise _wrong_type(value, path, "a decimal")
        if value < minimum:
            raise Refusal(
                f"Invalid '{path}': decimal below minimum value. Expected a value >= "
                f"{minimum:g}, but got {value} instead.",
                path,
                "decimal_below_min_value",
            )
        if value > maximum:
            raise Refusal(
                f"Invalid '{path}': decimal above maximum value. Expected a value <= "
                f"{maximum:g}, but got {value} instead.",
                path,
                "decimal_above_max_value",
            )

    return check


def one_of(*values: str) -> Check:
    def check(value: Any, path: str) -> None:
        if not isinstance(value, str):
            raise _wrong_type(value, path, "one of " + ", ".join(repr(v) for v in values))
        if value not in values:
            supported = ", ".join(f"'{v}'" for v in values[:-1])
            supported = f"{supported} and '{values[-1]}'" if supported else f"'{values[-1]}'"
            raise Refusal(
                f"Invalid value: '{value}'. Supported values are: {supported}.",
                path,
                "invalid_value",
            )

    return check


def nullable(inner: Check) -> Check:
    def check(value: Any, path: str) -> None:
        if value is not None:
            inner(value, path)

    return check


def any_object(value: Any, path: str) -> None:
    if not isinstance(value, dict):
        raise _wrong_type(value, path, "an object")


def array_of(item: Check) -> Check:
    def check(value: Any, path: str) -> None:
        if not isinstance(value, list):
            raise _wrong_type(value, path, "an array")
        for index, element in enumerate(value):
            item(element, f"{path}[{index}]")

    return check


def string_or_array(item: Check) -> Check:
    """A string, or an array of `item` (an input, a message's content, an output)."""
    array = array_of(item)

    def check(value: Any, path: str) -> None:
        if isinstance(value, str):
            return
        if not isinstance(value, list):
            raise _wrong_type(value, path, "one of a string or array")
        array(value, path)

    return check


def fields_of(value: Any, path: str, known: dict[str, Check], required: Sequence[str] = ()) -> None:
    """An object whose keys are `known` (each checked), with the `required` ones."""
    if not isinstance(value, dict):
        raise _wrong_type(value, path, "an object")
    for name in required:
        if name not in value:
            raise Refusal(
                f"Missing required parameter: '{_join(path, name)}'.",
                _join(path, name),
                "missing_required_parameter",
            )
    for name, element in value.items():
        if name not in known:
            raise Refusal(
                f"Unknown parameter: '{_join(path, name)}'.",
                _join(path, name),
                "unknown_parameter",
            )
        known[name](element, _join(path, name))


def object_with(known: dict[str, Check], required: Sequence[str] = ()) -> Check:
    def check(value: Any, path: str) -> None:
        fields_of(value, path, known, required)

    return check


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def not_served(what: str, kind: str) -> Refusal:
    return Refusal(
        f"Invalid value: '{kind}'. This stand-in of the Responses API serves only {what}.",
        None,
        "invalid_value",
    )


ITEM_STATUS = nullable(one_of("in_progress", "completed", "incomplete"))
TEXT = string()

INPUT_PARTS: dict[str, tuple[dict[str, Check], tuple[str, ...]]] = {
    "input_text": ({"type": TEXT, "text": TEXT}, ("text",)),
    "input_image": (
        {
            "type": TEXT,
            "image_url": nullable(TEXT),
            "file_id": nullable(TEXT),
            "detail": one_of("low", "high", "auto"),
        },
        (),
    ),
    "input_file": (
        {
            "type": TEXT,
            "file_data": TEXT,
            "file_id": nullable(TEXT),
            "file_url": TEXT,
            "filename": TEXT,
        },
        (),
    ),
}
ASSISTANT_PARTS: dict[str, tuple[dict[str, Check], tuple[str, ...]]] = {
    "output_text": (
        {
            "type": TEXT,
            "text": TEXT,
            "annotations": array_of(any_object),
            "logprobs": array_of(any_object),
        },
        ("text",),
    ),
    "refusal": ({"type": TEXT, "refusal": TEXT}, ("refusal",)),
}


def content_part(parts: dict[str, tuple[dict[str, Check], tuple[str, ...]]]) -> Check:
    def check(value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise _wrong_type(value, path, "an object")
        if "type" not in value:
            raise Refusal(
                f"Missing required parameter: '{path}.type'.",
                f"{path}.type",
                "missing_required_parameter",
            )
        kind = value["type"]
        one_of(*parts)(kind, f"{path}.type")
        known, required = parts[kind]
        fields_of(value, path, known, required)

    return check


MESSAGE_FIELDS: dict[str, Check] = {
    "type": one_of("message"),
    "role": one_of("user", "assistant", "system", "developer"),
    "content": lambda value, path: None,  # checked by role, below
    "id": TEXT,
    "status": ITEM_STATUS,
    "phase": nullable(one_of("commentary", "final_answer")),
}
FUNCTION_CALL_FIELDS: dict[str, Check] = {
    "type": TEXT,
    "call_id": TEXT,
    "name": TEXT,
    "arguments": TEXT,
    "id": TEXT,
    "status": ITEM_STATUS,
    "namespace": TEXT,
}
FUNCTION_OUTPUT_FIELDS: dict[str, Check] = {
    "type": TEXT,
    "call_id": TEXT,
    "output": string_or_array(content_part(INPUT_PARTS)),
    "id": nullable(TEXT),
    "status": ITEM_STATUS,
}


def input_item(value: Any, path: str) -> None:
    if not isinstance(value, dict):
        raise _wrong_type(value, path, "an object")
    kind = value.get("type", "message")
    if kind == "message":
        fields_of(value, path, MESSAGE_FIELDS, ("role", "content"))
        parts = ASSISTANT_PARTS if value["role"] == "assistant" else INPUT_PARTS
        string_or_array(content_part(parts))(value["content"], f"{path}.content")
    elif kind == "function_call":
        fields_of(value, path, FUNCTION_CALL_FIELDS, ("call_id", "name", "arguments"))
    elif kind == "function_call_output":
        fields_of(value, path, FUNCTION_OUTPUT_FIELDS, ("call_id", "output"))
    elif isinstance(kind, str):
        raise not_served("message, function_call and function_call_output items", kind)
    else:
        raise _wrong_type(kind, f"{path}.type", "a string")


FUNCTION_TOOL_FIELDS: dict[str, Check] = {
    "type": TEXT,
    "name": TEXT,
    "parameters": nullable(any_object),
    "strict": nullable(boolean),
    "description": nullable(TEXT),
}


def tool(value: Any, path: str) -> None:
    if not isinstance(value, dict):
        raise _wrong_type(value, path, "an object")
    kind = value.get("type")
    if kind != "function":
        if not isinstance(kind, str):
            fields_of(value, path, FUNCTION_TOOL_FIELDS, ("type",))
            raise _wrong_type(kind, f"{path}.type", "a string")
        raise not_served("function tools", kind)
    fields_of(value, path, FUNCTION_TOOL_FIELDS, ("type", "name", "parameters"))


def tool_choice(value: Any, path: str) -> None:
    if isinstance(value, str):
        one_of("none", "auto", "required")(value, path)
        return
    if not isinstance(value, dict):
        raise _wrong_type(value, path, "one of a string or object")
    fields_of(value, path, {"type": one_of("function"), "name": TEXT}, ("type", "name"))


MAX_METADATA_KEYS = 16


def metadata(value: Any, path: str) -> None:
    if not isinstance(value, dict):
        raise _wrong_type(value, path, "an object")
    if len(value) > MAX_METADATA_KEYS:
        raise Refusal(
            f"Invalid '{path}': too many properties. Expected an object with at most "
            f"{MAX_METADATA_KEYS} properties, but got an object with {len(value)} "
            "properties instead.",
            path,
            "object_above_max_properties",
        )
    for key, element in value.items():
        if len(key) > 64:
            raise Refusal(
                f"Invalid '{path}': string too long. Expected a string with maximum length "
                f"64, but got a string with length {len(key)} instead.",
                path,
                "string_above_max_length",
            )
        string(512)(element, f"{path}.{key}")


# The request body's fields (`response_create_params.py`); each checked as declared there.
REQUEST_FIELDS: dict[str, Check] = {
    "model": TEXT,
    "input": string_or_array(input_item),
    "instructions": nullable(TEXT),
    "max_output_tokens": nullable(integer(16)),
    "max_tool_calls": nullable(integer(1)),
    "metadata": nullable(metadata),
    "parallel_tool_calls": nullable(boolean),
    "previous_response_id": nullable(TEXT),
    "store": nullable(boolean),
    "stream": nullable(boolean),
    "stream_options": nullable(object_with({"include_obfuscation": boolean})),
    "temperature": nullable(decimal(0, 2)),
    "top_p": nullable(decimal(0, 1)),
    "top_logprobs": nullable(integer(0, 20)),
    "tools": array_of(tool),
    "tool_choice": tool_choice,
    "text": any_object,
    "reasoning": nullable(any_object),
    "truncation": nullable(one_of("auto", "disabled")),
    "include": nullable(array_of(TEXT)),
    "user": TEXT,
    "safety_identifier": TEXT,
    "prompt_cache_key": TEXT,
    "prompt_cache_retention": nullable(one_of("in_memory", "24h")),
    "service_tier": nullable(one_of("auto", "default", "flex", "scale", "priority")),
    "background": nullable(boolean),
    "conversation": nullable(lambda value, path: None),
    "prompt": nullable(any_object),
    "context_management": nullable(array_of(any_object)),
}


def check_request(body: Any) -> None:
    fields_of(body, "", REQUEST_FIELDS, ("model",))
    if body.get("conversation") is not None:
        raise not_served("conversations the caller sends or previous_response_id", "conversation")


def check_tool_outputs(context: list[Item]) -> None:
    """Every function_call_output answers an earlier function_call; every function_call
    has its output."""
    called: set[str] = set()
    answered: set[str] = set()
    for item in context:
        if item.get("type") == "function_call":
            called.add(item["call_id"])
        elif item.get("type") == "function_call_output":
            if item["call_id"] not in called:
                raise Refusal(
                    f"No tool call found for function call output with call_id {item['call_id']}.",
                    "input",
                    None,
                )
            answered.add(item["call_id"])
    for call_id in called - answered:
        raise Refusal(f"No tool output found for function call {call_id}.", "input", None)


# -- the server -------------------------------------------------------------------------------


def _words(text: str) -> int:
    return len(re.findall(r"\S+", text))


def _item_words(item: Item) -> int:
    kind = item.get("type", "message")
    if kind == "function_call":
        return _words(str(item.get("name"))) + _words(str(item.get("arguments")))
    if kind == "function_call_output":
        output = item.get("output")
        return _words(output if isinstance(output, str) else message_text({"content": output}))
    return _words(message_text(item))


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class ResponsesStandIn(ServedOnThread):
    """The stand-in served on 127.0.0.1 (a free port) from its own thread; `base_url`
    ends in /v1, as the official client's `base_url` does. With `api_key`, requests must
    carry it as `Authorization: Bearer ...` (else 401, as the API answers)."""

    path = "/v1"

    def __init__(self, api_key: str | None = None) -> None:
        self.api_key = api_key
        self._lock = threading.Lock()
        self._rules: dict[str, Rule] = {}
        self._used: dict[str, int] = {}
        self._received: list[Received] = []
        self._sent: list[Body] = []
        # Stored responses by id: the conversation up to and including their output.
        self._stored: dict[str, list[Item]] = {}
        self._server = ThreadedServer(
            self._app, name="responses-stand-in", shutdown_timeout=0.2, handler_cancellation=True
        )

    # -- what tests use (any thread) ------------------------------------------------------

    def script(self, model: str, rule: Rule) -> ResponsesStandIn:
        """Answer requests for `model` by `rule` (replaces an earlier rule)."""
        with self._lock:
            self._rules[model] = rule
            self._used[model] = 0
        return self

    def requests(self, model: str | None = None) -> list[Received]:
        """Every request received (for `model`), in order, refused ones included."""
        with self._lock:
            return [
                r
                for r in self._received
                if model is None or (isinstance(r.body, dict) and r.body.get("model") == model)
            ]

    def bodies(self, model: str | None = None) -> list[Any]:
        return [r.body for r in self.requests(model)]

    def sent(self, model: str | None = None) -> list[Body]:
        """Every response object answered (for `model`; streamed ones as completed)."""
        with self._lock:
            return [r for r in self._sent if model is None or r["model"] == model]

    # -- serving (the server's thread) -----------------------------------------------------

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=32 * 1024 * 1024)
        app.router.add_post("/v1/responses", self._create)
        return app

    async def _create(self, request: web.Request) -> web.StreamResponse:
        headers = dict(request.headers)
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", errors="replace")
        try:
            self._authorize(headers)
            if not isinstance(body, dict):
                raise Refusal(
                    "We could not parse the JSON body of your request. (HINT: This likely "
                    "means you aren't using your HTTP library correctly. The OpenAI API "
                    "expects a JSON payload, but what was sent was not valid JSON.)",
                    None,
                    None,
                )
        except Refusal as refused:
            with self._lock:
                self._received.append(Received(body, headers, []))
            return web.json_response(refused.body, status=refused.status)
        try:
            received = self._receive(body, headers)
            answer = self._answer(received)
            if answer.delay:
                await asyncio.sleep(answer.delay)
            if answer.failure is not None and not body.get("stream"):
                raise Refusal(answer.failure, None, None, status=500, kind="server_error")
            response, output = self._respond(received, answer)
            if answer.failure is not None:
                error = {"code": "server_error", "message": answer.failure}
                response.update(status="failed", error=error, output=[], usage=None)
                output = []
        except Refusal as refused:
            return web.json_response(refused.body, status=refused.status)
        if not body.get("stream"):
            return web.json_response(response)
        return await self._stream(request, response, output, answer.cut_after)

    def _authorize(self, headers: dict[str, str]) -> None:
        if self.api_key is None:
            return
        given = headers.get("Authorization", "")
        if not given.startswith("Bearer "):
            raise Refusal(
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                None,
                None,
                status=401,
            )
        if given.removeprefix("Bearer ") != self.api_key:
            raise Refusal("Incorrect API key provided.", None, "invalid_api_key", status=401)

    def _receive(self, body: Body, headers: dict[str, str]) -> Received:
        """Check the request and make its conversation; it is recorded either way."""
        context: list[Item] = []
        try:
            check_request(body)
            previous = body.get("previous_response_id")
            if previous is not None:
                with self._lock:
                    stored = self._stored.get(previous)
                if stored is None:
                    raise Refusal(
                        f"Previous response with id '{previous}' not found.",
                        "previous_response_id",
                        "previous_response_not_found",
                    )
                context.extend(stored)
            given = body.get("input")
            if isinstance(given, str):
                context.append({"type": "message", "role": "user", "content": given})
            elif isinstance(given, list):
                context.extend({"type": "message", **item} for item in given)
            check_tool_outputs(context)
        finally:
            with self._lock:
                self._received.append(Received(body, headers, context))
        with self._lock:
            return self._received[-1]

    def _answer(self, received: Received) -> Answer:
        model = received.body["model"]
        with self._lock:
            rule = self._rules.get(model)
            index = self._used.get(model, 0)
            self._used[model] = index + 1
        if rule is None:
            raise Refusal(
                f"The model `{model}` does not exist or you do not have access to it.",
                None,
                "model_not_found",
                status=404,
            )
        if callable(rule):
            answer = rule(received)
        elif index < len(rule):
            answer = rule[index]
        else:
            raise Refusal(
                f"the script of model {model!r} has no answer left (request {index + 1})",
                None,
                None,
                status=500,
                kind="server_error",
            )
        answer = say(answer) if isinstance(answer, str) else answer
        offered = [
            t.get("name") for t in received.body.get("tools") or [] if t.get("type") == "function"
        ]
        for call in answer.calls:
            if call.name not in offered or received.body.get("tool_choice") == "none":
                raise Refusal(
                    f"the script of model {model!r} calls {call.name!r}, which the request "
                    f"does not offer (tools: {offered}, tool_choice: "
                    f"{received.body.get('tool_choice', 'auto')!r})",
                    None,
                    None,
                    status=500,
                    kind="server_error",
                )
        return answer

    def _respond(self, received: Received, answer: Answer) -> tuple[Body, list[Item]]:
        body = received.body
        output: list[Item] = []
        text = answer.text
        if text is not None and answer.incomplete is not None:
            words = text.split(" ")
            keep = body.get("max_output_tokens") or max(1, len(words) // 2)
            text = " ".join(words[:keep])
        status = "completed" if answer.incomplete is None else "incomplete"
        if text is not None:
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            output.append(
                {
                    "id": _new_id("msg"),
                    "type": "message",
                    "status": status,
                    "role": "assistant",
                    "content": [part],
                }
            )
        for call in answer.calls:
            arguments = call.arguments
            output.append(
                {
                    "id": _new_id("fc"),
                    "type": "function_call",
                    "status": "completed",
                    "call_id": call.call_id or _new_id("call"),
                    "name": call.name,
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                }
            )
        instructions = body.get("instructions") or ""
        input_tokens = _words(instructions) + sum(_item_words(i) for i in received.context)
        output_tokens = sum(_item_words(i) for i in output)
        response_id = _new_id("resp")
        response = self._response_object(response_id, body, output, status, answer.incomplete)
        response["usage"] = {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        }
        with self._lock:
            self._sent.append(response)
            if body.get("store") is not False:
                self._stored[response_id] = [*received.context, *output]
        return response, output

    @staticmethod
    def _response_object(
        response_id: str, body: Body, output: list[Item], status: str, reason: str | None
    ) -> Body:
        tools = [{"strict": True, "description": None, **t} for t in body.get("tools") or []]
        return {
            "id": response_id,
            "object": "response",
            "created_at": int(time.time()),
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": {"reason": reason} if reason else None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": body.get("max_tool_calls"),
            "model": body["model"],
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
            "store": body.get("store") is not False,
            "temperature": body.get("temperature", 1.0),
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": body.get("tool_choice") or "auto",
            "tools": tools,
            "top_logprobs": 0,
            "top_p": body.get("top_p", 1.0),
            "truncation": "disabled",
            "usage": None,
            "user": None,
            "metadata": body.get("metadata") or {},
        }

    async def _stream(
        self, request: web.Request, response: Body, output: list[Item], cut_after: int | None
    ) -> web.StreamResponse:
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        for number, event in enumerate(stream_events(response, output)):
            if number == cut_after:
                # The chunked body never gets its last chunk: the client sees it break.
                assert request.transport is not None
                request.transport.close()
                return stream
            data = json.dumps(event)
            await stream.write(f"event: {event['type']}\ndata: {data}\n\n".encode())
        await stream.write_eof()
        return stream


def _pieces(text: str, size: int) -> list[str]:
    """`text` in pieces of about `size` characters (at least one piece)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def stream_events(response: Body, output: list[Item]) -> Iterator[Body]:
    """The events of a streamed response, in the API's order, numbered."""
    numbers = itertools.count()
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    yield {"type": "response.created", "sequence_number": next(numbers), "response": started}
    yield {"type": "response.in_progress", "sequence_number": next(numbers), "response": started}
    for index, item in enumerate(output):
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            opened = {**item, "status": "in_progress", "content": []}
            yield {
                "type": "response.output_item.added",
                "sequence_number": next(numbers),
                "output_index": index,
                "item": opened,
            }
            part = item["content"][0]
            empty = {**part, "text": ""}
            yield {
                "type": "response.content_part.added",
                "sequence_number": next(numbers),
                **where,
                "content_index": 0,
                "part": empty,
            }
            for delta in _pieces(part["text"], 4):
                yield {
                    "type": "response.output_text.delta",
                    "sequence_number": next(numbers),
                    **where,
                    "content_index": 0,
                    "delta": delta,
                    "logprobs": [],
                }
            yield {
                "type": "response.output_text.done",
                "sequence_number": next(numbers),
                **where,
                "content_index": 0,
                "text": part["text"],
                "logprobs": [],
            }
            yield {
                "type": "response.content_part.done",
                "sequence_number": next(numbers),
                **where,
                "content_index": 0,
                "part": part,
            }
        else:
            opened = {**item, "status": "in_progress", "arguments": ""}
            yield {
                "type": "response.output_item.added",
                "sequence_number": next(numbers),
                "output_index": index,
                "item": opened,
            }
            for delta in _pieces(item["arguments"], 5):
                yield {
                    "type": "response.function_call_arguments.delta",
                    "sequence_number": next(numbers),
                    **where,
                    "delta": delta,
                }
            yield {
                "type": "response.function_call_arguments.done",
                "sequence_number": next(numbers),
                **where,
                "name": item["name"],
                "arguments": item["arguments"],
            }
        yield {
            "type": "response.output_item.done",
            "sequence_number": next(numbers),
            "output_index": index,
            "item": item,
        }
    ended = {"completed": "response.completed", "failed": "response.failed"}.get(
        response["status"], "response.incomplete"
    )
    yield {"type": ended, "sequence_number": next(numbers), "response": response}
