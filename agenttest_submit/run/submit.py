"""A run request carried out: checked against agenttest.yaml, then run, re-judged or printed.

`submit` is what `agenttest-submit -i ...` (or `--reeval`) does once the command line
is parsed: it loads agenttest.yaml, checks every part of the request against it (all
the problems at once, before anything runs), expands the inputs into a stream of
checked cases, and hands them to the dry run, the re-evaluation (reeval.py), or
`run_cases`, which stores the run and runs it here (embedded.py) or on the fleet
(distributed.py). It returns the exit code.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from pathlib import Path

from agenttest_submit.cli.exits import EXIT_OK
from agenttest_submit.cli.output_file import output_problem
from agenttest_submit.cli.request import DEFAULT_SIMULATOR, RunRequest
from agenttest_submit.inputs.expand import CaseStream, Selection, Spool, print_warnings
from agenttest_submit.inputs.generate import forget_generation_usage, take_generation_usage
from agenttest_submit.inputs.golden_inputs import GoldenUse
from agenttest_submit.inputs.sources import InputSource, MessageInput, parse_inputs
from agenttest_submit.run.call_estimate import CallEstimate, count_case, estimate_lines
from agenttest_submit.run.embedded import run_embedded
from agenttest_submit.run.reporter_agent import reporter_problem
from agenttest_submit.run.runner import input_label, run_options, run_suite, store_records
from agenttest_worker.agents import (
    AgentPool,
    CachePolicy,
    ProjectConfig,
    load_config,
    parse_ref,
    warn_unverified_agents,
)
from agenttest_worker.cases import Case, check_ref
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.heap import EMBEDDED_YOUNG_THRESHOLD, YOUNG_THRESHOLD, settle
from agenttest_worker.report import counted, printable
from agenttest_worker.settings import get_settings

# reeval.py, distributed.py and rerun_selection.py are imported where they are used: they
# import the store (SQLAlchemy), which an embedded run leaves to its store's thread while
# its first conversations run (see embedded.run_embedded).


def submit(request: RunRequest) -> int:
    """Check the request, then run its cases (or re-judge or print them); the exit code."""
    forget_generation_usage()  # an earlier submission's generators are not this run's
    if request.interactive and request.skip_interactive:
        raise InputError("--interactive and --skip-interactive contradict each other")
    config = load_config(request.config_file)
    # Said once, before anything runs (the run's own calls do not say it again).
    warn_unverified_agents(config.agents)
    bad_output = output_problem(request.output)
    if request.rerun is not None and request.reeval is not None:
        raise InputError(
            InputProblem(
                "plays the cases again, --reeval judges stored conversations again: give one",
                field=request.rerun.flag,
            )
        )
    if request.reeval is not None and not request.inputs and not request.messages:
        if bad_output:
            raise InputError(bad_output)
        from agenttest_submit.run.reeval import reeval_run  # the store: see the note at the top

        return reeval_run(request, config)
    if not request.inputs and not request.messages:
        raise InputError(
            'no input: give -i FILE, -m "a message", -i - (cases on standard input) '
            "or -i agents:/scripts:GENERATOR"
        )
    sources, problems = parse_inputs(request.inputs, request.messages)
    target = request.agent or config.defaults.agent
    if bad_output:
        problems.append(bad_output)
    for flag, ref in (
        *(("-n", name) for name in request.targets or (request.agent,)),
        ("-c", request.connector),
    ):
        if ref is not None and ref not in config.agents:
            problems.append(InputProblem(config.unknown_agent_message(ref), field=flag))
    problems.extend(_targets_problems(request))
    simulator = request.simulator
    if simulator == DEFAULT_SIMULATOR:
        simulator = config.defaults.simulator
        if simulator is None:
            problems.append(
                InputProblem(
                    "names no simulator, and agenttest.yaml has no defaults.simulator",
                    field="--simulator",
                )
            )
    if simulator is not None and (message := check_ref(config, simulator, "simulator")):
        problems.append(InputProblem(message, field="--simulator"))
    if request.golden == "judge" and config.defaults.judge is None:
        problems.append(
            InputProblem(
                "judge needs a judge: set defaults.judge in agenttest.yaml", field="--golden"
            )
        )
    if request.update_golden and not request.wait:
        # The golden files are written from the run's records once it has ended.
        problems.append(
            InputProblem("records at the run's end: it needs --wait", field="--update-golden")
        )
    if reporter := reporter_problem(config, request.reporter):
        problems.append(reporter)  # not found out after the whole run
    if problems:
        raise InputError(problems)
    if any(isinstance(s, MessageInput) for s in sources) and target is None:
        raise InputError(
            InputProblem(
                "a direct message needs a target agent: add -n NAME",
                field="-i" if not request.messages else "-m",
            )
        )
    rerun = None
    if request.rerun is not None:
        # The store: see the note at the top.
        from agenttest_submit.inputs.rerun_selection import rerun_ids

        rerun = rerun_ids(store_url(), request.rerun, request.suite)
    stream = CaseStream(
        sources,
        config,
        target=target,
        simulator=simulator,
        selection=Selection(tags=list(request.tags), ids=list(request.ids), rerun=rerun),
        generators=functools.partial(generator_pool, request, config),
        golden=GoldenUse(request.golden, request.update_golden),
    )
    if request.dry_run:
        return _dry_run(stream, request, config, target)
    if request.reeval is not None:
        from agenttest_submit.run.reeval import reeval_cases  # the store: see the note at the top

        cases = list(stream)
        stream.finish()
        print_warnings(stream.warnings)
        return reeval_cases(request, config, cases)
    return run_cases(request, config, stream, sources, target)


def _targets_problems(request: RunRequest) -> list[InputProblem]:
    """What several targets (-n given more than once) cannot be combined with."""
    if not request.targets:
        return []
    problems = []
    if request.repeat_auto:
        # Its later repetitions are keyed by the case alone (driver/adaptive_repeats.py).
        problems.append(
            InputProblem("cannot be combined with several -n targets", field="--repeat")
        )
    if request.reeval is not None:
        problems.append(InputProblem("judges one run's targets: give no -n", field="--reeval"))
    return problems


def run_target(request: RunRequest, target: str | None) -> str | None:
    """The target a run is labelled with (its `agent`): "A, B" for several."""
    return ", ".join(request.targets) if request.targets else target


def store_url() -> str:
    """The store this environment's runs go to: the fleet's database, else the local one."""
    if get_settings().distributed:
        from agenttest_submit.run.distributed import database_url  # see the note at the top

        return database_url()
    return get_settings().effective_database_url()


def _nothing_to_rerun(stream: CaseStream) -> bool:
    """Whether a rerun selected no case: said on stderr (the run is then not made)."""
    rerun = stream.selection.rerun
    if rerun is None or stream.count:
        return False
    print(printable(rerun.nothing_to_run()), file=sys.stderr)
    return True


def _say_rerun(stream: CaseStream) -> None:
    rerun = stream.selection.rerun
    if rerun is not None and stream.count:
        print(
            f"rerunning {counted(stream.count, 'case')} of run {printable(rerun.run_id)} "
            f"({rerun.what})",
            file=sys.stderr,
        )


def generator_pool(request: RunRequest, config: ProjectConfig) -> AgentPool:
    """The pool `agents:` generators are called through at submission: with the reply
    cache of the store the run goes to, used as the run's flags say."""
    # Imported here: the store's SQL modules load SQLAlchemy, which a run's start-up
    # needs only once it generates cases.
    from agenttest_worker.store import reply_cache_at

    url = get_settings().effective_database_url()
    policy = CachePolicy(request.cache, request.cache_target)
    return AgentPool(config, reply_cache_at(url), policy)


