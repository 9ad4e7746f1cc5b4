"""Subcommands: `status RUN`, `report RUN`, `resume RUN`, `cancel RUN` (cancel.py),
`prune` (prune.py), `audit-judges RUN` (audit_judges.py), `label RUN ...`
(judge_labelling.py), `db upgrade`, `schema [KIND]`.

RUN is a run id as printed when the run started, or `last` for the newest run.
`run_subcommand` carries out the request the command line was parsed into. `status`
shows the calls, tokens and cost so far by role and agent, running or not: from the
calls recorded (store/sql/usage.py), priced with the run's stored agenttest.yaml.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import cast

from agenttest_submit.cli.output_file import output_problem, written_to
from agenttest_submit.cli.request import (
    AuditRequest,
    CacheRequest,
    CancelRequest,
    DbRequest,
    LabelRequest,
    PruneRequest,
    ReportRequest,
    ResumeRequest,
    SchemaRequest,
    StatusRequest,
    SubcommandRequest,
)
from agenttest_submit.cli.services import safe_url
from agenttest_submit.cli.terminal import color_wanted
from agenttest_submit.commands.resume import resume_run
from agenttest_submit.commands.schema import schema_text
from agenttest_submit.run.output import reporter_section
from agenttest_submit.run.runner import resolve_run
from agenttest_worker.agents import ProjectConfig, config_from_stored
from agenttest_worker.engine import USAGE_ROLE, tokens_cost
from agenttest_worker.errors import ConfigError, InputError
from agenttest_worker.report import (
    ROLE_ORDER,
    UsageTally,
    build_report,
    case_count,
    counted,
    printable,
    render,
)
from agenttest_worker.results import AgentRole, RoleUsage, UsageRole
from agenttest_worker.settings import get_settings
from agenttest_worker.store import RunRow, results, upgrade, usage


def _url() -> str:
    url = get_settings().effective_database_url()
    upgrade(url)
    return url


def run_subcommand(request: SubcommandRequest) -> int:
    if isinstance(request, SchemaRequest):
        # For editors on any machine: no database, broker or agenttest.yaml involved.
        if problem := output_problem(request.output):
            raise InputError(problem)
        with written_to(request.output):
            sys.stdout.write(schema_text(request.kind))
        return 0
    if isinstance(request, DbRequest):
        url = get_settings().effective_database_url()
        upgrade(url)
        print(f"database {safe_url(url)} is at the current schema")
        return 0
    if isinstance(request, ReportRequest | AuditRequest) and (
        problem := output_problem(request.output)
    ):
        raise InputError(problem)
    url = _url()
    if isinstance(request, PruneRequest):
        from agenttest_submit.commands.prune import prune  # its imports: only here

        return prune(url, request)
    if isinstance(request, CacheRequest):
        from agenttest_submit.commands.reply_cache_command import cache_command  # only here

        return cache_command(url, request)
    run = resolve_run(url, request.run)
    if isinstance(request, StatusRequest):
        played = results.count_played_turns(url, run.id)
        print(status_text(run, played, usage_lines(run, usage.calls_by_agent(url, run.id))))
        return 0
    if isinstance(request, ReportRequest):
        code = _report(url, run.id, request)
        if run.status != "done":
            # A CI job that publishes the report too early must not pass quietly.
            print(
                f"agenttest-submit: run {run.id} is {run.status} "
                f"({_finished(run)}): "
                "the report covers only the finished ones",
                file=sys.stderr,
            )
            return max(code, 1)
        return code
    if isinstance(request, AuditRequest):
        from agenttest_submit.commands.audit_judges import audit_command  # only here

        return audit_command(url, run, request)
    if isinstance(request, LabelRequest):
        from agenttest_submit.commands.judge_labelling import label_command  # only here

        return label_command(url, run.id, request)
    if isinstance(request, CancelRequest):
        from agenttest_submit.commands.cancel import cancel_run  # its imports: only here

        return cancel_run(url, run, request.reason)
    assert isinstance(request, ResumeRequest)
    return resume_run(url, run, request.parallel)


def _cases_total(run: RunRow) -> str:
    # A run still being stored does not know its number of cases yet.
    return "?" if run.status == "pending" else str(run.total_cases)


def _finished(run: RunRow, unit: str = "cases ") -> str:
    """How far the run is, counted as every listing counts: "3/4 cases finished" (`unit`
    left out where the line says cases already), or for repeated cases "20×2: 30/40
    conversations finished"."""
    distinct = (run.options or {}).get("distinct_cases")
    if distinct is None or run.status == "pending":
        return f"{run.finished_cases}/{_cases_total(run)} {unit}finished"
    if (run.options or {}).get("repeat_auto"):
        # Its total counts chains of repetitions (store/repetition_chain.py): each case's
        # repetitions are counted as they are played, none it may never need.
        played = run.passed + run.failed + run.skipped
        playing = run.total_cases - run.finished_cases
        auto = f"{counted(distinct, 'case')}, --repeat auto"
        return f"{auto}: {played} conversations finished, {playing} playing"
    cases = case_count(distinct, run.total_cases)
    return f"{cases}: {run.finished_cases}/{run.total_cases} conversations finished"


