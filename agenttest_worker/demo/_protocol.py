"""Reading Chat Completions requests and building chat.completion bodies for the demo agents.

Everything here is deterministic: the response id is a hash of the request, `created` is
0 and token usage is a word count, so two identical requests get byte-identical answers.
A request's `max_completion_tokens` (or the older `max_tokens`) cuts a longer reply to
that many words with finish_reason "length", as a model that runs out of tokens does.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

JSONObject = dict[str, Any]


def messages_of(request: Mapping[str, Any]) -> list[JSONObject]:
    """The request's messages, keeping only objects (the server rejects anything else)."""
    messages = request.get("messages")
    if not isinstance(messages, list):
        return []
    return [m for m in messages if isinstance(m, dict)]


# How the built-in role prompts carry the metadata (agents/roles.py): one line of JSON.
_PROMPT_METADATA = re.compile(r"^Test metadata: (\{.*\})$", re.M)


def metadata_of(request: Mapping[str, Any]) -> JSONObject:
    """The request's `metadata` object; else, as a chat model behind a hosted API reads
    it, the metadata a role prompt (a system message) carries; else {}."""
    metadata = request.get("metadata")
    if isinstance(metadata, dict):
        return metadata
    for message in messages_of(request):
        content = message.get("content")
        if message.get("role") != "system" or not isinstance(content, str):
            continue
        found = _PROMPT_METADATA.search(content)
        if found:
            try:
                parsed = json.loads(found.group(1))
            except ValueError:
                continue
            if isinstance(parsed, dict):
                return parsed
    return {}


def _content_parts(message: Mapping[str, Any]) -> list[JSONObject]:
    content = message.get("content")
    if isinstance(content, list):
        return [part for part in content if isinstance(part, dict)]
    return []


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a message whose content is a string, a list of content parts or null.

    Text parts are joined with a space so that phrases split across parts still read as
    one sentence; image parts contribute nothing.
    """
    content = message.get("content")
    if isinstance(content, str):
        return content
    texts = [
        part["text"]
        for part in _content_parts(message)
        if part.get("type") == "text" and isinstance(part.get("text"), str)
    ]
    return " ".join(texts)


def image_urls(message: Mapping[str, Any]) -> list[str]:
    """The URLs of the message's `image_url` content parts, in order."""
    urls: list[str] = []
    for part in _content_parts(message):
        image = part.get("image_url")
        if part.get("type") != "image_url":
            continue
        # The protocol nests the URL ({"url": ...}); a bare string is accepted too.
        url = image.get("url") if isinstance(image, dict) else image
        if isinstance(url, str):
            urls.append(url)
    return urls


def data_url_size(url: str) -> int:
    """Decoded byte length of a `data:` URL; 0 for other URLs or an undecodable payload."""
    if not url.startswith("data:") or "," not in url:
        return 0
    header, payload = url[len("data:") :].split(",", 1)
    if header.endswith(";base64"):
        try:
            return len(base64.b64decode(payload, validate=False))
        except (binascii.Error, ValueError):
            return 0
    return len(urllib.parse.unquote_to_bytes(payload))


def last_with_role(messages: Sequence[JSONObject], role: str) -> JSONObject | None:
    """The last message with `role`, or None."""
    return next((m for m in reversed(messages) if m.get("role") == role), None)


def tool_calls_of(message: Mapping[str, Any]) -> list[JSONObject]:
    """The message's tool calls (assistant messages), keeping only objects."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [c for c in calls if isinstance(c, dict)]


def is_true(value: Any) -> bool:
    """A metadata flag: true as a JSON boolean or as a string.

    Agents registered with `metadata: strings` receive every value JSON-encoded, so
    `true` arrives as "true"; both must switch the flag on.
    """
    if isinstance(value, bool):
        return value
    return isinstance(value, str) and value.strip().lower() in ("true", "1", "yes")


def word_count(text: str | None) -> int:
    """The demo's token count: whitespace-separated words."""
    return len(text.split()) if text else 0


def tool_call(call_id: str, name: str, arguments: Mapping[str, Any]) -> JSONObject:
    """A Chat Completions tool call; arguments are a JSON string, as the protocol says."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(dict(arguments))},
    }


def _completion_id(request: Mapping[str, Any]) -> str:
    # A hash rather than a counter keeps `respond` pure and the id stable across restarts.
    canonical = json.dumps(request, sort_keys=True, default=str, ensure_ascii=False)
    return "chatcmpl-demo-" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:12]


def _usage(request: Mapping[str, Any], content: str | None, calls: list[JSONObject]) -> JSONObject:
    prompt = sum(word_count(message_text(m)) for m in messages_of(request))
    completion = word_count(content) + sum(
        word_count(str(call.get("function", {}).get("arguments", ""))) for call in calls
    )
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _token_limit(request: Mapping[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = request.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def completion(
    model: str,
    request: Mapping[str, Any],
    content: str | None,
    *,
    tool_calls: list[JSONObject] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> JSONObject:
    """A full chat.completion body; `extra` adds top-level fields (e.g. `state`)."""
    calls = tool_calls or []
    finish_reason = "tool_calls" if calls else "stop"
    limit = _token_limit(request)
    if content is not None and limit is not None and word_count(content) > limit:
        content = " ".join(content.split()[:limit])
        finish_reason = "length"
    message: JSONObject = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    body: JSONObject = {
        "id": _completion_id(request),
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason,
            }
        ],
        "usage": _usage(request, content, calls),
    }
    if extra:
        body.update(extra)
    return body
