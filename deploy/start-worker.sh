#!/usr/bin/env bash
# Start one agenttest worker (the worker image's default command).
#
#   1. wait until the result store (AGENTTEST_DATABASE_URL) accepts connections,
#      for at most DB_WAIT_TIMEOUT seconds (default 60);
#   2. bring its schema up to date (`agenttest-submit db upgrade`: Alembic under an
#      advisory lock, so many workers starting at once migrate it exactly once);
#   3. become the Celery worker (exec: SIGTERM from `docker stop` / Kubernetes reaches
#      Celery itself, which does a warm shutdown: it stops taking tasks and finishes
#      the turns it is running; give it a grace period longer than a turn).
#
# Settings: AGENTTEST_BROKER_URL and AGENTTEST_DATABASE_URL (required),
# AGENTTEST_QUEUE (default agenttest), AGENTTEST_WORKER_CONCURRENCY (threads, default
# 64), LOG_LEVEL (default INFO), DB_WAIT_TIMEOUT (seconds, default 60),
# DB_WAIT_INTERVAL (seconds between connection attempts, default 1; the tests shorten
# it, deployments keep the default). Extra arguments are passed to `celery worker`.
set -euo pipefail

log() { echo "start-worker: $*" >&2; }

if [[ -z "${AGENTTEST_BROKER_URL:-}" ]]; then
  log "AGENTTEST_BROKER_URL is not set (e.g. redis://redis:6379/0); a worker needs the broker"
  exit 2
fi
if [[ -z "${AGENTTEST_DATABASE_URL:-}" ]]; then
  log "AGENTTEST_DATABASE_URL is not set (e.g. postgresql://agenttest:PASSWORD@postgres:5432/agenttest)"
  exit 2
fi
DB_WAIT_TIMEOUT="${DB_WAIT_TIMEOUT:-60}"
if ! [[ "$DB_WAIT_TIMEOUT" =~ ^[0-9]+$ ]]; then
  log "DB_WAIT_TIMEOUT must be a whole number of seconds, not '$DB_WAIT_TIMEOUT'"
  exit 2
fi
DB_WAIT_INTERVAL="${DB_WAIT_INTERVAL:-1}"
if ! [[ "$DB_WAIT_INTERVAL" =~ ^[0-9]+(\.[0-9]+)?$ ]] || [[ "$DB_WAIT_INTERVAL" =~ ^0+(\.0+)?$ ]]; then
  log "DB_WAIT_INTERVAL must be a positive number of seconds, not '$DB_WAIT_INTERVAL'"
  exit 2
fi

# Connect with the project's own URL handling (postgresql:// means psycopg 3), retrying
# every DB_WAIT_INTERVAL seconds (default: every second) until the deadline. Messages
# never show the password.
wait_for_db='
import os, sys, time
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool
from agenttest_worker.store.sql.db import normalize_url
raw = os.environ["AGENTTEST_DATABASE_URL"]
try:
    url = normalize_url(raw)
except Exception as exc:
    sys.exit(f"start-worker: AGENTTEST_DATABASE_URL is not a database URL: {type(exc).__name__}")
safe = make_url(raw).render_as_string(hide_password=True)
timeout = int(os.environ["DB_WAIT_TIMEOUT"])
interval = float(os.environ["DB_WAIT_INTERVAL"])
start = time.monotonic()
attempt = 0
while True:
    attempt += 1
    waited = time.monotonic() - start
    # libpq rounds connect_timeout up to 2 s; never wait much past the deadline.
    engine = create_engine(url, poolclass=NullPool,
                           connect_args={"connect_timeout": max(2, min(5, int(timeout - waited)))})
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        break
    except Exception as exc:
        error = " ".join(str(getattr(exc, "orig", None) or exc).split())[:300]
    finally:
        engine.dispose()
    waited = time.monotonic() - start
    if waited >= timeout:
        sys.exit(f"start-worker: database {safe} not reachable after {timeout}s "
                 f"({attempt} attempts); last error: {error}")
    if attempt == 1 or attempt % 10 == 0:
        print(f"start-worker: waiting for database {safe} ({int(waited)}s of {timeout}s): "
              f"{error}", file=sys.stderr, flush=True)
    time.sleep(max(0.0, min(interval, timeout - waited)))
print(f"start-worker: database {safe} is reachable", file=sys.stderr, flush=True)
'
case "$AGENTTEST_DATABASE_URL" in
  sqlite:*) log "SQLite result store: nothing to wait for (use PostgreSQL for a fleet)" ;;
  *) DB_WAIT_TIMEOUT="$DB_WAIT_TIMEOUT" DB_WAIT_INTERVAL="$DB_WAIT_INTERVAL" python -c "$wait_for_db" ;;
esac

log "migrating the result store"
agenttest-submit db upgrade

queue="${AGENTTEST_QUEUE:-agenttest}"
concurrency="${AGENTTEST_WORKER_CONCURRENCY:-64}"
log "starting celery worker on queue ${queue} with ${concurrency} threads"
exec celery -A agenttest_worker worker \
  --loglevel="${LOG_LEVEL:-INFO}" \
  --concurrency="${concurrency}" \
  -n "worker@%h" \
  -Q "${queue}" \
  "$@"
