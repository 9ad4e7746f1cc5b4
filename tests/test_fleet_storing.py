"""A fleet run from the command line: stored by its submitter, its conversations
started a batch at a time as the batches are stored."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import psycopg
import redis
from fault_kit import openai_agent, write_config
from fleet import greeting_case, write_cases

from agenttest_worker.store.sql.db import upgrade


def _stored(database_url: str, run_id: str) -> tuple[str, int, int]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT status, total_cases, (SELECT count(*) FROM cases WHERE run_id = %s)"
            " FROM runs WHERE id = %s",
            [run_id, run_id],
        ).fetchone()
    assert row is not None, f"no run {run_id}"
    return str(row[0]), int(row[1]), int(row[2])


def test_a_fleet_run_is_stored_and_started_a_batch_at_a_time(
    redis_db: str, pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    upgrade(pg_database)
    config = write_config(tmp_path, {"demo": openai_agent(demo_url)})
    cases = write_cases(tmp_path, [greeting_case(f"F{i}") for i in range(7)])
    queue = f"storing-{secrets.token_hex(3)}"
    env = {
        **os.environ,
        "AGENTTEST_BROKER_URL": redis_db,
        "AGENTTEST_DATABASE_URL": pg_database,
        "AGENTTEST_QUEUE": queue,
        "AGENTTEST_ENQUEUE_BATCH": "3",
    }
    args = ["-i", str(cases), "-n", "demo", "--config", str(config), "--no-wait"]
    done = subprocess.run(
        [sys.executable, "-m", "agenttest_submit.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    run_id = done.stderr.split("run ", 1)[1].split(":", 1)[0]
    starts = [json.loads(m) for m in redis.Redis.from_url(redis_db).lrange(f"{queue}:9", 0, -1)]
    assert all(m["headers"]["task"] == "agenttest.start" for m in starts)
    assert all(m["headers"]["argsrepr"].startswith(f"('{run_id}'") for m in starts)
    assert _stored(pg_database, run_id) == ("running", 7, 7)
    assert len(starts) == 3  # 7 cases, 3 a batch