# What json.dumps(ensure_ascii=False) leaves raw and a terminal would obey: DEL, the C1
# controls (0x9b is CSI on its own) and the bidirectional marks, overrides and isolates.
# Written as \uXXXX always, on a terminal or in a file someone may `cat`: the JSON
# decodes to the same strings.
_RAW_IN_JSON = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _json_line(record: object) -> str:
    text = json.dumps(record, ensure_ascii=False)
    return _RAW_IN_JSON.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text) + "\n"


def _dry_run(
    stream: CaseStream, request: RunRequest, config: ProjectConfig, target: str | None
) -> int:
    """Print (or write) the normalized cases, only once all of them proved valid; then,
    on stderr, the calls a run of them would make and their estimated cost
    (call_estimate.py)."""
    output = request.output
    estimate = CallEstimate()
    interactive = request.interactive and not request.skip_interactive

    def printed(record: dict[str, object]) -> str:
        count_case(
            estimate,
            Case.model_validate(record),
            config,
            target,
            repeat=request.repeat,
            interactive=interactive,
        )
        return _json_line(record)

    with Spool(stream, None, sources=False, targets=request.targets) as spool:
        print_warnings(stream.warnings)
        if _nothing_to_rerun(stream):
            return EXIT_OK
        _say_rerun(stream)
        lines = (printed(record) for _, _, record in spool.records())
        if output:
            with Path(output).open("w", encoding="utf-8") as handle:
                handle.writelines(lines)
            where = f" written to {output}"
        else:
            sys.stdout.writelines(lines)
            where = ""
        played = ""
        if request.targets:
            played = f" × {len(request.targets)} targets = {spool.conversations} conversation(s)"
    print(f"{stream.count} case(s){played}{where} (dry run: no target was called)", file=sys.stderr)
    if request.reporter:
        estimate.add("reporter", parse_ref(request.reporter, default_kind="agents").id, 1)
    estimate.made = take_generation_usage()
    print("\n".join(estimate_lines(estimate, config)), file=sys.stderr)
    max_repeat = request.repeat if request.repeat_auto else None
    if max_repeat is not None:
        print(
            f"--repeat auto: each case played at most {max_repeat} times, at most "
            f"{stream.count * max_repeat} conversation(s) (fewer once a case is decided)",
            file=sys.stderr,
        )
    return EXIT_OK


