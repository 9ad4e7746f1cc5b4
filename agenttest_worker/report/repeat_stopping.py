"""When a case played with `--repeat auto` has been played enough: the stopping rule.

A case is played until its pass rate's Wilson score interval (95%) lies wholly on one
side of its pass rule's threshold, or `--max-repeat` repetitions were played:
- `majority`: the threshold is one half: decided "passed" once the interval's low end is
  above 0.5, "failed" once its high end is below 0.5;
- a share such as `0.8`: decided "passed" once the low end reaches 0.8, "failed" once
  the high end is below it;
- `all` (pass^k) and `any` (pass@k) ask about every repetition, not about a rate: no
  interval can say that all of the repetitions not played would pass. They stop only
  when the verdict is certain whatever comes next: `all` at its first failed
  repetition, `any` at its first passed one; otherwise they are played to the bound.
A case's first `START_WIDTH` repetitions (at most K) are played at once; each that ends
while the case is undecided starts one more, so a case decided at n repetitions has
played at most n + START_WIDTH - 1. Nothing here touches a store: the step that ends a repetition
hands `next_repetition` to its store (driver/adaptive_repeats.py), which asks it with
the case's repetitions as stored (store/repetition_chain.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Literal

# Wilson's interval at 95%: the standard normal quantile of 0.975.
Z95 = 1.959963984540054
# How many repetitions of a case are played at once when it starts.
START_WIDTH = 3

Decided = Literal["passed", "failed"]
StopReason = Literal["decided", "max_repeat", "stopped"]


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a proportion at `confidence` (sound near 0 and 1,
    and for few trials, where the normal approximation is not); (0, 1) with no trials.
    The one interval of the reports, the stopping rule, the gate and the viewer."""
    if trials <= 0:
        return (0.0, 1.0)
    z = Z95 if confidence == 0.95 else NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / trials
    z2 = z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / (1 + z2 / trials)
    return (max(0.0, centre - half), min(1.0, centre + half))


def threshold(rule: str) -> float | None:
    """The pass rate a rule compares with (None for `all` and `any`: see the module)."""
    if rule in ("all", "any"):
        return None
    return 0.5 if rule == "majority" else float(rule)


def decided(rule: str, passed: int, played: int) -> Decided | None:
    """The verdict `passed` passes of `played` repetitions settle, or None: undecided."""
    if played == 0:
        return None
    if rule == "all":
        return "failed" if passed < played else None
    if rule == "any":
        return "passed" if passed > 0 else None
    share = threshold(rule)
    assert share is not None
    low, high = wilson_interval(passed, played)
    # Majority passes on more than half, a share on at least that share.
    if low > share or (rule != "majority" and low >= share):
        return "passed"
    if high < share:
        return "failed"
    return None


def first_decided_at(rule: str, every: bool) -> int | None:
    """How many repetitions that all pass (`every`) or all fail settle a case under
    `rule`, or None when no number does (what docs/verdicts.md tells)."""
    for played in range(1, 1001):
        if decided(rule, played if every else 0, played) is not None:
            return played
    return None


def next_repetition(rule: str, max_repeat: int, ended: Sequence[str], created: int) -> int | None:
    """The number of the repetition to start as one ends, or None: start none.

    `ended`: the statuses of the case's repetitions that have ended (the one ending now
    among them); `created`: how many repetitions of the case exist (ended or playing).
    A skipped repetition means its run is stopping (cancelled, out of budget): nothing
    more is started."""
    if "skipped" in ended or created >= max_repeat:
        return None
    if decided(rule, ended.count("passed"), len(ended)) is not None:
        return None
    # Those still playing are not waited for: one repetition more settles no undecided
    # case both ways, so each that ends undecided starts the next.
    return created + 1


def stop_reason(rule: str, max_repeat: int, statuses: Sequence[str]) -> StopReason:
    """Why a case played adaptively stopped where it did: its interval settled its
    verdict ("decided"), it reached --max-repeat ("max_repeat"), or its run stopped it
    (a cancellation, a budget, --fail-fast, the deadline: "stopped")."""
    passed = statuses.count("passed")
    if "skipped" not in statuses and decided(rule, passed, len(statuses)) is not None:
        return "decided"
    if len(statuses) >= max_repeat and "skipped" not in statuses:
        return "max_repeat"
    return "stopped"
