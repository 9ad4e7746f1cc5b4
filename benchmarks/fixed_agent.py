"""A Chat Completions agent that answers every request after a fixed delay.

    python -m benchmarks.fixed_agent --port 0 --latency-ms 50 [--reply-chars 1000]

Prints its base URL (…/v1) on the first line, then serves until killed. Runs in its own
process so that its CPU is not counted as the runner's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket

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


def make_app(latency: float, reply_chars: int = 0) -> web.Application:
    body = reply(reply_chars)

    async def complete(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(latency)
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--reply-chars", type=int, default=0, help="pad each reply to this")
    args = parser.parse_args()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    port = sock.getsockname()[1]
    print(f"http://127.0.0.1:{port}/v1", flush=True)
    web.run_app(
        make_app(args.latency_ms / 1000, args.reply_chars),
        sock=sock,
        print=None,
        access_log=None,
        backlog=1024,
    )


if __name__ == "__main__":
    main()
