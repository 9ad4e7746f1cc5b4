"""The benchmarks' agent, served over https: a Chat Completions agent answering every
request after a fixed delay, or (`--forward URL`) passing each one on to another agent.

    python -m benchmarks.fixed_agent --certfile cert.pem --keyfile key.pem --latency-ms 50
    python -m benchmarks.fixed_agent --certfile cert.pem --keyfile key.pem \
        --forward http://127.0.0.1:PORT/v1
    python -m benchmarks.fixed_agent --certfile cert.pem --keyfile key.pem \
        --latency-ms 500 --requests-per-second 40

Prints its base URL (https://127.0.0.1:PORT/v1) on the first line, then serves until
killed. It counts the calls it gets: GET /v1/calls answers {"calls": N, "answered":
{MODEL: N}}, the second counting by the request's model the calls answered 2xx (a
forwarded call's fault, a 429 or 503, is a call but not an answer), and "refused": the
429s it answered itself ("refused_at": when, in seconds from its first
call). With `--requests-per-second R` it is a provider with a rate
limit, as OpenAI's API is one: a token bucket of R requests a second holding one
second's worth (full at the start); every reply says what remains and when the bucket
is full again in OpenAI's headers (`x-ratelimit-remaining-requests`,
`x-ratelimit-reset-requests`), and a request beyond it gets OpenAI's 429 with
`retry-after` and `retry-after-ms` (when the next request is allowed). Runs in its own
process so that its CPU is not counted as the runner's; benchmarks/common.py starts it
with a certificate of its own (`fixed_agent`, `forwarding_agent`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import resource
import socket
import ssl
import time
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web


def reply(chars: int = 0) -> bytes:
    """The one answer: "Noted, thank you.", padded with words to `chars` characters (a
    longer reply makes a longer conversation history, as real agents' do)."""
    content = "Noted, thank you."
    if chars > len(content):
        content = (content + " " + "lorem ipsum dolor sit amet " * (chars // 27 + 1))[:chars]
    return completion(content, {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13})


def completion(content: str, usage: dict[str, int]) -> bytes:
    """A Chat Completions body answering `content`, with `usage`."""
    return json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": "bench",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": usage,
        }
    ).encode()


class Bucket:
    """A provider's limit of `per_second` requests a second: a token bucket holding one
    second's worth, full at the start."""

    def __init__(self, per_second: float) -> None:
        self.per_second = per_second
        self.tokens = per_second
        self.stamp = time.monotonic()

    def take(self) -> tuple[bool, dict[str, str]]:
        """Whether a request arriving now is allowed, and the headers of its reply."""
        now = time.monotonic()
        rate = self.per_second
        self.tokens = min(rate, self.tokens + (now - self.stamp) * rate)
        self.stamp = now
        allowed = self.tokens >= 1
        if allowed:
            self.tokens -= 1
        headers = {
            "x-ratelimit-limit-requests": f"{rate:g}",
            "x-ratelimit-remaining-requests": str(math.floor(self.tokens)),
            "x-ratelimit-reset-requests": go_duration((rate - self.tokens) / rate),
        }
        if not allowed:
            next_in = (1 - self.tokens) / rate
            headers["retry-after"] = str(math.ceil(next_in))
            headers["retry-after-ms"] = str(math.ceil(next_in * 1000))
        return allowed, headers


def go_duration(seconds: float) -> str:
    """A duration as OpenAI's reset headers write it (Go's): 20ms, 1.5s, 6m0s."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:.3f}s" if minutes else f"{rest:.3f}s"


# OpenAI's 429 body for a request limit.
REFUSED = json.dumps(
    {
        "error": {
            "message": "Rate limit reached for requests",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
).encode()


def make_app(
    latency: float,
    reply_chars: int = 0,
    forward: str | None = None,
    per_second: float | None = None,
) -> web.Application:
    body = reply(reply_chars)
    calls = refused = 0
    answered: Counter[str] = Counter()
    # When each call came and, of those refused, when: seconds since the first call.
    first: list[float] = []
    refused_at: list[float] = []
    bucket = Bucket(per_second) if per_second else None
    app = web.Application()

    async def complete(request: web.Request) -> web.Response:
        nonlocal calls, refused
        calls += 1
        if not first:
            first.append(time.monotonic())
        raw = await request.read()
        model = str(json.loads(raw).get("model")) if raw else ""
        if forward is None:
            allowed, headers = bucket.take() if bucket is not None else (True, {})
            if not allowed:
                refused += 1
                refused_at.append(round(time.monotonic() - first[0], 3))
                return web.Response(
                    body=REFUSED, status=429, content_type="application/json", headers=headers
                )
            await asyncio.sleep(latency)
            answered[model] += 1
            return web.Response(body=body, content_type="application/json", headers=headers)
        session: aiohttp.ClientSession = app["session"]
        async with session.post(
            forward + "/chat/completions", data=raw, headers={"Content-Type": "application/json"}
        ) as upstream:
            text = await upstream.read()
            if upstream.status < 300:
                answered[model] += 1
            # Retry-After tells the caller when to call again after a 429: pass it on.
            headers = {k: v for k, v in upstream.headers.items() if k.lower() == "retry-after"}
            return web.Response(
                body=text,
                status=upstream.status,
                content_type=upstream.content_type,
                headers=headers,
            )

    async def counted(request: web.Request) -> web.Response:
        counts = {"calls": calls, "answered": answered, "refused": refused}
        return web.json_response({**counts, "refused_at": refused_at})

    async def upstream_session(app: web.Application) -> AsyncIterator[None]:
        app["session"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        yield
        await app["session"].close()

    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_get("/v1/calls", counted)
    if forward is not None:
        app.cleanup_ctx.append(upstream_session)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--reply-chars", type=int, default=0, help="pad each reply to this")
    parser.add_argument("--forward", help="pass every call on to this agent's base URL")
    parser.add_argument(
        "--requests-per-second", type=float, help="a rate limit: 429 beyond this many a second"
    )
    parser.add_argument("--certfile", required=True)
    parser.add_argument("--keyfile", required=True)
    args = parser.parse_args()
    # Tens of thousands of connections at once (in_flight.py's -c 10000).
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(args.certfile, args.keyfile)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    port = sock.getsockname()[1]
    print(f"https://127.0.0.1:{port}/v1", flush=True)
    web.run_app(
        make_app(args.latency_ms / 1000, args.reply_chars, args.forward, args.requests_per_second),
        sock=sock,
        ssl_context=tls,
        print=None,
        access_log=None,
        backlog=4096,
    )


if __name__ == "__main__":
    main()
