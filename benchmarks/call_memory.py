"""Memory an agent call holds while it waits, by HTTP client, against a bare aiohttp floor.

    python -m benchmarks.call_memory --calls 10000 --latency-s 8

Each side is a process of its own sending `--calls` Chat Completions requests at once
to the fixed agent of benchmarks/fixed_agent.py answering after `--latency-s`, and
reading its RSS while all of them wait (half the latency in), less its RSS before the
first of them (after one call, so that imports and the first connection are counted
out):
- the floor: a bare aiohttp session (no connection limit), `session.post` per call;
- agenttest's `post_json` through its lean client (agents/plain_http.py: a plain
  `http://` URL);
- agenttest's `post_json` through aiohttp (the same URL with credentials in it, which
  the lean client leaves to aiohttp).
Every call's reply is checked. Prints KB per call in flight for each, and each
agenttest side's ratio to the floor.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import NamedTuple

from benchmarks.in_flight import MEMORY_FLOOR
from benchmarks.throughput import fixed_agent

AGENTTEST = r"""
import asyncio, resource, sys
from agenttest_worker.agents import exchange
from agenttest_worker.agents.retry import RetryPolicy
from agenttest_worker.agents.transport import post_json

url, count, wait = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
exchange.configure_pool(count)

def resident_kb():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0])

async def one(i):
    body = {"model": "bench", "messages": [{"role": "user", "content": f"message {i}"}]}
    result = await post_json(url=url + "/chat/completions", body=body, headers={},
        timeout=wait * 10, policy=RetryPolicy(max_retries=0), role="target", agent="bench")
    return "Noted" in result.json("bench")["choices"][0]["message"]["content"]

async def main():
    assert await one(-1)
    before = resident_kb()
    calls = asyncio.gather(*(one(i) for i in range(count)))
    await asyncio.sleep(wait / 2)
    waiting = resident_kb()
    assert all(await calls), "a reply without the expected text"
    print(before, waiting)
    await exchange.close_session()

asyncio.run(main())
"""


class Held(NamedTuple):
    before_mb: float
    waiting_mb: float

    def per_call_kb(self, calls: int) -> float:
        return (self.waiting_mb - self.before_mb) * 1024 / calls


def _run(script: str, *args: str) -> tuple[int, int]:
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"a side failed: {done.stderr[-2000:]}")
    before, after = (int(field) for field in done.stdout.split())
    return before, after


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--latency-s", type=float, default=8.0)
    args = parser.parse_args()
    wait = str(args.latency_s)
    with fixed_agent(args.latency_s * 1000) as agent:
        # The floor prints its peak (ru_maxrss) as the second figure: its calls are all
        # waiting at that peak too (nothing else grows while they wait).
        floor = Held(*(kb / 1024 for kb in _run(MEMORY_FLOOR, agent, str(args.calls))))
        lean = Held(*(kb / 1024 for kb in _run(AGENTTEST, agent, str(args.calls), wait)))
        credentials = agent.replace("http://", "http://bench:bench@", 1)
        through = Held(*(kb / 1024 for kb in _run(AGENTTEST, credentials, str(args.calls), wait)))
    n = args.calls
    base = floor.per_call_kb(n)
    print(f"agent calls waiting at once: {n}, agent {args.latency_s:g} s")
    print(f"  floor (bare aiohttp session)        {base:6.1f} KB per call")
    for label, side in (("agenttest, lean client", lean), ("agenttest, through aiohttp", through)):
        kb = side.per_call_kb(n)
        print(f"  {label:<34} {kb:6.1f} KB per call   ratio {kb / base:.2f}")


if __name__ == "__main__":
    main()
