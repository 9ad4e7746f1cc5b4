"""A hostile agent's stream cannot hold the event loop, and each field it sends is bounded.

A tool call's name and arguments, and a reply's text, come in pieces; put together by
growing a str they cost time quadratic in their length, all of it on the one event loop
that plays every conversation (a 14 MB name in 4 KB pieces held the loop for seconds).
Here: the pieces are joined once (assembly linear in their number, measured), every
field is bounded and the error names the bound, and the SSE line splitter is linear and
bounded too. End to end, an embedded run with --parallel 2 plays a calm agent's
conversation (0.3 s turns) beside a raw-socket agent streaming a 14 MB tool-call name,
then 14 MB of arguments, in 4 KB pieces: the calm turns take about as long as in the
same run without the hostile agent.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from raw_http import Answer, RawRequest, ThreadedRawServer, reply

from agenttest_worker.agents.http.streaming import (
    MAX_LINE_BYTES,
    MAX_STREAM_BYTES,
    MAX_TOOL_NAME_CHARS,
    REPLY_SIZE,
    StreamEvent,
    StreamFailure,
    sse_events,
)
from agenttest_worker.agents.protocols.anthropic_reply import MessageAssembler
from agenttest_worker.agents.protocols.http import EventAssembler
from agenttest_worker.agents.protocols.openai import ChunkAssembler
from agenttest_worker.agents.protocols.openai_responses_reply import ResponseAssembler
from agenttest_worker.agents.reply_mappings import ResponseMapping

HOSTILE_MB = 14
PIECE = 4096
CALM_DELAY = 0.3


def _chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    body = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return json.dumps({**body, "choices": [choice]})


def _name_piece(text: str, first: bool = False) -> str:
    call: dict[str, Any] = {"index": 0, "function": {"name": text}}
    if first:
        call.update(id="call_1", type="function")
    return _chunk({"tool_calls": [call]})


def _arguments_piece(text: str, first: bool = False) -> str:
    call: dict[str, Any] = {"index": 0, "function": {"arguments": text}}
    if first:
        call.update(id="call_1", type="function", function={"name": "f", "arguments": text})
    return _chunk({"tool_calls": [call]})


# -- linear assembly ------------------------------------------------------------------------


def _growth(small: Callable[[], None], large: Callable[[], None], runs: int) -> float:
    """How many times as long `large` takes as `small`: the shortest timing of each, taken
    in turns, so that a busy machine's slow spells fall on both, in this thread's CPU time
    (the time other processes take the CPU away does not count)."""
    best = [float("inf"), float("inf")]
    for _ in range(runs):
        for index, work in enumerate((small, large)):
            started = time.thread_time()
            work()
            best[index] = min(best[index], time.thread_time() - started)
    return best[1] / best[0]


def test_a_tool_calls_arguments_assemble_in_time_linear_in_their_pieces() -> None:
    piece = "a" * 1024

    def events(count: int) -> list[StreamEvent]:
        return [StreamEvent(None, _arguments_piece(piece, i == 0)) for i in range(count)]

    def assemble(made: list[StreamEvent]) -> Callable[[], None]:
        def work() -> None:
            assembler = ChunkAssembler("hostile")
            for event in made:
                assembler.feed(event)
            [call] = assembler.reply().tool_calls
            assert len(call.args) == len(made) * len(piece)

        return work

    pieces = 6000  # 6 MB and 12 MB: a str grown piece by piece takes seconds on the larger
    once, twice = events(pieces), events(2 * pieces)
    ratio = _growth(assemble(once), assemble(twice), 4)
    assert ratio < 3, f"2N pieces took {ratio:.2f} times as long as N"


class _Body:
    """A response body as aiohttp's StreamReader gives it: chunk by chunk (readany)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = iter(chunks)

    async def readany(self) -> bytes:
        return next(self.chunks, b"")


async def _all_events(chunks: list[bytes]) -> list[StreamEvent]:
    return [event async for event in sse_events(_Body(chunks))]


def test_a_long_sse_line_is_split_in_time_linear_in_its_chunks() -> None:
    def body(size: int) -> list[bytes]:
        line = b"data: " + b"x" * size + b"\n\n"
        return [line[i : i + 512] for i in range(0, len(line), 512)]

    def split(chunks: list[bytes]) -> Callable[[], None]:
        def work() -> None:
            [event] = asyncio.run(_all_events(chunks))
            assert len(event.data) == len(b"".join(chunks)) - len(b"data: \n\n")

        return work

    once, twice = body(2 << 20), body(4 << 20)  # 4,096 and 8,192 chunks of one line
    ratio = _growth(split(once), split(twice), 5)
    assert ratio < 3, f"a line twice as long took {ratio:.2f} times as long to split"


