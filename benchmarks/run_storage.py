"""What a run stores, per conversation and per turn: the figures docs/fleet.md quotes.

    python -m benchmarks.run_storage --repeat 50

Plays the demo suite (agenttest_worker/demo/suite: four cases, the demo agents served
here) `--repeat` times as one embedded run, once into a fresh SQLite file and once into
a fresh Postgres database (AGENTTEST_TEST_PG's server, a database of its own, dropped
after), then reads what the run left:

- SQLite: the file's size (one run in it) over the run's conversations and turns
  (its rows in `turns`: every turn played, a skipped one included);
- Postgres: the rows of each of the run's tables, the bytes of those rows
  (`pg_column_size` of each row: the data itself, TOASTed values compressed), and the
  tables' total size on disk after VACUUM (indexes, TOAST and page space included),
  over the run's conversations and turns.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg

from agenttest_worker.demo.demo_server import DemoServer

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "agenttest_worker" / "demo" / "suite"
TABLES = (
    "runs",
    "cases",
    "turns",
    "turn_records",
    "assertion_results",
    "agent_calls",
    "run_reports",
)
PG_ADMIN = os.environ.get("AGENTTEST_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def play(repeat: int, env: dict[str, str]) -> None:
    args = ["-i", str(SUITE / "expense-suite.jsonl"), "-n", "assistants.expense"]
    args += ["--config", str(SUITE / "agenttest.yaml"), "--repeat", str(repeat), "-o", os.devnull]
    done = subprocess.run(
        [sys.executable, "-m", "agenttest_submit.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode not in (0, 1):
        raise SystemExit(f"the run failed ({done.returncode}):\n{done.stderr}")


def counts(connection: psycopg.Connection[tuple[object, ...]]) -> tuple[int, int]:
    row = connection.execute(
        "SELECT (SELECT count(*) FROM cases), (SELECT count(*) FROM turns)"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])  # type: ignore[call-overload]


def sqlite_figures(repeat: int, env: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as home:
        play(repeat, {**env, "AGENTTEST_HOME": home})
        path = Path(home) / "agenttest.db"
        import sqlite3

        with sqlite3.connect(path) as connection:
            cases, turns = connection.execute(
                "SELECT total_cases, total_turns FROM runs"
            ).fetchone()
        size = path.stat().st_size
    print(f"SQLite: {cases} conversations, {turns} turns; file {size:,} B")
    print(f"  {size / cases:,.0f} B a conversation, {size / turns:,.0f} B a turn")


def postgres_figures(repeat: int, env: dict[str, str]) -> None:
    name = f"agenttest_storage_{secrets.token_hex(3)}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}"
    try:
        play(repeat, {**env, "AGENTTEST_DATABASE_URL": url})
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute("VACUUM ANALYZE")
            cases, turns = counts(connection)
            print(f"Postgres: {cases} conversations, {turns} turns")
            data_total = disk_total = 0
            for table in TABLES:
                found = connection.execute(
                    f"SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0) FROM {table} t"
                ).fetchone()
                disk = connection.execute("SELECT pg_total_relation_size(%s)", (table,)).fetchone()
                assert found is not None and disk is not None
                rows, data = int(found[0]), int(found[1])
                data_total += data
                disk_total += int(disk[0])
                print(
                    f"  {table:<18} {rows:>7,} rows  {rows / cases:>6.1f} a conversation  "
                    f"{data:>11,} B of rows  {int(disk[0]):>11,} B on disk"
                )
            print(
                f"  rows: {data_total / cases:,.0f} B a conversation, {data_total / turns:,.0f} B"
                f" a turn; on disk: {disk_total / cases:,.0f} B a conversation, "
                f"{disk_total / turns:,.0f} B a turn"
            )
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=50, help="plays of the demo suite")
    args = parser.parse_args()
    with DemoServer(port=0) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")}
        env["AGENTTEST_DEMO_URL"] = server.base_url
        sqlite_figures(args.repeat, env)
        postgres_figures(args.repeat, env)


if __name__ == "__main__":
    main()
