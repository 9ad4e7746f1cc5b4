"""The `agenttest-submit` console script loses nothing on the way out.

Real processes: the console script against the demo agents over HTTP (exit codes, a
report piped to stdout in full, the SQLite store folded back into one file).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from test_cli_run import SUITE_CONFIG, submit_env

SCRIPT = Path(sys.executable).with_name("agenttest-submit")


def submit(
    cwd: Path, demo_url: str, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A run of the demo expense agent, plus `argv` (and `env` added to its environment)."""
    agent = ["--config", SUITE_CONFIG, "-n", "assistants.expense"]
    return command(cwd, demo_url, *agent, *argv, env=env)


def command(
    cwd: Path, demo_url: str, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = submit_env(cwd / "home") | {"AGENTTEST_DEMO_URL": demo_url} | (env or {})
    return subprocess.run(
        [str(SCRIPT), *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=90,
    )


def write_cases(path: Path, count: int, expected: str) -> Path:
    check = {"type": "contains", "value": expected}
    cases = ({"id": f"C{n:04d}", "input": "Hello", "assertions": [check]} for n in range(count))
    path.write_text("".join(json.dumps(case) + "\n" for case in cases), encoding="utf-8")
    return path


def test_the_console_script_is_the_command_lines_main() -> None:
    text = SCRIPT.read_text(encoding="utf-8")
    assert "agenttest_submit.cli" in text, "reinstall: pip install -e ."


def test_exit_codes_and_a_piped_report_arrive_whole(demo_url: str, tmp_path: Path) -> None:
    """Exit 0, 1 and 2; 400 records on a pipe, none cut off by the exit."""
    passing = write_cases(tmp_path / "pass.jsonl", 400, "Hello")
    done = submit(tmp_path, demo_url, "-i", str(passing), "--format", "jsonl", "--parallel", "50")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["id"] for r in records] == [f"C{n:04d}" for n in range(400)]
    assert {r["status"] for r in records} == {"passed"}

    failing = write_cases(tmp_path / "fail.jsonl", 3, "no such words")
    done = submit(tmp_path, demo_url, "-i", str(failing))
    assert done.returncode == 1, done.stderr
    assert "Failed:  3\n" in done.stdout and done.stdout.endswith("\n")

    done = submit(tmp_path, demo_url, "-i", str(tmp_path / "missing.jsonl"))
    assert done.returncode == 2
    assert "nothing was run" in done.stderr and "Traceback" not in done.stderr


def test_the_sqlite_store_is_one_file_after_a_run(demo_url: str, tmp_path: Path) -> None:
    """The write-ahead log is folded back into the database before the process leaves."""
    cases = write_cases(tmp_path / "cases.jsonl", 20, "Hello")
    done = submit(tmp_path, demo_url, "-i", str(cases))
    assert done.returncode == 0, done.stderr
    store = tmp_path / "home"
    names = sorted(p.name for p in store.rglob("agenttest.db*"))
    assert "agenttest.db" in names
    assert not [name for name in names if name.endswith(("-wal", "-shm", "-journal"))], names
    [run_id] = re.findall(r"Run: (\S+)", done.stdout)
    status = command(tmp_path, demo_url, "status", run_id)
    assert status.returncode == 0, status.stderr
    assert "20/20" in status.stdout, status.stdout
