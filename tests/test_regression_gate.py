"""The noise-aware regression gate: `--confidence` and `--history-window`.

The statistics against values worked by hand (and scipy's documented example); then
real runs of a suite against a scripted agent served over HTTP: a real drop (every
repetition passed, now every one fails) is a regression and fails the gate; one play
that passed then and failed now is only "likely regressed" and exits 0; a coin-flip
target (half its answers right) after a target that was always right is a significant
drop, where the verdict diff calls it flaky; pooling the suite's history makes a drop
significant that the baseline alone cannot.
"""

from __future__ import annotations

import itertools
import json
import math
import threading
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from scripted_agent import Body, Reply, ScriptedAgent

from agenttest_submit.cli.main import main
from agenttest_worker.report import PassRates, drop_p_value, gated_category, wilson_interval

# -- the statistics ---------------------------------------------------------------------


def test_fisher_one_sided_matches_scipys_documented_example() -> None:
    # scipy.stats.fisher_exact([[8, 2], [1, 5]], alternative="greater"): 0.0245, worked
    # by hand: rows of 10 and 6, 9 passes in 16; P(X >= 8) for the first row's passes
    # = [C(9,8) C(7,2) + C(9,9) C(7,1)] / C(16,10) = (189 + 7) / 8008.
    assert drop_p_value(8, 10, 1, 6) == pytest.approx(196 / 8008)
    assert round(drop_p_value(8, 10, 1, 6), 4) == 0.0245
    # The other side ("less"): every table but X = 9, P = 1 - 7/8008.
    assert 1 - drop_p_value(8, 10, 1, 6) + 189 / 8008 == pytest.approx(1 - 7 / 8008)


def test_fisher_values_worked_by_hand() -> None:
    # One play each side, passed then and failed now: a coin would do it half the time.
    assert drop_p_value(1, 1, 0, 1) == 0.5
    # 5 of 5, then 0 of 5: only one table of 5 passes among 10 is that bad: 1/C(10,5).
    assert drop_p_value(5, 5, 0, 5) == pytest.approx(1 / 252)
    # 8 of 8, then 4 of 8 (a coin flip): C(12,4) C(4,4) / C(16,8) = 495 / 12870.
    assert drop_p_value(8, 8, 4, 8) == pytest.approx(495 / 12870)
    # No drop at all: nothing to explain (the whole distribution's tail is 1).
    assert drop_p_value(3, 6, 6, 6) == pytest.approx(1.0)
    assert drop_p_value(0, 0, 0, 3) == 1.0 and drop_p_value(2, 2, 0, 0) == 1.0


def test_fisher_is_the_exact_hypergeometric_tail() -> None:
    # Against counting every way to deal the passes out to the plays (small tables).
    for n1, n2 in itertools.product(range(1, 5), repeat=2):
        for x1, x2 in itertools.product(range(n1 + 1), range(n2 + 1)):
            plays = [True] * (x1 + x2) + [False] * (n1 + n2 - x1 - x2)
            deals = list(itertools.combinations(range(n1 + n2), n2))
            worse = sum(1 for d in deals if sum(plays[i] for i in d) <= x2)
            assert drop_p_value(x1, n1, x2, n2) == pytest.approx(float(Fraction(worse, len(deals))))


def test_a_single_play_can_never_be_a_significant_drop() -> None:
    for played_then in range(1, 19):
        # The best case for a drop: every play then passed, the one play now failed:
        # p = 1 / (n + 1), over 0.05 up to 18 plays then.
        assert drop_p_value(played_then, played_then, 0, 1) == pytest.approx(1 / (played_then + 1))
        assert not PassRates(played_then, played_then, 0, 1, 0.95).significant
    assert PassRates(19, 19, 0, 1, 0.95).significant


def test_wilson_at_the_gates_confidence() -> None:
    assert wilson_interval(6, 9, 0.95) == pytest.approx(wilson_interval(6, 9))
    low, high = wilson_interval(5, 5, 0.95)
    assert high == pytest.approx(1.0) and round(low, 3) == 0.566
    # A higher confidence, a wider interval.
    assert wilson_interval(5, 10, 0.99)[0] < wilson_interval(5, 10, 0.95)[0]
    z = 2.5758293035489004  # the 0.995 quantile of the standard normal
    p, n = 0.5, 10
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert wilson_interval(5, 10, 0.99) == pytest.approx((centre - half, centre + half))


