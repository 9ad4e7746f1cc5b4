"""What every kind of run shares: its options, storing it with its cases, finding it again.

An embedded run (embedded.py), a fleet's (distributed.py) and a re-evaluation
(reeval.py) all store a run the same way: `run_options` turns the request into the
RunOptions stored with it, `store_run`/`store_records`/`write_run` create the run and
add its cases a batch at a time (handing each batch to a `RunStarter` as it is stored),
and `resolve_run` finds a stored run from a RUN argument (an id, or `last`).
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from itertools import islice
from typing import TYPE_CHECKING, Any, Protocol

from agenttest_submit.generate import take_generation_usage
from agenttest_submit.inputs import InputSource
from agenttest_submit.request import RunRequest
from agenttest_submit.services import safe_url
from agenttest_submit.storing import POSTGRES_WRITERS, write_batches
from agenttest_worker.agents.config import ProjectConfig
from agenttest_worker.cases.model import Case
from agenttest_worker.engine import RunOptions
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.results import RoleUsage, UsageRole
from agenttest_worker.settings import get_settings
from agenttest_worker.store import steps

if TYPE_CHECKING:
    from agenttest_worker.report.model import RunReport
    from agenttest_worker.store.models import RunRow

# The store (SQLAlchemy, the models, the repository) is imported where it is used, not
# here: a new embedded run imports it on a thread while its first conversations run
# (see embedded.run_embedded).


def run_options(request: RunRequest, config: ProjectConfig, target: str | None) -> RunOptions:
    interactive: bool | None
    if request.skip_interactive or not sys.stdin.isatty():
        # Without a terminal there is nobody to ask: on_missing_input decides.
        interactive = False
    elif request.interactive:
        interactive = True
    else:
        interactive = None
    return RunOptions(
        target=target,
        connector=request.connector,
        on_missing_input=request.on_missing_input,
        interactive=interactive,
        case_timeout=request.case_timeout,
        turn_timeout=request.turn_timeout,
        fail_fast=request.fail_fast,
        awaiting_tools=list(config.awaiting_tools),
        max_tokens=request.max_tokens,
        max_cost=request.max_cost,
        repeat=request.repeat,
        pass_rule=request.pass_rule,
        pass_k=request.pass_k,
    )


# A suite name is a column of 200 characters; a longer derived one keeps its start and
# a digest of the whole, so that two long input lists still name two suites.
SUITE_MAX = 200


def run_suite(request: RunRequest, target: str | None) -> str:
    """The suite a run belongs to: --suite, else derived from its inputs (as given to
    -i, in order) and its target, so that the same command run every night lands in
    the same suite."""
    if request.suite:
        return request.suite
    name = f"{target or '(case agents)'}: {' '.join(request.inputs)}"
    if len(name) <= SUITE_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return f"{name[: SUITE_MAX - 14]}… {digest}"


def input_label(sources: Iterable[InputSource], count: int) -> str:
    return ", ".join(s.describe() for s in sources) or f"{count} cases"


def _batches(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while batch := list(islice(iterator, size)):
        yield batch


def store_run(
    url: str,
    cases: Iterable[Case],
    *,
    options: RunOptions,
    config: ProjectConfig,
    target: str | None,
    label: str,
    deadline: float | None = None,
    parent_run_id: str | None = None,
    suite: str | None = None,
) -> tuple[str, int]:
    """Create the run and its cases; returns (run id, number of cases)."""
    records = ((c.key, c.agent or target, c.to_run_record()) for c in cases)
    return store_records(
        url,
        records,
        options=options,
        config=config,
        target=target,
        label=label,
        deadline=deadline,
        parent_run_id=parent_run_id,
        suite=suite,
    )


class RunStarter(Protocol):
    """Starts a run's conversations while the rest of its cases are still being stored."""

    def stored(self, run_id: str, first: int, last: int) -> None:
        """Cases `first`..`last` (their positions in the run) are stored."""

    def started(self, run_id: str, every_case_ended: bool) -> None:
        """Every case is stored and the run is running; its conversations may all have
        ended already (then nobody else will enqueue its aggregation)."""


