"""Every setting in one place, read from the environment with the prefix AGENTTEST_.

With no AGENTTEST_BROKER_URL, runs execute in-process (the embedded default) and
results go to a SQLite file under AGENTTEST_HOME; set the broker and database URLs to
run on a worker fleet.

The environment is read by `Settings.from_environment` into a plain pydantic model:
names are matched case-insensitively, values are converted and checked by the fields
(`"3600"` -> 3600, `"true"`/`"1"`/`"yes"` -> True), unknown AGENTTEST_ names are left to
whoever reads them (AGENTTEST_DEMO_URL, read by the demo suite). pydantic-settings would
do the same with one more dependency, for features (dotenv, secrets dirs, cloud sources)
unused here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agenttest_worker.errors import ConfigError, InputProblem, redact_url

PREFIX = "AGENTTEST_"

# The event loop a fleet worker plays its turns on (driver/event_loops.py).
EventLoopChoice = Literal["auto", "uvloop", "asyncio"]

# The stores this project runs on: Postgres (any psycopg-style spelling) and SQLite.
# Checked here, without importing SQLAlchemy, so that a mistyped URL is an input
# error naming the variable rather than a driver error at the first query.
REDIS_SCHEMES = ("redis://", "rediss://")
_DATABASE_URL = re.compile(r"^(postgres|postgresql|sqlite)(\+[A-Za-z0-9_]+)?://", re.IGNORECASE)


class Settings(BaseModel):
    model_config = ConfigDict(extra="ignore")

    broker_url: str | None = Field(
        default=None,
        description="Celery broker (redis://..., amqp://...); unset means embedded runs",
    )
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL of the result store; default: SQLite in home"
    )
    redis_url: str | None = Field(
        default=None,
        description="Redis (redis://... or rediss://...) holding what a fleet shares besides "
        "its messages: agents' fleet-wide rate limits and breakers; default: the broker when "
        "it is Redis. Set it beside another broker (RabbitMQ), or those stay per process",
    )
    home: Path = Field(default=Path(".agenttest"), description="Local state for embedded runs")
    queue: str = Field(default="agenttest", description="Celery queue for turn tasks")
    celery_config: str | None = Field(
        default=None,
        description="A Python module of Celery settings the fleet's app reads besides its own "
        "(which win), such as task_routes or task_compression; every process of the fleet "
        "must import the same",
    )
    visibility_timeout: int = Field(
        default=3600,
        ge=1,
        description="Seconds before Redis redelivers an unacknowledged task; keep it above "
        "the longest turn (a turn redelivered while still running is discarded, not doubled)",
    )
    worker_gone_seconds: float = Field(
        default=15,
        gt=0,
        description="Redis broker: a worker whose presence mark is this old is gone (killed, "
        "its host lost), and the messages it held are given back at once, not after "
        "AGENTTEST_VISIBILITY_TIMEOUT; keep it above the longest pause of a live worker",
    )
    restore_interval: int = Field(
        default=10, ge=1, description="Seconds between workers' sweeps for abandoned tasks"
    )
    worker_concurrency: int = Field(
        default=64,
        ge=1,
        description="Turns one worker process keeps in flight (waiting on agents) at once",
    )
    max_conversation_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=1,
        description="Bytes of inputs and replies one conversation may hold (UTF-8); the turn "
        "that passes it fails its case, naming the bound (docs/conversations.md)",
    )
    max_redeliveries: int = Field(
        default=3,
        ge=1,
        description="Deaths of the worker running a turn alone (a redelivered turn runs "
        "alone, fleet/isolation.py) before its case fails",
    )
    store_retry_seconds: float = Field(
        default=300,
        ge=0,
        description="How long a write the database refuses for now (a statement timeout, a "
        "serialization failure, a deadlock, the disk full) is tried again before its step "
        "gives up; keep it below the stall threshold",
    )
    stall_seconds: float = Field(
        default=600,
        gt=0,
        description="A running conversation not moved for this long is presumed lost (the "
        "broker dropped its message) and its next turn is enqueued again; keep it above the "
        "longest turn",
    )
    reply_cache_ttl: float = Field(
        default=14 * 86400,
        gt=0,
        description="Seconds an agent's cached reply is served before it is asked again",
    )
    reply_cache_max_entries: int = Field(
        default=100_000,
        ge=1,
        description="Cached replies kept; past it the oldest are evicted",
    )
    reply_cache_lease: float = Field(
        default=120,
        gt=0,
        description="Seconds callers of an identical request wait for the first one's reply "
        "before calling the agent themselves",
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
    scripts_dir: Path | None = Field(
        default=None,
        description="Where `scripts:` names resolve. On a fleet, a run's stored "
        "`scripts_dir` is chosen by whoever submitted it and never used: workers play "
        "scripts from this folder only, and without it refuse every script",
    )
    breaker_failures: int = Field(
        default=3,
        ge=0,
        description="Calls in a row that cannot connect to an agent (each after its retries) "
        "before its other calls fail at once, 'agent X unreachable since <time>', until a "
        "probe gets an answer (fleet-wide with a Redis broker); 0 turns the breaker off",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Port each worker serves Prometheus metrics on (/metrics); unset: no "
        "metrics and no port opened",
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="Address a worker serves its metrics on; another than loopback "
        "(0.0.0.0 for a scraper on another host) needs AGENTTEST_METRICS_TOKEN",
    )
    metrics_token: str | None = Field(
        default=None,
        repr=False,
        description="Token every scrape of a worker's or the exporter's metrics must carry "
        "(Authorization: Bearer TOKEN, or the password of Basic auth)",
    )
    otlp_receiver_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Port agenttest-submit (embedded) and each worker receive agents' "
        "OTLP/HTTP spans on (POST /v1/traces, protobuf or JSON); unset: none received",
    )
    otlp_receiver_host: str = Field(
        default="127.0.0.1",
        description="Address the OTLP receiver listens on (0.0.0.0 for agents on other hosts)",
    )
    trace_wait: float = Field(
        default=10.0,
        ge=0,
        description="Seconds a trace assertion waits for its turn's spans to arrive (agents "
        "export in batches); it reads them once none came for half a second",
    )
    trace_url: str | None = Field(
        default=None,
        description="A trace UI's address with {trace_id}, linked from each conversation in "
        "the HTML report and the viewer (https://jaeger.example/trace/{trace_id})",
    )
    event_loop: EventLoopChoice = Field(
        default="auto",
        description="The event loop a fleet worker plays its turns on: uvloop's (about a "
        "tenth less CPU per turn), asyncio's own, or uvloop's where it is installed "
        "('auto'; it is on every platform but Windows)",
    )
    debug: bool = Field(default=False, description="Print tracebacks for internal errors")

    @field_validator(
        "scripts_dir",
        "metrics_port",
        "metrics_token",
        "celery_config",
        "otlp_receiver_port",
        "trace_url",
        mode="before",
    )
    @classmethod
    def _unset_when_empty(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("redis_url")
    @classmethod
    def _redis(cls, url: str | None) -> str | None:
        if url and not url.strip().startswith(REDIS_SCHEMES):
            raise ValueError("not a Redis URL: give redis://HOST:6379/0 or rediss://...")
        return url.strip() if url else None

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, url: str | None) -> str | None:
        if url is None:
            return None
        url = url.strip()
        if url and not _DATABASE_URL.match(url):
            raise ValueError(
                "not a database URL agenttest can use: give postgresql://USER@HOST:5432/DB "
                "or sqlite:///PATH"
            )
        return url

    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.home / 'agenttest.db').resolve()}"

    @property
    def distributed(self) -> bool:
        return bool(self.broker_url)

    @property
    def shared_redis_url(self) -> str | None:
        """The Redis a fleet's rate limits and breakers are kept in (AGENTTEST_REDIS_URL,
        else a Redis broker), or None: each process keeps its own."""
        broker = self.broker_url or ""
        return self.redis_url or (broker if broker.startswith(REDIS_SCHEMES) else None)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings given by AGENTTEST_* variables; a bad value is a ConfigError
        naming the variable (exit code 2), not a traceback."""
        environ = os.environ if environ is None else environ
        values = {
            name[len(PREFIX) :].lower(): value
            for name, value in environ.items()
            if name.upper().startswith(PREFIX)
        }
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise ConfigError(
                [
                    InputProblem(
                        f"{error['msg']} (got {_shown(error['input'])!r})",
                        field=PREFIX + ".".join(str(part) for part in error["loc"]).upper(),
                    )
                    for error in exc.errors()
                ]
            ) from None


def _shown(value: object) -> object:
    """A rejected value as an error may show it: a URL's secrets masked (errors.redact_url;
    not services.safe_url: SQLAlchemy's URL parser refuses the malformed URLs rejected
    here, and settings are read before SQLAlchemy is imported)."""
    return redact_url(value) if isinstance(value, str) else value


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings.from_environment()


# kombu (the workers' consumer) reads `ssl_cert_reqs` in ssl's constant names as well as
# in redis-py's words; the fleet-wide rate limits and breakers (agents/limits/ratelimit.py)
# reach the same Redis through redis-py, which reads only the words.
_CERT_REQS_WORDS = {"CERT_REQUIRED": "required", "CERT_OPTIONAL": "optional", "CERT_NONE": "none"}


def redis_py_url(broker_url: str) -> str:
    """`broker_url` as redis-py reads what kombu reads from it (`ssl_cert_reqs`)."""
    parts = urlsplit(broker_url)
    if "CERT_" not in parts.query:
        return broker_url
    query = [
        (key, _CERT_REQS_WORDS.get(value, value) if key == "ssl_cert_reqs" else value)
        for key, value in parse_qsl(parts.query, keep_blank_values=True)
    ]
    return urlunsplit(parts._replace(query=urlencode(query)))