def status_text(run: RunRow, played: int | None = None, usage_rows: list[str] | None = None) -> str:
    """What `status` prints; `played`: the turns recorded so far, finished cases or not;
    `usage_rows`: what its calls used so far (`usage_lines`)."""
    # The label quotes the inputs (a message given with -i), the reason may quote an
    # error: escaped, like everything else from the run that reaches the terminal.
    cancelled = f" (cancelled: {printable(run.cancel_reason or '')})" if run.cancelled else ""
    lines = [
        f"run       {run.id}",
        f"status    {run.status}{cancelled}",
        f"agent     {printable(run.agent or '-')}",
        f"input     {printable(run.input_label or '-')}",
        f"suite     {printable(run.suite or '-')}",
        f"by        {printable(run.submitted_by or '-')} at {run.created_at:%Y-%m-%d %H:%M:%S}",
        f"cases     {_finished(run, unit='')}: {run.passed} passed, "
        f"{run.failed} failed, {run.skipped} skipped",
        f"turns     {run.total_turns}"
        + (
            f" in finished cases, {played} played"
            if played is not None and played != run.total_turns
            else ""
        ),
    ]
    if run.parent_run_id:
        lines.append(f"from      {run.parent_run_id}")
    lines += usage_rows or []
    return "\n".join(lines)


def _priced_by(run: RunRow) -> ProjectConfig | None:
    """The run's agenttest.yaml as stored, to price its calls; None when it cannot be
    read here (a ${VAR} this shell lacks): the calls are shown without their cost."""
    try:
        return config_from_stored(run.config or {})
    except ConfigError:
        return None


# Where the calls a run made outside its conversations' records happened: a
# conversation's role there made calls in turns played but not recorded (a copy of a
# turn's message that lost the race to record it, a turn whose conversation ended
# meanwhile).
_OUTSIDE = {"generator": "(at submission)", "reporter": "(after the run)"}
_UNRECORDED = "(turns not recorded)"


def usage_lines(run: RunRow, calls: list[usage.AgentCalls]) -> list[str]:
    """The run's usage so far: by role (as the report's summary line), then each role's
    agents; what it used outside its conversations (its generators, a reporter) last."""
    config = _priced_by(run)
    priced = config is not None and any(a.pricing for a in config.agents.values())
    tally = UsageTally()
    rows: list[tuple[UsageRole, str, RoleUsage]] = []
    for found in calls:
        # (A role this version does not know is counted as the target's.)
        role = USAGE_ROLE.get(cast(AgentRole, found.role), "target")
        cost = tokens_cost(config, found.agent, found.prompt_tokens, found.completion_tokens)
        used = RoleUsage(
            calls=found.calls,
            prompt_tokens=found.prompt_tokens,
            completion_tokens=found.completion_tokens,
            total_tokens=found.total_tokens,
            cost=cost,
        )
        tally.add_usage({role: used})
        rows.append((role, printable(found.agent), used))
    outside = usage.stored_usage(run.usage)
    tally.add_usage(outside)
    rows += [(role, _OUTSIDE.get(role, _UNRECORDED), used) for role, used in outside.items()]
    line = tally.line(priced)
    if not line:
        return []
    lines = [f"usage     {line.removeprefix('Usage: ')}"]
    rows.sort(key=lambda row: ROLE_ORDER.index(row[0]))
    width = max(len(agent) for _, agent, _ in rows)
    for role, agent, used in rows:
        count = f"{used.calls:,} call{'' if used.calls == 1 else 's'}"
        shown = (
            f"          {role:<9}  {agent:<{width}}  {count:>11}  {used.total_tokens:>9,} tokens"
        )
        lines.append(shown + (f"  ${used.cost:,.4f}" if priced else ""))
    if config is None:
        lines.append("          (no cost: the run's agenttest.yaml cannot be read here)")
    return lines


def _report(url: str, run_id: str, request: ReportRequest) -> int:
    report = build_report(url, run_id, verbose=request.verbose, color=color_wanted(sys.stdout))
    # Only the console reads it; -o and other formats keep every case, as on a run.
    report.only_failures = request.only_failures
    if request.output:
        report.color = False
        text = render(request.format or "jsonl", report)
        Path(request.output).write_text(text, encoding="utf-8")
        print(f"report written to {request.output}", file=sys.stderr)
    else:
        sys.stdout.write(render(request.format or "console", report))
        account = results.get_report(url, run_id, "reporter")
        if account is not None and (request.format or "console") == "console":
            # The run's --reporter agent's account, kept with it, after the report as
            # the run printed it.
            sys.stdout.write(reporter_section(account))
    return 1 if report.summary().run_failed else 0