# -- bounds -----------------------------------------------------------------------------------


def _fails(feed: Callable[[], Any]) -> str:
    with pytest.raises(StreamFailure) as raised:
        feed()
    return raised.value.message


def test_a_tool_calls_name_is_bounded_in_every_streaming_protocol() -> None:
    long_name = "n" * (MAX_TOOL_NAME_CHARS + 1)
    bound = f"is over {MAX_TOOL_NAME_CHARS:,} characters (the bound on a tool call's name)"

    openai = ChunkAssembler("gpt")
    openai.feed(StreamEvent(None, _name_piece("n" * MAX_TOOL_NAME_CHARS, first=True)))
    message = _fails(lambda: openai.feed(StreamEvent(None, _name_piece("n"))))
    assert message == f"agent error: gpt's tool call 0's name {bound}"

    block = {"type": "tool_use", "id": "t", "name": long_name, "input": {}}
    start = {"type": "content_block_start", "index": 1, "content_block": block}
    message = _fails(lambda: MessageAssembler("claude").feed(StreamEvent(None, json.dumps(start))))
    assert message == f"agent error: claude's tool call 1's name {bound}"

    item = {"type": "function_call", "id": "fc", "call_id": "c", "name": long_name}
    added = {"type": "response.output_item.added", "output_index": 2, "item": item}
    responses = ResponseAssembler("resp")
    message = _fails(lambda: responses.feed(StreamEvent(None, json.dumps(added))))
    assert message == f"agent error: resp's output item 2's name {bound}"


