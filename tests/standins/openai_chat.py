"""A strict stand-in for OpenAI's Chat Completions API (POST /v1/chat/completions).

Written from the API reference (the OpenAPI document, as the official client's
`completion_create_params` mirrors it; the checks are in tests/standins/chat_request.py).
It refuses what the API refuses, in the API's own error shape, HTTP 400 `{"error":
{"message", "type": "invalid_request_error", "param", "code"}}`:

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
from typing import Any

from aiohttp import web

from standins.chat_request import check_chat_request, openai_error
from standins.scripting import (
    Answer,
    Received,
    Refusal,
    ScriptedStandIn,
    count_tokens,
    sse,
    text_tokens,
    write_events,
)


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