def run_cases(
    request: RunRequest,
    config: ProjectConfig,
    stream: CaseStream,
    sources: list[InputSource],
    target: str | None,
) -> int:
    """Store the stream's cases (rejecting bad input before anything runs), run, report."""
    settings = get_settings()
    # Start-up is over: see heap.py.
    settle(YOUNG_THRESHOLD if settings.distributed else EMBEDDED_YOUNG_THRESHOLD)
    options = run_options(request, config, target)
    label = input_label(sources, 0)
    url = store_url()
    if settings.distributed:
        # The publisher: see the note at the top.
        from agenttest_submit.run.distributed import import_publisher_meanwhile

        import_publisher_meanwhile()
    # Every case is checked (and every problem reported) before anything is stored.
    with Spool(
        stream,
        target,
        repeat=request.repeat,
        adaptive=request.repeat_auto,
        targets=request.targets,
    ) as spool:
        print_warnings(stream.warnings)
        if _nothing_to_rerun(stream):
            return EXIT_OK
        _say_rerun(stream)
        parent = stream.selection.rerun.run_id if stream.selection.rerun else None
        if spool.repeated:
            options = options.model_copy(update={"distinct_cases": spool.cases})
        if not settings.distributed:
            return run_embedded(
                request,
                url,
                spool,
                options,
                config,
                run_target(request, target),
                label,
                parent_run_id=parent,
            )
        from agenttest_submit.run.distributed import FleetStarter, run_distributed

        run_id, total = store_records(
            url,
            spool.stored_records(),
            options=options,
            config=config,
            target=run_target(request, target),
            label=label,
            deadline=request.deadline,
            suite=run_suite(request, run_target(request, target)),
            parent_run_id=parent,
            starter=FleetStarter(url, request.parallel if request.parallel_given else None),
        )

    return run_distributed(request, url, run_id, total, config, options)