def test_gated_categories() -> None:
    drop = PassRates(5, 5, 0, 5, 0.95)
    noise = PassRates(1, 1, 0, 1, 0.95)
    assert gated_category("regression", "failed", drop) == "regression"
    assert gated_category("regression", "failed", noise) == "likely_regression"
    # Significant drops regress whatever the verdict diff said: flaky, a known failure.
    assert gated_category("flaky", "failed", PassRates(8, 8, 4, 8, 0.95)) == "regression"
    assert gated_category("still_failing", "failed", PassRates(4, 5, 0, 5, 0.95)) == "regression"
    assert gated_category("changed", "failed", drop) == "changed"
    assert gated_category("fixed", "passed", PassRates(0, 1, 1, 1, 0.95)) == "fixed"
    assert gated_category("regression", "failed", None) == "regression"
    text = drop.text()
    assert "then 5/5 (57%–100%)" in text and "now 0/5 (0%–43%)" in text
    assert "p = 0.00397" in text


# -- runs -------------------------------------------------------------------------------


class Suite:
    """One suite run again and again, embedded, the agent told what to answer."""

    def __init__(self, agent: ScriptedAgent, tmp_path: Path, capsys: Any) -> None:
        self.agent, self.capsys = agent, capsys
        self.config = tmp_path / "agenttest.yaml"
        entry = agent.entry("bot", max_retries=0)
        self.config.write_text(json.dumps({"agents": {"bot": entry}}), encoding="utf-8")
        self.cases = tmp_path / f"gate-{tmp_path.name}.jsonl"
        case = {
            "id": "answer",
            "input": "question",
            "assertions": [{"type": "contains", "value": "right"}],
        }
        other = {**case, "id": "steady", "input": "steady question"}
        self.cases.write_text(json.dumps(case) + "\n" + json.dumps(other) + "\n", encoding="utf-8")

    def submit(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(list(args))
        out, err = self.capsys.readouterr()
        return code, out, err

    def night(self, passes: list[bool], *more: str) -> tuple[int, str, str]:
        """A run in which "answer"'s plays are right as `passes` says, in any order of
        its repetitions ("steady" is always right)."""
        flips = iter(passes)
        lock = threading.Lock()

        def rule(body: Body) -> Reply | str:
            text = str(body["messages"][-1]["content"])
            if "steady" in text:
                return "right"
            with lock:
                return "right" if next(flips) else "wrong"

        self.agent.script("bot", rule)
        repeat = ("--repeat", str(len(passes))) if len(passes) > 1 else ()
        args = ["-i", str(self.cases), "-n", "bot", "--config", str(self.config)]
        return self.submit(*args, *repeat, *more)


@pytest.fixture
def suite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[Suite]:
    with ScriptedAgent() as agent:
        yield Suite(agent, tmp_path, capsys)


def _change(document: dict[str, Any], case_id: str = "answer") -> dict[str, Any]:
    return next(c for c in document["cases"] if c["id"] == case_id)


def test_a_real_drop_is_a_regression_and_fails_the_gate(suite: Suite) -> None:
    assert suite.night([True] * 6)[0] == 0
    gate = ("--fail-on", "regressions", "--confidence", "0.95")
    code, out, err = suite.night([False] * 6, *gate)
    assert code == 1, out + err
    assert "Newly failing (1)" in out
    assert "significant drops only (one-sided Fisher exact test at 95% confidence)" in out
    # 6/6 then, 0/6 now: p = 1/C(12,6) = 1/924.
    assert "then 6/6 (61%–100%), now 0/6 (0%–39%), p = 0.00108" in out
    assert "Failing now, by cause: 6 agent" in out
    code, out, _ = suite.submit("diff", "--confidence", "0.95", "--format", "json")
    assert code == 1
    document = json.loads(out)
    change = _change(document)
    assert change["category"] == "regression" and change["cause"] == "agent"
    stats = change["stats"]
    assert stats["then"]["passed"] == 6 and stats["now"]["played"] == 6
    assert stats["p_value"] == pytest.approx(1 / 924, abs=1e-6) and stats["significant"]
    assert document["confidence"] == 0.95 and document["causes"] == {"agent": 6}
    assert _change(document, "steady")["category"] == "still_passing"


def test_a_noisy_drop_is_likely_regressed_and_passes_the_gate(suite: Suite) -> None:
    assert suite.night([True])[0] == 0
    code, out, err = suite.night([False], "--fail-on", "regressions", "--confidence", "0.95")
    assert code == 0, out + err  # one play each side: never significant
    assert "Likely regressed (1)" in out and "Newly failing: 0" in out
    assert "then 1/1" in out and "p = 0.5" in out
    assert "repeat it (--repeat) to know" in out
    assert "1 case likely regressed" in err and "does not fail the job" in err
    # Without the gate's statistics, the same two runs are a plain regression.
    code, out, _ = suite.submit("diff")
    assert code == 1 and "Newly failing (1)" in out
    code, out, _ = suite.submit("diff", "--confidence", "0.95", "--format", "markdown")
    assert code == 0 and "#### Likely regressed (1)" in out
    code, out, _ = suite.submit("diff", "--confidence", "0.95", "--format", "junit")
    assert 'message="its verdict fell, but not significantly' in out


def test_a_coin_flip_target_after_a_steady_one_is_a_regression_not_flaky(suite: Suite) -> None:
    assert suite.night([True] * 8)[0] == 0
    # Half of the coin's answers are right: its repetitions disagree.
    code, out, err = suite.night([True, False] * 4, "--fail-on", "regressions")
    assert code == 0, out + err  # compared by verdict alone: flaky, not a regression
    assert "Flaky (1)" in out
    code, out, _ = suite.submit("diff", "--confidence", "0.95", "--format", "json")
    assert code == 1
    change = _change(json.loads(out))
    # 8/8 then, 4/8 now: p = 495/12870 = 0.038, below 0.05.
    assert change["category"] == "regression"
    assert change["stats"]["p_value"] == pytest.approx(495 / 12870, abs=1e-6)
    # Its failed repetitions failed where others passed: flakes.
    assert change["cause"] == "flake"
    # At 99% the same drop is not enough: flaky again, as its repetitions disagree.
    code, out, _ = suite.submit("diff", "--confidence", "0.99", "--format", "json")
    assert code == 0 and _change(json.loads(out))["category"] == "flaky"


def test_the_history_window_pools_the_suites_runs_as_the_baseline(suite: Suite) -> None:
    for _ in range(3):
        assert suite.night([True, True])[0] == 0
    code, out, err = suite.night([False, False], "--fail-on", "regressions", "--confidence", "0.95")
    # Against the last run alone, 2/2 then 0/2 now: p = 1/6.
    assert code == 0, out + err
    assert "Likely regressed (1)" in out
    # With the last run alone as the baseline, the target failed: the agent's doing.
    code, out, _ = suite.submit("diff", "--confidence", "0.95", "--format", "json")
    assert _change(json.loads(out))["cause"] == "agent"
    # Pooled over one run, still not significant; but it passed in the window: a flake.
    code, out, _ = suite.submit("diff", "--history-window", "1", "--format", "json")
    assert code == 0
    change = _change(json.loads(out))
    assert change["category"] == "likely_regression" and change["cause"] == "flake"
    code, out, err = suite.submit("diff", "--history-window", "3", "--format", "json")
    assert code == 1, err
    document = json.loads(out)
    change = _change(document)
    # Pooled over 3 runs, 6/6 then: p = 1/C(8,2) = 1/28.
    assert change["category"] == "regression"
    assert change["stats"]["then"] == {
        "passed": 6,
        "played": 6,
        "runs": 3,
        "interval": change["stats"]["then"]["interval"],
    }
    assert change["stats"]["p_value"] == pytest.approx(1 / 28, abs=1e-6)
    assert document["history_window"] == 3 and document["confidence"] == 0.95
    code, out, _ = suite.submit("diff", "--history-window", "3")
    assert "the baseline pooled over the suite's last 3 runs" in out
    assert "then 6/6 (61%–100%) over 3 runs" in out


def test_a_bad_confidence_is_refused_before_anything_runs(suite: Suite) -> None:
    for bad in ("1.5", "0", "most"):
        code, _, err = suite.night([True], "--fail-on", "regressions", "--confidence", bad)
        assert code == 2 and "--confidence" in err and "Traceback" not in err
    assert suite.agent.requests("bot") == []
    code, _, err = suite.submit("diff", "--history-window", "0")
    assert code == 2 and "Traceback" not in err


def test_confidence_alone_prints_the_weighed_diff_and_keeps_the_runs_exit_code(
    suite: Suite,
) -> None:
    assert suite.night([True])[0] == 0
    code, out, err = suite.night([False], "--confidence", "0.9")
    assert code == 1, out + err  # no --fail-on: the run's own verdict decides
    assert "Likely regressed (1)" in out and "at 90% confidence" in out
    assert "(90% intervals)" in out
