"""The benchmarks' agent, served over https: a Chat Completions agent answering every
request after a fixed delay, or (`--forward URL`) passing each one on to another agent.

    python -m benchmarks.fixed_agent --certfile cert.pem --keyfile key.pem --latency-ms 50
    python -m benchmarks.fixed_agent --certfile cert.pem --keyfile key.pem \
        --forward http://127.0.0.1:PORT/v1

Prints its base URL (https://127.0.0.1:PORT/v1) on the first line, then serves until
killed. It counts the calls it gets: GET /v1/calls answers {"calls": N, "answered":
{MODEL: N}}, the second counting by the request's model the calls answered 2xx (a
forwarded call's fault, a 429 or 503, is a call but not an answer). Runs in its own
process so that its CPU is not counted as the runner's; benchmarks/common.py starts it
with a certificate of its own (`fixed_agent`, `forwarding_agent`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import ssl
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


def make_app(latency: float, reply_chars: int = 0, forward: str | None = None) -> web.Application:
    body = reply(reply_chars)
    calls = 0
    answered: Counter[str] = Counter()
    app = web.Application()

    async def complete(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        raw = await request.read()
        model = str(json.loads(raw).get("model")) if raw else ""
        if forward is None:
            await asyncio.sleep(latency)
            answered[model] += 1
            return web.Response(body=body, content_type="application/json")
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
        return web.json_response({"calls": calls, "answered": answered})

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
        make_app(args.latency_ms / 1000, args.reply_chars, args.forward),
        sock=sock,
        ssl_context=tls,
        print=None,
        access_log=None,
        backlog=4096,
    )


if __name__ == "__main__":
    main()