def test_arguments_and_text_are_bounded_by_the_reply_size() -> None:
    assert REPLY_SIZE.limit == MAX_STREAM_BYTES == 16 * 1024 * 1024
    piece = "a" * (1 << 20)
    bound = "is over 16 MB (the reply-size bound)"

    def overflow(assembler: Any, event: Callable[[int], str]) -> str:
        def feed() -> None:
            for index in range(17):
                assembler.feed(StreamEvent(None, event(index)))

        return _fails(feed)

    message = overflow(ChunkAssembler("gpt"), lambda i: _arguments_piece(piece, i == 0))
    assert message == f"agent error: gpt's tool call 0's arguments {bound}"
    message = overflow(ChunkAssembler("gpt"), lambda i: _chunk({"content": piece}))
    assert message == f"agent error: gpt's reply {bound}"

    mapping = ResponseMapping(content_delta="$.delta")
    message = overflow(EventAssembler("web", mapping), lambda i: json.dumps({"delta": piece}))
    assert message == f"agent error: web's reply {bound}"

    claude = MessageAssembler("claude")
    start = {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
    claude.feed(StreamEvent(None, json.dumps(start)))
    delta = {"type": "content_block_delta", "index": 0}
    text = {**delta, "delta": {"type": "text_delta", "text": piece}}
    message = overflow(claude, lambda i: json.dumps(text))
    assert message == f"agent error: claude's text block 0 {bound}"

    responses = ResponseAssembler("resp")
    event = {"type": "response.output_text.delta", "output_index": 0, "delta": piece}
    message = overflow(responses, lambda i: json.dumps(event))
    assert message == f"agent error: resp's output item 0 {bound}"


def test_an_sse_line_is_bounded() -> None:
    line = b"data: " + b"x" * MAX_LINE_BYTES + b"\n\n"
    chunks = [line[i : i + PIECE * 16] for i in range(0, len(line), PIECE * 16)]
    message = _fails(lambda: asyncio.run(_all_events(chunks)))
    assert (
        message == "agent error: a line of the stream is over 8 MB (the bound on a stream's line)"
    )
    # A line just within the bound is read whole, in one chunk or in many.
    within = b"data: " + b"x" * (MAX_LINE_BYTES - len("data: ")) + b"\n\n"
    for pieces in ([within], [within[i : i + PIECE] for i in range(0, len(within), PIECE)]):
        [event] = asyncio.run(_all_events(pieces))
        assert len(event.data) == MAX_LINE_BYTES - len("data: ")


# -- end to end: a hostile stream beside a calm conversation ---------------------------------


def _hostile(field: str) -> Callable[[RawRequest], Answer]:
    """An agent streaming a tool call whose `field` is 14 MB, in 4 KB pieces."""
    make = _name_piece if field == "name" else _arguments_piece

    def answer(request: RawRequest) -> Answer:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
        piece = "h" * PIECE
        count = HOSTILE_MB * 1024 * 1024 // PIECE
        events = [f"data: {make(piece, i == 0)}\n\n".encode() for i in range(count)]
        end = [f"data: {_chunk({}, 'tool_calls')}\n\ndata: [DONE]\n\n".encode()]
        return Answer([head, *events, *end], close=True, pause=0)

    return answer


def _calm(request: RawRequest) -> Answer:
    message = {"role": "assistant", "content": "Noted."}
    body = {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "calm",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }
    answered = reply(body=json.dumps(body).encode())
    return Answer([b"", *answered.pieces], pause=CALM_DELAY)


@pytest.fixture
def calm() -> Iterator[ThreadedRawServer]:
    with ThreadedRawServer(_calm) as server:
        yield server


def _run(
    tmp_path: Path, name: str, agents: dict[str, str], cases: list[dict[str, Any]]
) -> dict[str, Any]:
    """An embedded run in a process of its own (the test's servers are not on its loop);
    its records by case id."""
    directory = tmp_path / name
    directory.mkdir()
    entries = {
        agent: {
            "protocol": "openai",
            "base_url": url,
            "model": agent,
            "max_retries": 0,
            "timeout": 30,
        }
        for agent, url in agents.items()
    }
    entries = {a: {**e, "stream": True} if a == "hostile" else e for a, e in entries.items()}
    (directory / "agenttest.yaml").write_text(json.dumps({"agents": entries}), encoding="utf-8")
    case_file = directory / "cases.jsonl"
    case_file.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    out = directory / "results.jsonl"
    args = ["-i", str(case_file), "--config", "agenttest.yaml", "-o", str(out), "--parallel", "2"]
    env = {**os.environ, "AGENTTEST_HOME": str(directory / ".agenttest")}
    done = subprocess.run(
        [sys.executable, "-m", "agenttest_submit.cli", *args],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert out.exists(), done.stdout + done.stderr
    return {r["id"]: r for r in map(json.loads, out.read_text(encoding="utf-8").splitlines())}


def _calm_case() -> dict[str, Any]:
    turns = [
        {"input": f"Note {n}", "assertions": [{"type": "contains", "value": "Noted"}]}
        for n in range(8)
    ]
    return {"id": "CALM", "agent": "calm", "type": "multi_turn", "turns": turns}


@pytest.mark.parametrize("field", ["name", "arguments"])
def test_a_hostile_stream_does_not_slow_another_conversation(
    field: str, tmp_path: Path, calm: ThreadedRawServer
) -> None:
    alone = _run(tmp_path, "alone", {"calm": calm.url("/v1")}, [_calm_case()])
    with ThreadedRawServer(_hostile(field)) as hostile:
        agents = {"calm": calm.url("/v1"), "hostile": hostile.url("/v1")}
        # The hostile case first: its stream is under way while the calm turns are played.
        cases = [{"id": "HOSTILE", "agent": "hostile", "input": "Call your tool"}, _calm_case()]
        beside = _run(tmp_path, "beside", agents, cases)

    def slowest(records: dict[str, Any]) -> int:
        turns = records["CALM"]["turns"]
        assert [t["status"] for t in turns] == ["passed"] * 8, turns
        return max(int(t["duration_ms"]) for t in turns)

    base, hostile_ms = slowest(alone), slowest(beside)
    # About 0.3 s a turn alone; beside the hostile agent no turn takes more than about
    # 1 s, scaled by how slow the machine is right now (the run alone, same machine).
    assert hostile_ms < 1000 * base / (CALM_DELAY * 1000), (base, hostile_ms)
    [turn] = beside["HOSTILE"]["turns"]
    if field == "name":
        assert turn["status"] == "failed"
        assert turn["error"] == (
            "agent error: hostile's tool call 0's name is over 1,024 characters "
            "(the bound on a tool call's name)"
        )
    else:
        # 14 MB of arguments is within the reply-size bound (16 MB): read whole.
        [call] = turn["tool_calls"]
        assert call["args"] == "h" * (HOSTILE_MB * 1024 * 1024)