def store_records(
    url: str,
    records: Iterable[steps.StoredCase],
    *,
    options: RunOptions,
    config: ProjectConfig,
    target: str | None,
    label: str,
    deadline: float | None = None,
    parent_run_id: str | None = None,
    starter: RunStarter | None = None,
    suite: str | None = None,
) -> tuple[str, int]:
    """Create the run and store (case id, agent, record) rows a batch at a time."""
    run_id = steps.new_run_id()
    total = write_run(
        url,
        run_id,
        records,
        options=options.model_dump(mode="json"),
        config=config.stored(),
        target=target,
        label=label,
        deadline_at=time.time() + deadline if deadline else None,
        parent_run_id=parent_run_id,
        starter=starter,
        suite=suite,
        generation_usage=take_generation_usage(),
    )
    return run_id, total


def write_run(
    url: str,
    run_id: str,
    records: Iterable[steps.StoredCase],
    *,
    options: dict[str, Any],
    config: dict[str, Any],
    target: str | None,
    label: str,
    deadline_at: float | None,
    parent_run_id: str | None = None,
    starter: RunStarter | None = None,
    started_at: datetime | None = None,
    suite: str | None = None,
    generation_usage: Mapping[UsageRole, RoleUsage] | None = None,
) -> int:
    """Bring the store up to date, create the run, add its cases, start it.

    `generation_usage` is what the generators of its cases called (take_generation_usage,
    taken by the caller: this may run in the store's own process, which has none).

    With a `starter`, each batch of cases is handed to it as soon as it is stored, so
    a fleet works on the first conversations while the rest are written. The run's
    start (what its reports' duration counts from) is `started_at` if given (an
    embedded run's conversations begin before it is stored), else when the first batch
    was handed out, else now.
    """
    # The store: see the note at the top.
    from agenttest_worker.store import runs
    from agenttest_worker.store.db import is_sqlite, upgrade
    from agenttest_worker.store.usage import usage_document

    upgrade(url)
    runs.create_run(
        url,
        run_id=run_id,
        agent=target,
        input_label=label,
        options=options,
        config=config,
        parent_run_id=parent_run_id,
        deadline_at=deadline_at,
        suite=suite,
        # The generator agents called for these cases: before the run, in no conversation.
        usage=usage_document(generation_usage or {}),
    )
    rows = (
        runs.NewCase(seq=i, case_id=case_id, case=record, agent=agent)
        for i, (case_id, agent, record) in enumerate(records)
    )
    first_started: datetime | None = None

    def stored(first: int, last: int) -> None:
        nonlocal first_started
        if starter is not None:
            first_started = first_started or datetime.now(UTC)
            starter.stored(run_id, first, last)

    try:
        total = write_batches(
            _batches(rows, get_settings().enqueue_batch),
            lambda batch: runs.add_cases(url, run_id, batch),
            stored,
            writers=1 if is_sqlite(url) else POSTGRES_WRITERS,
        )
    except BaseException:
        # Conversations of the batches already started find their run gone and stop.
        runs.delete_run(url, run_id)
        raise
    every_case_ended = runs.start_run(url, run_id, total, started_at=started_at or first_started)
    if starter is not None:
        starter.started(run_id, every_case_ended)
    return total


def aggregate_run(url: str, run_id: str) -> RunReport | None:
    """fleet.aggregate.aggregate, imported where it runs: an embedded run aggregates in
    the process that does its store's work (store/store_process.py)."""
    from agenttest_worker.fleet.aggregate import aggregate  # the store: see the note at the top

    return aggregate(url, run_id)


def resolve_run(url: str, ref: str) -> RunRow:
    """The stored run a RUN argument names: a run id, or `last` for the newest run."""
    from agenttest_worker.store import runs  # the store: see the note at the top

    run = runs.latest_run(url) if ref == "last" else runs.get_run(url, ref)
    if run is None:
        what = "no runs yet" if ref == "last" else f"no run {ref!r}"
        raise InputError(InputProblem(f"{what} in {safe_url(url)}", field="RUN"))
    return run
