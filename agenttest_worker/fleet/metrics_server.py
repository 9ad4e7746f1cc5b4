"""Serving a worker's Prometheus metrics (observe/metrics.py) on AGENTTEST_METRICS_PORT.

Unset, nothing happens: no port is opened and prometheus_client is never imported.

Set, the worker's main process serves `/metrics` on that port from the start
(`celeryd_init`, before the pool starts). With the threads pool (the default), and the
solo, gevent and eventlet pools, every turn runs in that process and its metrics are
plain in-memory ones. With the prefork pool the turns run in child processes, whose
counts the main process cannot see: prometheus_client's multiprocess mode has each
process write its metrics to files in PROMETHEUS_MULTIPROC_DIR, and the main process
adds them up at each scrape. The directory is the one the environment names, else a
fresh temporary one; it must start empty (stale files would be counted again), so its
metric files are removed at start. The variable is set here, before prometheus_client
is imported, so the children forked later inherit both. A child that ends
(`worker_process_shutdown`), or that was killed without a word (found at each scrape),
has its live gauges dropped; its counters stay counted.

The port is bound on AGENTTEST_METRICS_HOST, 127.0.0.1 unless told otherwise; another
address (0.0.0.0 where Prometheus scrapes from another host or pod) needs
AGENTTEST_METRICS_TOKEN, which every scrape must then carry (observe/exposition.py).
"""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import tempfile
from typing import Any

from celery.signals import celeryd_init, worker_process_shutdown, worker_shutdown

from agenttest_worker.observe import MetricsEndpoint, MetricsServer, metrics, serve_metrics
from agenttest_worker.settings import get_settings

log = logging.getLogger("agenttest.metrics")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Pools whose tasks run in forked child processes.
_FORKING_POOLS = ("prefork", "processes")
# Live gauges' files, one per process: gauge_livesum_<pid>.db and the like.
_LIVE_FILE = re.compile(r"gauge_live\w+?_(\d+)\.db$")


class _Served:
    def __init__(self) -> None:
        self.server: MetricsServer | None = None
        self.directory: str | None = None  # the multiprocess directory, when in use
        self.made_directory = False  # created here, so removed at shutdown


_served = _Served()


def forks(pool: object) -> bool:
    """Whether `pool` (a name, an alias or a pool class) runs tasks in child processes."""
    if not isinstance(pool, str):
        pool = f"{getattr(pool, '__module__', '')}:{getattr(pool, '__qualname__', '')}"
    name = pool.lower()
    return name in _FORKING_POOLS or name.startswith("celery.concurrency.prefork")


def serve(endpoint: MetricsEndpoint, multiprocess: bool) -> None:
    """Turn this process's metrics on and serve them (and its children's) at `endpoint`."""
    if _served.server is not None:
        return
    if multiprocess:
        _prepare_directory()
    from prometheus_client import REGISTRY, CollectorRegistry

    if multiprocess:
        from prometheus_client import values

        if not getattr(values.ValueClass, "_multiprocess", False):
            # Something imported prometheus_client before the worker started, without
            # the directory: metrics made from now on must still go to the files.
            values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
        registry = CollectorRegistry()
        registry.register(_Children())
    else:
        registry = REGISTRY
    metrics.enable()
    _served.server = serve_metrics(registry, endpoint)
    log.info(
        "serving Prometheus metrics on %s:%d%s%s",
        endpoint.host,
        _served.server.port,
        " (token required)" if endpoint.token else "",
        " (prefork: the pool's processes added up)" if multiprocess else "",
    )


def _prepare_directory() -> None:
    directory = os.environ.get(MULTIPROC_ENV)
    if directory:
        os.makedirs(directory, exist_ok=True)
        for stale in glob.glob(os.path.join(directory, "*.db")):
            os.remove(stale)
    else:
        directory = tempfile.mkdtemp(prefix="agenttest-metrics-")
        _served.made_directory = True
        os.environ[MULTIPROC_ENV] = directory
    _served.directory = directory


class _Children:
    """The multiprocess files added up, once the files of processes gone are pruned."""

    def collect(self) -> Any:
        from prometheus_client.multiprocess import MultiProcessCollector

        directory = _served.directory
        assert directory is not None
        for path in glob.glob(os.path.join(directory, "gauge_live*.db")):
            found = _LIVE_FILE.search(path)
            if found is not None and not _alive(int(found.group(1))):
                _forget(int(found.group(1)))
        collector = MultiProcessCollector(None, path=directory)  # type: ignore[no-untyped-call]
        return collector.collect()  # type: ignore[no-untyped-call]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _forget(pid: int) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, _served.directory)  # type: ignore[no-untyped-call]


def _serve_on_start(options: dict[str, Any] | None = None, conf: Any = None, **_: Any) -> None:
    settings = get_settings()
    port = settings.metrics_port
    if port is None:
        return
    endpoint = MetricsEndpoint(settings.metrics_host, port, settings.metrics_token)
    # The --pool given on the command line, else the configured one (fleet/celery_app.py).
    given = options or {}
    pool = given.get("pool") or given.get("pool_cls") or getattr(conf, "worker_pool", "threads")
    try:
        serve(endpoint, multiprocess=forks(pool))
    except (OSError, ValueError) as exc:
        # The worker still runs its turns; it says why nothing can be scraped.
        log.error("cannot serve metrics on %s:%d: %s", endpoint.host, port, exc)


def _child_gone(pid: int | None = None, **_: Any) -> None:
    if _served.directory is not None:
        _forget(pid or os.getpid())


def _stop_serving(**_: Any) -> None:
    server, _served.server = _served.server, None
    if server is not None:
        server.close()
    if _served.made_directory and _served.directory is not None:
        shutil.rmtree(_served.directory, ignore_errors=True)


# Connected by call rather than as decorators: Celery's are untyped (mypy strict).
celeryd_init.connect(_serve_on_start)
worker_process_shutdown.connect(_child_gone)
worker_shutdown.connect(_stop_serving)
