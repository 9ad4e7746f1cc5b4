"""A strict stand-in for OpenAI's Chat Completions API (POST /v1/chat/completions).

Written from the API reference (the OpenAPI document, as the official client's
`completion_create_params` mirrors it). It refuses what the API refuses, in the API's own
error shape, HTTP 400 `{"error": {"message", "type": "invalid_request_error", "param",
"code"}}`:

- a field the reference does not define ("Unrecognized request argument supplied: x");
- a field of the wrong type ("Invalid type for 'seed': expected an integer, but got a
  string instead.", code `invalid_type`), a missing `model` or `messages`, a temperature
  or top_p out of range;
- `metadata` without `store: true`, `stream_options` without `stream: true`,
  `tool_choice` or `parallel_tool_calls` without `tools`, JSON mode (`response_format`
  `json_object`) on messages that never say "json";
- messages that break the reference: an unknown role or key, content of the wrong type,
  a `tool` message that answers no preceding `tool_calls`, an assistant's `tool_calls`
  not all answered by the `tool` messages that follow, tools that are not function tools.

A missing or wrong `Authorization: Bearer` key (when the stand-in has one) is a 401. What
it accepts it answers from the script (tests/standins/scripting.py): a `chat.completion`,
or with `stream: true` `chat.completion.chunk` events ending in `data: [DONE]`, the usage
chunk (empty `choices`) only when `stream_options.include_usage` asks for it. A scripted
tool call to a tool the request does not declare is answered with a 500: a real model
can only call the tools it was given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from aiohttp import web

from standins.scripting import (
    Answer,
    Received,
    Refusal,
    ScriptedStandIn,
    count_tokens,
    json_type,
    sse,
    text_tokens,
    write_events,
)

Check = Callable[[Any], bool]


def _decimal(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


KINDS: dict[str, Check] = {
    "decimal": _decimal,
    "integer": _integer,
    "boolean": lambda v: isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}

# The request body's fields: (the JSON types each takes, whether null is allowed).
CHAT_FIELDS: dict[str, tuple[tuple[str, ...], bool]] = {
    "messages": (("array",), False),
    "model": (("string",), False),
    "audio": (("object",), True),
    "frequency_penalty": (("decimal",), True),
    "function_call": (("string", "object"), False),
    "functions": (("array",), False),
    "logit_bias": (("object",), True),
    "logprobs": (("boolean",), True),
    "max_completion_tokens": (("integer",), True),
    "max_tokens": (("integer",), True),
    "metadata": (("object",), True),
    "modalities": (("array",), True),
    "moderation": (("object",), True),
    "n": (("integer",), True),
    "parallel_tool_calls": (("boolean",), False),
    "prediction": (("object",), True),
    "presence_penalty": (("decimal",), True),
    "prompt_cache_key": (("string",), True),
    "prompt_cache_options": (("object",), False),
    "prompt_cache_retention": (("string",), True),
    "reasoning_effort": (("string",), True),
    "response_format": (("object",), False),
    "safety_identifier": (("string",), True),
    "seed": (("integer",), True),
    "service_tier": (("string",), True),
    "stop": (("string", "array"), True),
    "store": (("boolean",), True),
    "stream": (("boolean",), True),
    "stream_options": (("object",), True),
    "temperature": (("decimal",), True),
    "tool_choice": (("string", "object"), False),
    "tools": (("array",), False),
    "top_logprobs": (("integer",), True),
    "top_p": (("decimal",), True),
    "user": (("string",), False),
    "verbosity": (("string",), True),
    "web_search_options": (("object",), False),
}
RANGES = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0)}
ROLES = ("system", "assistant", "user", "function", "tool", "developer")
MESSAGE_KEYS = {
    "system": {"role", "content", "name"},
    "developer": {"role", "content", "name"},
    "user": {"role", "content", "name"},
    "assistant": {"role", "content", "name", "refusal", "tool_calls", "function_call", "audio"},
    "tool": {"role", "content", "tool_call_id"},
    "function": {"role", "content", "name"},
}
PART_TYPES = {
    "system": {"text"},
    "developer": {"text"},
    "user": {"text", "image_url", "input_audio", "file"},
    "assistant": {"text", "refusal"},
    "tool": {"text"},
}
STREAM_OPTION_KEYS = {"include_usage", "include_obfuscation"}
MAX_METADATA_KEYS = 16


def openai_error(
    message: str, param: str | None = None, code: str | None = None, status: int = 400
) -> Refusal:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return Refusal(status, {"error": error})


def _a(kind: str) -> str:
    return ("an " if kind[0] in "aeiou" else "a ") + kind


def _wrong_type(param: str, kinds: tuple[str, ...], value: Any) -> Refusal:
    expected = _a(kinds[0]) if len(kinds) == 1 else "one of " + " or ".join(_a(k) for k in kinds)
    return openai_error(
        f"Invalid type for '{param}': expected {expected}, but got {_a(json_type(value))} instead.",
        param,
        "invalid_type",
    )


def _typed(param: str, value: Any, kinds: tuple[str, ...], nullable: bool = False) -> None:
    if value is None and nullable:
        return
    if not any(KINDS[k](value) for k in kinds):
        raise _wrong_type(param, kinds, value)


def _only_keys(where: str, value: dict[str, Any], allowed: set[str]) -> None:
    for key in value:
        if key not in allowed:
            raise openai_error(
                f"Unknown parameter: '{where}.{key}'.", f"{where}.{key}", "unknown_parameter"
            )


def _required(where: str, value: dict[str, Any], key: str) -> Any:
    if key not in value:
        param = f"{where}.{key}" if where else key
        raise openai_error(
            f"Missing required parameter: '{param}'.", param, "missing_required_parameter"
        )
    return value[key]


def check_chat_request(body: Any, *, model_required: bool = True) -> dict[str, Any]:
    """The body, when the Chat Completions API would accept it; else the API's refusal."""
    if not isinstance(body, dict):
        raise openai_error(
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload.)"
        )
    for key in body:
        if key not in CHAT_FIELDS:
            raise openai_error(f"Unrecognized request argument supplied: {key}")
    if model_required and "model" not in body:
        raise openai_error("you must provide a model parameter")
    _required("", body, "messages")
    for key, value in body.items():
        kinds, nullable = CHAT_FIELDS[key]
        _typed(key, value, kinds, nullable)
        if key in RANGES and value is not None:
            low, high = RANGES[key]
            if value > high:
                raise openai_error(
                    f"Invalid '{key}': decimal above maximum value. Expected a value <= "
                    f"{high:g}, but got {value} instead.",
                    key,
                    "decimal_above_max_value",
                )
            if value < low:
                raise openai_error(
                    f"Invalid '{key}': decimal below minimum value. Expected a value >= "
                    f"{low:g}, but got {value} instead.",
                    key,
                    "decimal_below_min_value",
                )
    _check_messages(body["messages"])
    _check_tools(body.get("tools"))
    response_format = body.get("response_format") or {}
    if response_format.get("type") == "json_object" and "json" not in (
        json.dumps(body["messages"]).lower()
    ):
        raise openai_error(
            "'messages' must contain the word 'json' in some form, to use 'response_format' "
            "of type 'json_object'.",
            "messages",
        )
    for key in ("tool_choice", "parallel_tool_calls"):
        if key in body and not body.get("tools"):
            raise openai_error(
                f"Invalid value for '{key}': '{key}' is only allowed when 'tools' are specified.",
                key,
            )
    if body.get("metadata") is not None:
        _check_metadata(body["metadata"], body.get("store"))
    if body.get("stream_options") is not None:
        if body.get("stream") is not True:
            raise openai_error(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                "stream_options",
            )
        _only_keys("stream_options", body["stream_options"], STREAM_OPTION_KEYS)
        for key, value in body["stream_options"].items():
            _typed(f"stream_options.{key}", value, ("boolean",))
    return body


