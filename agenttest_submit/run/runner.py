"""What every kind of run shares: its options, storing it with its cases, finding it again.

An embedded run (embedded.py), a fleet's (distributed.py) and a re-evaluation
(reeval.py) all store a run the same way: `run_options` turns the request into the
RunOptions stored with it, `store_run`/`store_records`/`write_run` create the run and
add its cases a batch at a time (handing each batch to a `RunStarter` as it is stored),
and `resolve_run` finds a stored run from a RUN argument (an id, or `last`).
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from agenttest_submit.cli.request import RunRequest
from agenttest_submit.cli.services import safe_url
from agenttest_submit.inputs.generate import take_generation_usage
from agenttest_submit.inputs.sources import FileInput, GeneratorInput, InputSource, parse_input
from agenttest_submit.run.storing import NewRun, RunStarter, write_run
from agenttest_worker.agents import ProjectConfig, find_config
from agenttest_worker.cases import Case
from agenttest_worker.engine import RunOptions
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.report import counted
from agenttest_worker.settings import get_settings
from agenttest_worker.store import StoredCase, new_run_id

if TYPE_CHECKING:
    from agenttest_worker.store import RunRow

# The store (SQLAlchemy, the models, the repository) is imported where it is used, not
# here: a new embedded run leaves it to its store's thread while its first conversations
# run (see embedded.run_embedded).


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
        cache=request.cache,
        cache_target=request.cache_target,
        awaiting_tools=list(config.awaiting_tools),
        max_tokens=request.max_tokens,
        max_cost=request.max_cost,
        repeat=request.repeat,
        repeat_auto=request.repeat_auto,
        pass_rule=request.pass_rule,
        pass_k=request.pass_k,
        max_conversation_bytes=get_settings().max_conversation_bytes,
    )


# A suite name is a column of 200 characters; a longer derived one keeps its start and
# a digest of the whole, so that two long input lists still name two suites.
SUITE_MAX = 200


def run_suite(request: RunRequest, target: str | None) -> str:
    """The suite a run belongs to: --suite, else derived from its inputs (in order) and
    its target, so that the same command run every night lands in the same suite,
    however its paths are spelled (`suite_input`)."""
    if request.suite:
        return request.suite
    base = config_folder(request.config_file)
    given = [
        *(suite_input(value, base) for value in request.inputs),
        *(f"-m {text}" for text in request.messages),
    ]
    name = f"{target or '(case agents)'}: {' '.join(given)}"
    if len(name) <= SUITE_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return f"{name[: SUITE_MAX - 14]}… {digest}"


def config_folder(config_file: str | None) -> Path:
    """The folder of the run's agenttest.yaml (the working directory without one): what
    the paths of a derived suite name are relative to."""
    found = find_config(config_file)
    return (found or Path("agenttest.yaml")).resolve().parent


def suite_input(value: str, base: Path) -> str:
    """An -i value as a suite name holds it: a case file or folder as its path relative
    to `base`, with forward slashes (`t/x.jsonl`, `./t/x.jsonl` and `/abs/t/x.jsonl`
    are one suite); a message or a generator as given."""
    try:
        source = parse_input(value)
    except InputError:
        return value.strip()
    if isinstance(source, GeneratorInput):
        return source.describe()  # its key-like parameters masked
    if not isinstance(source, FileInput):
        return value.strip()
    found = source.path.resolve()
    relative = Path(os.path.relpath(found, base)).as_posix()
    return relative + "/" if found.is_dir() else relative


def input_label(sources: Iterable[InputSource], count: int) -> str:
    return ", ".join(s.describe() for s in sources) or counted(count, "case")


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


def new_run(
    options: RunOptions,
    config: ProjectConfig,
    target: str | None,
    label: str,
    deadline: float | None,
    *,
    parent_run_id: str | None = None,
    suite: str | None = None,
    started_at: datetime | None = None,
) -> NewRun:
    """A new run as it is stored: a fresh id, its options and config as stored, its
    deadline from now, and what the generators of its cases called."""
    return NewRun(
        run_id=new_run_id(),
        options=options.model_dump(mode="json"),
        config=config.stored(),
        target=target,
        label=label,
        deadline_at=time.time() + deadline if deadline else None,
        parent_run_id=parent_run_id,
        suite=suite,
        started_at=started_at,
        generation_usage=take_generation_usage(),
    )


def store_records(
    url: str,
    records: Iterable[StoredCase],
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
    run = new_run(
        options, config, target, label, deadline, parent_run_id=parent_run_id, suite=suite
    )
    return run.run_id, write_run(url, run, records, starter)


def resolve_run(url: str, ref: str) -> RunRow:
    """The stored run a RUN argument names: a run id, or `last` for the newest run."""
    from agenttest_worker.store import runs  # the store: see the note at the top

    run = runs.latest_run(url) if ref == "last" else runs.get_run(url, ref)
    if run is None:
        what = "no runs yet" if ref == "last" else f"no run {ref!r}"
        raise InputError(InputProblem(f"{what} in {safe_url(url)}", field="RUN"))
    return run
