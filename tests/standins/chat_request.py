"""What OpenAI's Chat Completions API refuses in a request body, and how it says so.

Written from the API reference (the OpenAPI document, as the official client's
`completion_create_params` mirrors it): the fields it defines with their types, the
messages' roles, keys and content, the order of tool calls and their results, and the
fields allowed only with others. Each refusal is the API's error body, `{"error":
{"message", "type": "invalid_request_error", "param", "code"}}`, with its status.
tests/standins/openai_chat.py and tests/standins/azure_openai.py check with it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from standins.scripting import Refusal, json_type

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