def _check_metadata(metadata: dict[str, Any], store: Any) -> None:
    if store is not True:
        raise openai_error(
            "The 'metadata' parameter is only allowed when 'store' is enabled.", "metadata"
        )
    if len(metadata) > MAX_METADATA_KEYS:
        raise openai_error(
            f"Invalid 'metadata': too many properties. Expected an object with at most "
            f"{MAX_METADATA_KEYS} properties, but got an object with {len(metadata)} "
            "properties instead.",
            "metadata",
            "object_above_max_properties",
        )
    for key, value in metadata.items():
        _typed(f"metadata.{key}", value, ("string",))


def _check_content(where: str, role: str, content: Any) -> None:
    _typed(f"{where}.content", content, ("string", "array"))
    if isinstance(content, list):
        for n, part in enumerate(content):
            at = f"{where}.content[{n}]"
            _typed(at, part, ("object",))
            kind = _required(at, part, "type")
            if kind not in PART_TYPES[role]:
                raise openai_error(
                    f"Invalid value: '{kind}'. Supported values are: "
                    + ", ".join(f"'{t}'" for t in sorted(PART_TYPES[role]))
                    + ".",
                    f"{at}.type",
                    "invalid_value",
                )
            if kind == "text":
                _typed(f"{at}.text", _required(at, part, "text"), ("string",))


