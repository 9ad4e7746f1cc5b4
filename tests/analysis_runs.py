"""Four runs of one suite for the analysis pages (trend, compare, side by side), made
with the CLI in child processes against a scripted agent; also used by
docs/make_screenshots.py, which draws the pages for docs/reading-results.md.

    runs = make_runs(folder, agent)   # agent: a started ScriptedAgent

1. `first`: every case passes.
2. `repeated` (--repeat 2): `greet` passes once and fails once (flaky).
3. `now` (--baseline suite --format html -o report.html): `greet` and `judged` fail
   (regressions), the rest pass; the HTML report carries the baseline diff.
4. `other`: `now`'s cases against another agent entry (`target2`): A | B.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from browser import IMG, LINK, SCRIPT, environment, submit
from scripted_agent import Body, Reply, ScriptedAgent, judge_verdict, last_user_text, say

SUITE = "shop"
# A reply as JSON (shown pretty) and as Markdown (shown formatted).
JSON_REPLY = {"order": 42, "items": ["tea", "cake"], "total": {"amount": 7.5, "currency": "EUR"}}
MARKDOWN_REPLY = (
    "**Total**: 7.50 EUR\n\n- tea\n- cake\n\n```\n<b>receipt</b> #42\n```\n"
    "See [the shop](https://example.com/shop) or [this](javascript:alert(1))."
)
HOSTILE_REPLY = f"Hello! {SCRIPT} {IMG} {LINK}"
# What the judge answers in the third run (a payload in its reason).
JUDGE_NO = f"Not polite enough: {IMG}"


@dataclass
class Runs:
    folder: Path
    env: dict[str, str]
    first: str
    repeated: str
    now: str
    other: str
    report: Path


def cases() -> list[dict[str, Any]]:
    return [
        {
            "id": "greet",
            "name": "Greets the customer",
            "turns": [
                {"input": "greet me", "assertions": [{"type": "contains", "value": "Hello"}]},
                {"input": "and again", "assertions": [{"type": "contains", "value": "Hello"}]},
            ],
            "tags": ["greeting"],
        },
        {
            "id": "judged",
            "name": "Polite answer",
            "input": "be polite",
            "tags": ["judge"],
            "assertions": [
                {
                    "type": "agent",
                    "use": "agents:judge",
                    "options": {"metadata": {"criteria": "polite"}},
                }
            ],
        },
        {
            "id": "order-json",
            "name": "Order as JSON",
            "input": "order as json",
            "tags": ["json"],
            "assertions": [{"type": "contains", "value": "order"}],
        },
        {
            "id": "receipt-md",
            "name": "Receipt in Markdown",
            "input": "receipt please",
            "tags": ["markdown"],
            "assertions": [{"type": "not_contains", "value": "error"}],
        },
        {
            "id": "hostile",
            "name": f"Hostile {IMG}",
            "input": "hostile please",
            "tags": ["xss"],
            "assertions": [{"type": "contains", "value": "Hello"}],
        },
    ]


class _Agent:
    """The target's and judge's answers, changed between runs."""

    def __init__(self) -> None:
        self.greet_bad = False
        self.greet_calls = 0
        self.flip = False
        self.judge_passes = True

    def target(self, body: Body) -> Reply | str:
        text = last_user_text(body)
        if "json" in text:
            return say(json.dumps(JSON_REPLY))
        if "receipt" in text:
            return say(MARKDOWN_REPLY)
        if "hostile" in text:
            return say(HOSTILE_REPLY)
        if "polite" in text:
            return say("Hello, how can I help you today?")
        self.greet_calls += 1
        # Repeated: the first call of `greet` answers badly, so one repetition fails.
        bad = self.greet_bad or (self.flip and self.greet_calls == 1)
        return say("Go away." if bad else "Hello! Welcome to the shop.")

    def judge(self, body: Body) -> Reply:
        if self.judge_passes:
            return judge_verdict(True, "Polite and helpful.")
        return judge_verdict(False, JUDGE_NO)


def _run_id(stdout: str) -> str:
    match = re.search(r"ℹ Run: (\S+)", stdout)
    assert match, stdout
    return match.group(1)


def make_runs(folder: Path, agent: ScriptedAgent) -> Runs:
    behaviour = _Agent()
    agent.script("target", behaviour.target)
    agent.script("target2", behaviour.target)
    agent.script("judge", behaviour.judge)
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "agenttest.yaml"
    agents = {
        "target": agent.entry("target", max_retries=0),
        "target2": agent.entry("target2", max_retries=0),
        "judge": agent.entry("judge", max_retries=0),
    }
    config.write_text(json.dumps({"agents": agents}), encoding="utf-8")
    written = folder / "cases.jsonl"
    written.write_text("".join(json.dumps(c) + "\n" for c in cases()), encoding="utf-8")
    env = environment(folder / ".agenttest")
    args = ["-i", str(written), "--config", str(config), "--suite", SUITE]

    def played(*more: str, code: int) -> str:
        done = submit([*args, *more], env, folder)
        assert done.returncode == code, done.stdout + done.stderr
        return _run_id(done.stdout) if "ℹ Run:" in done.stdout else _stored_last(env, folder)

    first = played("-n", "target", code=0)
    behaviour.flip, behaviour.greet_calls = True, 0
    repeated = played("-n", "target", "--repeat", "2", code=1)
    behaviour.flip, behaviour.greet_bad, behaviour.judge_passes = False, True, False
    report = folder / "report.html"
    now = played(
        "-n", "target", "--baseline", "suite", "--format", "html", "-o", str(report), code=1
    )
    other = played("-n", "target2", code=1)
    return Runs(folder, env, first, repeated, now, other, report)


def _stored_last(env: dict[str, str], folder: Path) -> str:
    """The newest run's id (a run written with -o prints its report there)."""
    listed = submit(["runs", "--format", "json"], env, folder)
    assert listed.returncode == 0, listed.stderr
    return str(json.loads(listed.stdout)[0]["run_id"])
