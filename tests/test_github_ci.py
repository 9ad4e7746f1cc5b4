"""GitHub Actions: a run's annotations, step summary and outputs (GITHUB_ACTIONS=true),
the pull-request comment against a stand-in of GitHub's REST API, and action.yml's
steps run as the runner would, against the demo agents over real HTTP."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from standins.github_rest import GitHubStandIn

from agenttest_submit.cli.main import main
from agenttest_submit.commands.github_comment import MARKER, MAX_BODY
from agenttest_submit.commands.github_comment import main as comment_main
from agenttest_submit.run.github import MAX_ANNOTATIONS, annotation_lines
from agenttest_worker.report import RunReport
from agenttest_worker.results import CaseResult

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "agenttest_worker" / "demo" / "suite"
CONFIG = str(SUITE / "agenttest.yaml")
HOSTILE_NAME = "100%\r\n::warning::owned, file=x:1"
HOSTILE = {
    "id": "T005",
    "name": HOSTILE_NAME,
    "input": "Hello",
    "assertions": [{"type": "contains", "value": "never said\n::error::fake"}],
}
TOKEN = "ghs_test_token_value"


def _cases(folder: Path) -> Path:
    cases = folder / "cases"
    cases.mkdir()
    text = (SUITE / "expense-suite.jsonl").read_text() + json.dumps(HOSTILE) + "\n"
    (cases / "expense.jsonl").write_text(text)
    return cases / "expense.jsonl"


def _github_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    files = {name: tmp_path / f"{name.lower()}.txt" for name in ("SUMMARY", "OUTPUT")}
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(files["SUMMARY"]))
    monkeypatch.setenv("GITHUB_OUTPUT", str(files["OUTPUT"]))
    return files


def test_a_run_on_github_annotates_failed_cases_at_their_lines(
    demo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _cases(demo)
    files = _github_env(demo, monkeypatch)
    code = main(["-i", "cases/expense.jsonl", "--config", CONFIG, "-n", "assistants.expense"])
    assert code == 1
    err = capsys.readouterr().err
    commands = [line for line in err.splitlines() if line.startswith("::")]
    assert len(commands) == 2, err
    t004, t005 = commands
    assert t004.startswith("::error file=cases/expense.jsonl,line=4,title=agenttest%3A T004 ")
    assert 'reply does not contain "refund"' in t004
    # The hostile name and assertion cannot end the line or add a property or command.
    assert t005.startswith("::error file=cases/expense.jsonl,line=5,title=agenttest%3A T005 ")
    assert "100%25" in t005 and "%3A%3Awarning%3A%3Aowned%2C file=x%3A1" in t005
    assert "::warning::" not in err and "\n::error::fake" not in err
    summary = files["SUMMARY"].read_text()
    assert summary.startswith("### agenttest — failed\n")
    assert "| 5 | 2 | 2 | 1 |" in summary  # T002 awaits input: skipped
    assert "\nCauses: " in summary and "(cause: agent)" in summary
    assert "**T004** — Greeting mentions refunds (cases/expense\\.jsonl:4)" in summary
    # Markdown escaped, and on one line: the name's CR LF shown, not obeyed.
    assert "100%\\\\x0d\\\\x0a::warning::owned, file=x:1 (cases/expense\\.jsonl:5)" in summary
    outputs = dict(line.split("=", 1) for line in files["OUTPUT"].read_text().splitlines())
    assert outputs["exit-code"] == "1" and re.fullmatch(r"[\w-]+", outputs["run-id"])


def test_off_github_a_run_writes_no_command(
    demo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _cases(demo)
    files = _github_env(demo, monkeypatch)
    monkeypatch.setenv("GITHUB_ACTIONS", "false")
    assert main(["-i", "cases/expense.jsonl", "--config", CONFIG, "-n", "assistants.expense"]) == 1
    assert "::error" not in capsys.readouterr().err
    assert not files["SUMMARY"].exists() and not files["OUTPUT"].exists()


def _failed(number: int) -> CaseResult:
    return CaseResult(
        id=f"C{number:03d}",
        status="failed",
        error="agent said no",
        file="/elsewhere/cases.jsonl",
        line=number,
    )


def test_annotations_are_bounded_and_the_rest_counted() -> None:
    report = RunReport(
        results=[_failed(n) for n in range(1, 61)],
        agent=None,
        input_label="cases",
        total_cases=60,
        duration_s=1.0,
    )
    lines = annotation_lines(report, Path("/work/space"))
    errors = [line for line in lines if line.startswith("::error ")]
    assert len(errors) == MAX_ANNOTATIONS
    # A file outside the workspace is not pointed at.
    assert errors[0] == "::error title=agenttest%3A C001 failed::agent said no"
    assert lines[-1].startswith("::warning title=agenttest::10 more failed case(s) not annotated")


# The pull-request comment, against the stand-in.


def _event(tmp_path: Path, number: int | None) -> str:
    event = {"pull_request": {"number": number}} if number else {"ref": "refs/heads/main"}
    path = tmp_path / "event.json"
    path.write_text(json.dumps(event))
    return str(path)


def _environ(api: GitHubStandIn, tmp_path: Path, number: int | None = 7) -> dict[str, str]:
    return {
        "GITHUB_API_URL": api.url,
        "GITHUB_REPOSITORY": "octo/agents",
        "GITHUB_EVENT_PATH": _event(tmp_path, number),
        "GITHUB_TOKEN": TOKEN,
    }


def _body(tmp_path: Path, text: str) -> str:
    path = tmp_path / "body.md"
    path.write_text(text)
    return str(path)


def test_the_comment_is_posted_once_then_updated(tmp_path: Path) -> None:
    with GitHubStandIn(TOKEN) as api:
        for n in range(150):  # ours is on the second page of 100
            api.add("octo/agents", 7, f"review {n}")
        environ = _environ(api, tmp_path)
        assert comment_main([_body(tmp_path, "### first\n")], environ) == 0
        assert comment_main([_body(tmp_path, "### second\n")], environ) == 0
        bodies = api.comments("octo/agents", 7)
        assert len(bodies) == 151
        assert bodies[-1] == f"{MARKER}\n### second\n"
        methods = [m for m, _ in api.requests]
        assert methods == ["GET", "GET", "POST", "GET", "GET", "PATCH"]
        assert "page=2" in api.requests[1][1]


def test_a_long_body_is_cut_to_what_github_takes(tmp_path: Path) -> None:
    with GitHubStandIn(TOKEN) as api:
        assert comment_main([_body(tmp_path, "x" * 70_000)], _environ(api, tmp_path)) == 0
        (body,) = api.comments("octo/agents", 7)
        assert len(body) == MAX_BODY and body.startswith(MARKER) and "(cut:" in body


def test_the_comment_refuses_without_a_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with GitHubStandIn(TOKEN) as api:
        environ = _environ(api, tmp_path)
        del environ["GITHUB_TOKEN"]
        assert comment_main([_body(tmp_path, "x")], environ) == 2
        assert "GITHUB_TOKEN is not set" in capsys.readouterr().err
        environ["GITHUB_TOKEN"] = "wrong"
        assert comment_main([_body(tmp_path, "x")], environ) == 1
        err = capsys.readouterr().err
        assert "401" in err and "Bad credentials" in err and "wrong" not in err
        assert api.comments("octo/agents", 7) == []


def test_a_token_that_may_not_write_or_no_pull_request_posts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with GitHubStandIn(TOKEN, read_only=True) as api:
        assert comment_main([_body(tmp_path, "x")], _environ(api, tmp_path)) == 0
        assert "403" in capsys.readouterr().err
        assert comment_main([_body(tmp_path, "x")], _environ(api, tmp_path, None)) == 0
        assert "not a pull request" in capsys.readouterr().err
        assert api.comments("octo/agents", 7) == []


# action.yml, its steps run as the runner runs them.

_EXPRESSION = re.compile(r"\$\{\{\s*(.+?)\s*\}\}")


class Runner:
    """Runs a composite action's `run:` steps with bash as GitHub does (`bash
    --noprofile --norc -eo pipefail`), its `${{ }}` expressions and `if:` conditions
    evaluated over the inputs, `github` and earlier steps' outputs."""

    def __init__(self, action: dict[str, Any], inputs: dict[str, str], env: dict[str, str]):
        self.github = {"action_path": str(ROOT), "token": TOKEN}
        self.inputs: dict[str, str] = {}
        defaults = {
            k: self.substitute(str(v.get("default", ""))) for k, v in action["inputs"].items()
        }
        self.inputs = {**defaults, **inputs}
        self.outputs: dict[str, dict[str, str]] = {}
        self.env = env
        self.codes: dict[str, int] = {}

    def value(self, expression: str) -> str:
        scope, _, rest = expression.partition(".")
        if scope == "inputs":
            return self.inputs[rest]
        if scope == "github":
            return self.github[rest]
        step, _, output = rest.partition(".outputs.")
        assert scope == "steps", expression
        return self.outputs.get(step, {}).get(output, "")

    def substitute(self, text: str) -> str:
        return _EXPRESSION.sub(lambda m: self.value(m.group(1)), text)

    def condition(self, text: str) -> bool:
        text = text.replace("always()", "True").replace("&&", " and ").replace("||", " or ")
        reference = re.compile(r"\b(?:inputs|github|steps)\.[\w.-]+")
        return bool(eval(reference.sub(lambda m: repr(self.value(m.group(0))), text)))

    def run(self, index: int, step: dict[str, Any], folder: Path) -> None:
        output = folder / f"output-{index}"
        output.touch()
        env = {**self.env, "GITHUB_OUTPUT": str(output)}
        env.update({k: self.substitute(str(v)) for k, v in step.get("env", {}).items()})
        done = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
            env=env,
            cwd=self.env["GITHUB_WORKSPACE"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        self.codes[step["id"]] = done.returncode
        self.env.setdefault("LOG", "")
        self.env["LOG"] += done.stdout + done.stderr
        pairs = (line.split("=", 1) for line in output.read_text().splitlines() if "=" in line)
        self.outputs[step["id"]] = dict(pairs)


def test_the_action_runs_gates_reports_and_comments(
    demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    steps = action["runs"]["steps"]
    uses = [s["uses"].split("@")[0] for s in steps if "uses" in s]
    assert uses == ["actions/setup-python", "actions/upload-artifact"]
    shutil.copy(CONFIG, demo / "agenttest.yaml")
    _cases(demo)
    # main's promoted run: T004 and T005 fail there too, known failures on the PR.
    assert main(["-i", "cases/expense.jsonl", "-n", "assistants.expense", "--suite", "main"]) == 1
    assert main(["promote", "last"]) == 0
    capsys.readouterr()
    folder = tmp_path / "runner"
    folder.mkdir()
    summary = folder / "summary.md"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "GITHUB_ACTIONS": "true",
        "GITHUB_WORKSPACE": str(demo),
        "GITHUB_STEP_SUMMARY": str(summary),
        "RUNNER_TEMP": str(folder),
    }
    inputs = {
        "cases": "cases/expense.jsonl",
        "agent": "assistants.expense",
        "args": "--suite pr-7",
        "baseline": "suite:main",
        "fail-on": "regressions,new",
    }
    with GitHubStandIn(TOKEN) as api:
        env.update(
            GITHUB_API_URL=api.url,
            GITHUB_REPOSITORY="octo/agents",
            GITHUB_EVENT_PATH=_event(folder, 7),
        )
        runner = Runner(action, inputs, env)
        for index, step in enumerate(steps):
            if "run" not in step or step["id"] == "install":
                continue  # the actions, and pip: this test runs from the installed tree
            if runner.condition(step.get("if", "True")):
                runner.run(index, step, folder)
        comments = api.comments("octo/agents", 7)
    log = runner.env["LOG"]
    assert len(comments) == 1, log[-3000:]
    comment = comments[0]
    assert runner.codes == {"run": 0, "report": 0, "comment": 0, "verdict": 0}, log
    # Both failures are known (they failed on main): the gate passes; the annotations stay.
    assert runner.outputs["run"]["exit-code"] == "0"
    assert log.count("::error file=cases/expense.jsonl,line=") == 2
    assert (demo / "agenttest-report.html").read_text().startswith("<!DOCTYPE html>")
    text = summary.read_text()
    # The run wrote its summary and its diff against main's baseline, once.
    assert text.startswith("### agenttest — failed\n") and text.count("#### Still failing (2)") == 1
    assert comment.startswith(MARKER + "\n### agenttest — failed\n")
    assert "- **T005** (failed → failed)" in comment
    assert "**T004**" in comment and "Run `" in comment and "against" in comment


def test_the_action_fails_its_step_per_the_runs_exit_code(demo: Path, tmp_path: Path) -> None:
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    shutil.copy(CONFIG, demo / "agenttest.yaml")
    _cases(demo)
    folder = tmp_path / "runner"
    folder.mkdir()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "GITHUB_ACTIONS": "true",
        "GITHUB_WORKSPACE": str(demo),
        "GITHUB_STEP_SUMMARY": str(folder / "summary.md"),
        "RUNNER_TEMP": str(folder),
        "GITHUB_EVENT_PATH": _event(folder, None),
    }
    runner = Runner(action, {"cases": "cases/expense.jsonl", "agent": "assistants.expense"}, env)
    for index, step in enumerate(action["runs"]["steps"]):
        if "run" in step and step["id"] != "install" and runner.condition(step.get("if", "True")):
            runner.run(index, step, folder)
    assert runner.outputs["run"]["exit-code"] == "1"
    assert runner.codes["verdict"] == 1 and runner.codes["comment"] == 0
    assert "not a pull request" in runner.env["LOG"]