def _check_messages(messages: list[Any]) -> None:
    if not messages:
        raise openai_error(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but "
            "got an empty array instead.",
            "messages",
            "empty_array",
        )
    unanswered: list[str] = []
    for n, message in enumerate(messages):
        where = f"messages[{n}]"
        _typed(where, message, ("object",))
        role = _required(where, message, "role")
        if role not in ROLES:
            raise openai_error(
                f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', "
                "'user', 'function', 'tool', and 'developer'.",
                f"{where}.role",
                "invalid_value",
            )
        _only_keys(where, message, MESSAGE_KEYS[role])
        if role == "tool":
            call_id = _required(where, message, "tool_call_id")
            _typed(f"{where}.tool_call_id", call_id, ("string",))
            if call_id not in unanswered:
                raise openai_error(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    f"messages.[{n}].role",
                )
            unanswered.remove(call_id)
            _check_content(where, role, _required(where, message, "content"))
            continue
        if unanswered:
            raise _unanswered(n - 1, unanswered)
        if role == "assistant":
            calls = message.get("tool_calls")
            if message.get("content") is not None or not (calls or message.get("function_call")):
                _check_content(where, role, message.get("content"))
            if calls is not None:
                unanswered = _check_calls(where, calls)
        elif role != "function":
            _check_content(where, role, _required(where, message, "content"))
    if unanswered:
        raise _unanswered(len(messages) - 1, unanswered)


def _unanswered(n: int, ids: list[str]) -> Refusal:
    return openai_error(
        "An assistant message with 'tool_calls' must be followed by tool messages responding "
        "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
        + ", ".join(ids),
        f"messages.[{n}].role",
    )


def _check_calls(where: str, calls: Any) -> list[str]:
    _typed(f"{where}.tool_calls", calls, ("array",))
    ids = []
    for n, call in enumerate(calls):
        at = f"{where}.tool_calls[{n}]"
        _typed(at, call, ("object",))
        _only_keys(at, call, {"id", "type", "function"})
        ids.append(_required(at, call, "id"))
        _typed(f"{at}.id", ids[-1], ("string",))
        if _required(at, call, "type") != "function":
            raise openai_error(
                f"Invalid value: '{call['type']}'. Supported values are: 'function'.",
                f"{at}.type",
                "invalid_value",
            )
        function = _required(at, call, "function")
        _typed(f"{at}.function", function, ("object",))
        _only_keys(f"{at}.function", function, {"name", "arguments"})
        _typed(f"{at}.function.name", _required(f"{at}.function", function, "name"), ("string",))
        arguments = _required(f"{at}.function", function, "arguments")
        _typed(f"{at}.function.arguments", arguments, ("string",))
    return ids


def _check_tools(tools: list[Any] | None) -> None:
    for n, tool in enumerate(tools or []):
        at = f"tools[{n}]"
        _typed(at, tool, ("object",))
        _only_keys(at, tool, {"type", "function"})
        if _required(at, tool, "type") != "function":
            raise openai_error(
                f"Invalid value: '{tool['type']}'. Supported values are: 'function' and 'custom'.",
                f"{at}.type",
                "invalid_value",
            )
        function = _required(at, tool, "function")
        _typed(f"{at}.function", function, ("object",))
        _only_keys(f"{at}.function", function, {"name", "description", "parameters", "strict"})
        name = _required(f"{at}.function", function, "name")
        _typed(f"{at}.function.name", name, ("string",))
        if not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name):
            raise openai_error(
                f"Invalid '{at}.function.name': string does not match pattern. Expected a "
                f"string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
                f"{at}.function.name",
                "invalid_value",
            )
        if "parameters" in function:
            _typed(f"{at}.function.parameters", function["parameters"], ("object",))


