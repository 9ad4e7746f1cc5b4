"""Is a case's drop in pass rate real, or noise? The statistics of the noise-aware gate.

A case passed x1 of n1 plays then (the baseline's repetitions, or its plays pooled over
the suite's last runs) and x2 of n2 now. If nothing changed, the passes would be
spread over both by chance alone; Fisher's exact test (one-sided) asks how likely a
split at least as bad for "now" is by chance: the p-value, the sum over the
hypergeometric distribution of the passes "now" could have got given all the passes
there were:

    p = sum over k <= x2 of C(x1 + x2, k) * C(f1 + f2, n2 - k) / C(n1 + n2, n2)

(f1, f2: the failures). Exact, with whole numbers (math.comb), for any counts: no
approximation that small samples would break. A drop is significant at confidence c
when p <= 1 - c: a case that passed 5 of 5 and now 0 of 5 has p = 1/252 = 0.004; one
that passed its single play then and failed it now has p = 0.5, and no single pair of
plays can ever be significant: repeat the case (`--repeat`) or pool its history
(`--history-window`) to know.

Each pass rate comes with its Wilson score interval at the same confidence: the range
of pass rates that would make what was seen unsurprising.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from agenttest_worker.report.repeat_stopping import wilson_interval

DEFAULT_CONFIDENCE = 0.95


def confidence_problem(text: str) -> str | None:
    """Why `text` is not a confidence level (a number strictly between 0 and 1)."""
    try:
        value = float(text)
    except ValueError:
        return f"{text!r} is not a number: give a confidence such as 0.95"
    if not 0 < value < 1 or math.isnan(value):
        return f"{text!r}: a confidence is more than 0 and less than 1, such as 0.95"
    return None


def drop_p_value(then_passed: int, then_played: int, now_passed: int, now_played: int) -> float:
    """The one-sided Fisher exact p-value that the pass rate dropped from then to now:
    the chance, if both were plays of one pass rate, of `now_passed` passes or fewer
    among `now_played` plays, given every pass and play of both (the hypergeometric
    distribution). 1.0 when either side played nothing."""
    if then_played <= 0 or now_played <= 0:
        return 1.0
    total = then_played + now_played
    passes = then_passed + now_passed
    failures = total - passes
    lowest = max(0, now_played - failures)
    tail = sum(
        math.comb(passes, k) * math.comb(failures, now_played - k)
        for k in range(lowest, now_passed + 1)
    )
    return float(Fraction(tail, math.comb(total, now_played)))


@dataclass(frozen=True)
class PassRates:
    """A case's passes then and now (skipped plays left out), and the test of its drop."""

    then_passed: int
    then_played: int
    now_passed: int
    now_played: int
    confidence: float
    # The suite's runs pooled as "then" (1: the baseline run alone).
    runs_then: int = 1

    @property
    def p_value(self) -> float:
        return drop_p_value(self.then_passed, self.then_played, self.now_passed, self.now_played)

    @property
    def dropped(self) -> bool:
        """Whether the pass rate now is below the rate then."""
        return self.now_passed * self.then_played < self.then_passed * self.now_played

    @property
    def significant(self) -> bool:
        """A drop that chance alone explains less often than 1 - confidence."""
        return self.dropped and self.p_value <= 1 - self.confidence + 1e-12

    def text(self) -> str:
        """E.g. "then 5/5 (57%–100%), now 0/5 (0%–43%), p = 0.004 (95% intervals)"."""

        def rate(passed: int, played: int) -> str:
            low, high = wilson_interval(passed, played, self.confidence)
            return f"{passed}/{played} ({low:.0%}–{high:.0%})"

        pooled = f" over {self.runs_then} runs" if self.runs_then > 1 else ""
        return (
            f"then {rate(self.then_passed, self.then_played)}{pooled}, "
            f"now {rate(self.now_passed, self.now_played)}, p = {self.p_value:.3g} "
            f"({self.confidence:.0%} intervals)"
        )

    def as_dict(self) -> dict[str, Any]:
        then_low, then_high = wilson_interval(self.then_passed, self.then_played, self.confidence)
        now_low, now_high = wilson_interval(self.now_passed, self.now_played, self.confidence)
        return {
            "then": {
                "passed": self.then_passed,
                "played": self.then_played,
                "runs": self.runs_then,
                "interval": [round(then_low, 4), round(then_high, 4)],
            },
            "now": {
                "passed": self.now_passed,
                "played": self.now_played,
                "interval": [round(now_low, 4), round(now_high, 4)],
            },
            "p_value": round(self.p_value, 6),
            "confidence": self.confidence,
            "significant": self.significant,
            "text": self.text(),
        }
