"""Every setting in one place, read from the environment with the prefix AGENTTEST_.

With no AGENTTEST_BROKER_URL, runs execute in-process (the embedded default) and
results go to a SQLite file under AGENTTEST_HOME; set the broker and database URLs to
run on a worker fleet.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AGENTTEST_", extra="ignore")

    broker_url: str | None = Field(
        default=None, description="Celery broker (redis://...); unset means embedded runs"
    )
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL of the result store; default: SQLite in home"
    )
    home: Path = Field(default=Path(".agenttest"), description="Local state for embedded runs")
    queue: str = Field(default="agenttest", description="Celery queue for turn tasks")
    visibility_timeout: int = Field(
        default=3600,
        ge=1,
        description="Seconds before Redis redelivers an unacknowledged task; keep it above "
        "the longest turn (a turn redelivered while still running is discarded, not doubled)",
    )
    restore_interval: int = Field(
        default=10, ge=1, description="Seconds between workers' sweeps for abandoned tasks"
    )
    worker_concurrency: int = Field(
        default=64, ge=1, description="Turn tasks one worker process runs at a time (threads)"
    )
    max_redeliveries: int = Field(
        default=3, ge=1, description="Deliveries of one turn before the case fails"
    )
    stall_seconds: float = Field(
        default=600,
        gt=0,
        description="A running conversation not moved for this long is presumed lost (the "
        "broker dropped its message) and its next turn is enqueued again; keep it above the "
        "longest turn",
    )
    worker_sweeper: bool = Field(
        default=True,
        description="Every worker sweeps for stalled runs in a thread; turn off when "
        "`celery -A agenttest_worker beat` runs the sweep instead",
    )
    task_events: bool = Field(
        default=False,
        description="Workers send task events from the start; Flower turns them on in the "
        "workers it watches anyway (its --enable-events default)",
    )
    enqueue_batch: int = Field(default=500, ge=1, description="Cases stored/enqueued per batch")
    http_pool_size: int = Field(default=200, ge=1, description="Connections per agent host")
    debug: bool = Field(default=False, description="Print tracebacks for internal errors")

    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.home / 'agenttest.db').resolve()}"

    @property
    def distributed(self) -> bool:
        return bool(self.broker_url)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