def declared_tools(body: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in body.get("tools") or []}


class ChatCompletions:
    """The replies of the Chat Completions API for an accepted request and its answer."""

    def __init__(self, model: str, body: dict[str, Any], answer: Answer, serial: int) -> None:
        undeclared = [c.name for c in answer.tool_calls if c.name not in declared_tools(body)]
        if undeclared:
            raise Refusal(
                500,
                {
                    "error": {
                        "message": f"stand-in: scripted a call to {undeclared[0]!r}, "
                        "a tool the request does not declare"
                    }
                },
            )
        self.model = model
        self.body = body
        self.answer = answer
        self.id = f"chatcmpl-standin{serial}"
        self.calls = [
            {
                "id": f"call_standin{serial}_{n}",
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments))},
            }
            for n, c in enumerate(answer.tool_calls)
        ]
        self.finish_reason = "tool_calls" if self.calls else "stop"
        prompt = text_tokens(body["messages"])
        completion = count_tokens(answer.text or "") + sum(
            count_tokens(c["function"]["arguments"]) for c in self.calls
        )
        self.usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def _head(self, kind: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": 1_700_000_000,
            "model": self.model,
            "service_tier": "default",
            "system_fingerprint": "fp_standin",
        }

    def whole(self) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": self.answer.text,
            "refusal": None,
            "annotations": [],
        }
        if self.calls:
            message["tool_calls"] = self.calls
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": self.finish_reason,
        }
        return {**self._head("chat.completion"), "choices": [choice], "usage": self.usage}

    def events(self) -> list[bytes]:
        with_usage = (self.body.get("stream_options") or {}).get("include_usage") is True

        def chunk(choices: list[dict[str, Any]], usage: Any = None) -> bytes:
            data = {**self._head("chat.completion.chunk"), "choices": choices}
            if with_usage:
                data["usage"] = usage
            return sse(data)

        def delta(piece: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": piece, "logprobs": None, "finish_reason": finish}
            return chunk([choice])

        out = [delta({"role": "assistant", "content": "", "refusal": None})]
        words = re.findall(r"\S+\s*|\s+", self.answer.text or "")
        out += [delta({"content": word}) for word in words]
        for n, call in enumerate(self.calls):
            first = {
                "index": n,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""},
            }
            out.append(delta({"tool_calls": [first]}))
            arguments = call["function"]["arguments"]
            for at in range(0, len(arguments), 8):
                piece = {"index": n, "function": {"arguments": arguments[at : at + 8]}}
                out.append(delta({"tool_calls": [piece]}))
        out.append(delta({}, self.finish_reason))
        if with_usage:
            out.append(chunk([], self.usage))
        out.append(sse("[DONE]"))
        return out


class OpenAIChatStandIn(ScriptedStandIn):
    """POST /v1/chat/completions, strictly. `api_key`: the key the stand-in expects as
    `Authorization: Bearer` (None: any or none)."""

    name = "openai-standin"
    path = "/v1"

    def __init__(self, api_key: str | None = None) -> None:
        super().__init__()
        self.api_key = api_key
        self._serial = 0

    def routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/{tail:.*}", self._handle)

    def check_auth(self, received: Received) -> None:
        if self.api_key is None:
            return
        given = received.headers.get("Authorization", "")
        if not given.startswith("Bearer "):
            raise openai_error(
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                status=401,
            )
        if given.removeprefix("Bearer ") != self.api_key:
            raise openai_error("Incorrect API key provided.", code="invalid_api_key", status=401)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        received, raw = await self.record(request)
        try:
            self.check_auth(received)
            if request.method != "POST" or request.path != "/v1/chat/completions":
                raise openai_error(f"Invalid URL ({request.method} {request.path})", status=404)
            return await self.complete(request, raw, model_required=True)
        except Refusal as refusal:
            return self.refused(received, refusal)

    async def complete(
        self, request: web.Request, raw: bytes, *, model_required: bool, model: str | None = None
    ) -> web.StreamResponse:
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        check_chat_request(body, model_required=model_required)
        name = model or body["model"]
        with self._lock:
            self._serial += 1
            serial = self._serial
        reply = ChatCompletions(name, body, self.answer(name, body), serial)
        if body.get("stream"):
            return await write_events(request, reply.events())
        return web.json_response(reply.whole())
