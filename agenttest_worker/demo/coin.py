"""Model "coin": a biased coin, the agent whose pass rate is known, for repeats.

It answers "heads" with the probability the last user message names as `p=0.3` (one
half when it names none), else "tails"; a case asserting `equals: heads` then passes
with exactly that probability in each of its repetitions, independently. Unlike the
other demo models its answer is drawn at random, not a function of the request: every
repetition of a case sends the same request, and must be a new throw.
"""

from __future__ import annotations

import random
import re
from typing import Any

from agenttest_worker.demo._protocol import completion, messages_of

MODEL = "coin"
_CHANCE = re.compile(r"\bp=(0(?:\.\d+)?|1(?:\.0+)?)\b")
# The system's source of randomness: a process's many coins share no seed.
_THROW = random.SystemRandom()


def chance(text: str) -> float:
    """The probability of heads a message names (`p=0.3`), or one half."""
    found = _CHANCE.search(text)
    return float(found.group(1)) if found else 0.5


def respond(request_body: dict[str, Any]) -> dict[str, Any]:
    users = [m for m in messages_of(request_body) if m.get("role") == "user"]
    text = str(users[-1].get("content") or "") if users else ""
    answer = "heads" if _THROW.random() < chance(text) else "tails"
    return completion(MODEL, request_body, answer)
