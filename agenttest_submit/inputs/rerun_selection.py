"""`--rerun-failed [RUN]` and `--rerun-skipped [RUN]`: the stored run a rerun reads, and
the ids of its cases that failed (or were skipped) there.

The cases themselves come from the inputs as they are now: the ids found here only
select among them (case_checks.Selection), together with --tag and --id. A case's
verdict in the run is read as `diff` reads it, one row per case with its repetitions
counted (store/sql/run_history.py), under the run's own --pass-rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agenttest_submit.cli.request import RERUN_DEFAULT, Rerun
from agenttest_submit.cli.services import safe_url
from agenttest_submit.commands.run_diffs import stored_pass_rule
from agenttest_submit.inputs.case_checks import RerunIds
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.report import tally_verdict
from agenttest_worker.store import run_history, runs, upgrade

if TYPE_CHECKING:
    from agenttest_worker.store import RunRow


def rerun_source(url: str, rerun: Rerun, suite: str | None) -> RunRow:
    """The run a rerun reads: a run id (one that has finished), `last` (the store's
    newest finished run), or, given no value, --suite's newest finished run (`last`
    without --suite)."""
    if rerun.run == RERUN_DEFAULT and suite is not None:
        newest = run_history.suite_runs(url, suite, last=1, finished=True)
        if not newest:
            raise InputError(
                InputProblem(
                    f"suite {suite!r} has no finished run in {safe_url(url)}", field=rerun.flag
                )
            )
        return newest[0]
    if rerun.run in (RERUN_DEFAULT, "last"):
        newest = run_history.suite_runs(url, None, last=1, finished=True)
        if not newest:
            raise InputError(InputProblem(f"no finished run in {safe_url(url)}", field=rerun.flag))
        return newest[0]
    run = runs.get_run(url, rerun.run)
    if run is None:
        raise InputError(InputProblem(f"no run {rerun.run!r} in {safe_url(url)}", field=rerun.flag))
    if run.status not in run_history.FINISHED:
        # Its cases still under way are neither failed nor skipped yet.
        raise InputError(
            InputProblem(
                f"run {run.id} has not finished (status {run.status}): rerun from it once it "
                f"has, or finish it with `agenttest-submit resume {run.id}`",
                field=rerun.flag,
            )
        )
    return run


def rerun_ids(url: str, rerun: Rerun, suite: str | None) -> RerunIds:
    """The ids of the source run's cases whose verdict is one the rerun asks for, in
    the run's order."""
    upgrade(url)
    source = rerun_source(url, rerun, suite)
    wanted = [s for s, asked in (("failed", rerun.failed), ("skipped", rerun.skipped)) if asked]
    rule = stored_pass_rule(source)
    ids = tuple(
        tally.id
        for tally in run_history.case_tallies(url, source.id)
        if tally_verdict(tally.played, tally.passed, tally.skipped, rule) in wanted
    )
    return RerunIds(source.id, ids, " or ".join(wanted), rerun.flag)
