"""`agenttest-submit cache stats|clear [--agent NAME] [--older-than D]`: the agents'
cached replies in the store (agents/reply_cache.py), counted by agent or removed.

`stats` prints one line per agent (its replies, their size, the oldest and newest) and
the total; `clear` removes the replies (of one agent, stored longer ago than D) and
says how many. Replies being called for (a lease) are neither counted nor kept apart:
clearing one only makes its waiting callers call for themselves.
"""

from __future__ import annotations

from agenttest_submit.cli.request import CacheRequest
from agenttest_worker.report import printable
from agenttest_worker.store import reply_cache


def cache_command(url: str, request: CacheRequest) -> int:
    cache = reply_cache.reply_cache_at(url)
    if request.action == "clear":
        removed = cache.clear(request.agent, request.older_than)
        print(f"removed {removed:,} cached repl{'y' if removed == 1 else 'ies'}")
        return 0
    found = cache.stats(request.agent)
    if not found:
        print("no cached replies" + (f" of {printable(request.agent)}" if request.agent else ""))
        return 0
    for agent in found:
        when = ""
        if agent.oldest is not None and agent.newest is not None:
            when = f", {agent.oldest:%Y-%m-%d %H:%M} to {agent.newest:%Y-%m-%d %H:%M}"
        print(
            f"{printable(agent.agent)}: {agent.entries:,} repl"
            f"{'y' if agent.entries == 1 else 'ies'}, {_size(agent.size_bytes)}{when}"
        )
    entries = sum(a.entries for a in found)
    size = sum(a.size_bytes for a in found)
    print(f"total: {entries:,} repl{'y' if entries == 1 else 'ies'}, {_size(size)}")
    return 0


def _size(size: int) -> str:
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}"
    return f"{size:,} bytes"
