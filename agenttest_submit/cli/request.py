"""What the user asked for, as typed objects built once from the command line.

`agenttest_submit.cli.main` parses the arguments and builds one of these; everything after it
(the run, the re-evaluation, the subcommands, the report) reads its choices from them,
never from argparse. They hold the values as given: checking them against
agenttest.yaml (an unknown agent, a simulator that is not there) is the run's business,
so that every such problem is reported at once.

"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple, get_args

if TYPE_CHECKING:
    from agenttest_worker.assertions import GoldenMatch
    from agenttest_worker.cases import OnMissingInput

# `--simulator` given alone: agenttest.yaml's defaults.simulator (known once it is loaded).
DEFAULT_SIMULATOR = "\0defaults.simulator"
# `--rerun-failed`/`--rerun-skipped` given alone: --suite's newest finished run, else the
# store's (known once the store is read).
RERUN_DEFAULT = "\0rerun.default"


class Rerun(NamedTuple):
    """`--rerun-failed [RUN]` and/or `--rerun-skipped [RUN]`: which run, and which of its
    cases: those whose verdict failed, those skipped, or both."""

    run: str  # a run id, "last" (the store's newest finished run) or RERUN_DEFAULT
    failed: bool
    skipped: bool

    @property
    def flag(self) -> str:
        """The flag as the user gave it (the first of the two, when both)."""
        return "--rerun-failed" if self.failed else "--rerun-skipped"


# --max-repeat when --repeat auto is given without it.
DEFAULT_MAX_REPEAT = 10


@dataclass(frozen=True)
class RunRequest:
    """`agenttest-submit -i ...` (or `--reeval`): run cases, or judge stored ones again."""

    # -i: case files or folders, direct messages, agents:/scripts: generators, as given.
    inputs: tuple[str, ...] = ()
    # -m: messages sent as they are, each a single-turn case (no path guessing).
    messages: tuple[str, ...] = ()
    # -n: the target agent (None: agenttest.yaml's defaults.agent).
    agent: str | None = None
    # -n given more than once: every case is played against each of these targets (the
    # first is also `agent`); empty for one target.
    targets: tuple[str, ...] = ()
    # -c: a registry agent called instead of the target's own entry.
    connector: str | None = None
    # --config: agenttest.yaml's path (None: ./agenttest.yaml).
    config_file: str | None = None
    # -o: where the report (with dry_run, the normalized cases) is written.
    output: str | None = None
    # --format: the report's format on stdout, or in `output` (None: console on stdout,
    # jsonl in `output`); a name registered in agenttest_worker.report.REPORTERS.
    format: str | None = None
    # -v: show every turn in the console report.
    verbose: bool = False
    # --only-failures: the console report shows only failed and skipped cases (the
    # summary still counts every case; other formats keep every case).
    only_failures: bool = False
    # --interactive / --skip-interactive: ask at the terminal when an agent awaits input,
    # or never (both false: each case's `interactive.enabled` decides).
    interactive: bool = False
    skip_interactive: bool = False
    # --simulator: the simulator of cases without one (DEFAULT_SIMULATOR: agenttest.yaml's
    # defaults.simulator; None: none).
    simulator: str | None = None
    # --on-missing-input: overrides every case's on_missing_input.
    on_missing_input: OnMissingInput | None = None
    # --tag, --id: run only the cases with one of these tags / these ids.
    tags: tuple[str, ...] = ()
    ids: tuple[str, ...] = ()
    # --timeout, --turn-timeout (seconds): per case, per turn (None: no turn limit).
    case_timeout: float = 300.0
    turn_timeout: float | None = None
    # --deadline (seconds): the whole run stops after this long (None: never).
    deadline: float | None = None
    # --max-tokens, --max-cost: no new turn starts once the run used this much.
    max_tokens: int | None = None
    max_cost: float | None = None
    # --parallel: conversations run at a time (embedded: in this process, 10 unless
    # given; on a fleet: in flight across the fleet, no cap unless given).
    parallel: int = 10
    parallel_given: bool = False
    # --fail-fast: stop on the first failure.
    fail_fast: bool = False
    # The reply cache: "off" (--no-cache), "refresh" (--cache-refresh) or "on"; and
    # --cache target: the target's replies cached too.
    cache: Literal["on", "off", "refresh"] = "on"
    cache_target: bool = False
    # --repeat: play each case this many times (None: each case's `repeat`, else once);
    # --pass-rule: how its repetitions make its verdict; --pass-k: the k of pass@k.
    repeat: int | None = None
    # --repeat auto: `repeat` is --max-repeat, the most each case is played; it stops
    # once its pass rate settles its verdict (repeat_stopping.py).
    repeat_auto: bool = False
    pass_rule: str = "all"
    pass_k: int | None = None
    # --suite: the series of runs this one belongs to (None: derived, runner.run_suite);
    # --baseline: a run to compare this one with at its end (a run id, "last" or
    # "suite"); --fail-on: what makes the exit code 1: ("any",) failure, or what the diff
    # finds: "regressions", "new" (new or changed cases that fail), or both.
    suite: str | None = None
    baseline: str | None = None
    fail_on: tuple[str, ...] = ("any",)
    # --confidence, --history-window: the noise-aware gate (report/significance.py);
    # None and None: verdicts are compared as they are.
    confidence: float | None = None
    history_window: int | None = None
    # --dry-run: load, generate and check the cases, print them, call no target.
    dry_run: bool = False
    # --wait / --no-wait (distributed): watch the run and report it, or return at once.
    wait: bool = True
    # --reeval [RUN]: judge stored conversations again (a run id or "last"; None: no).
    reeval: str | None = None
    # --rerun-failed [RUN] / --rerun-skipped [RUN]: run only the cases of the inputs that
    # failed / were skipped in that run (None: every selected case).
    rerun: Rerun | None = None
    # --reporter: a reporter agent that is sent the results.
    reporter: str | None = None
    # --golden [MATCH]: every case compared with its golden conversation (exact, tools,
    # judge; None: only cases with a `golden` assertion); --update-golden: each passing
    # case's conversation recorded as its golden conversation.
    golden: GoldenMatch | None = None
    update_golden: bool = False


class StatusRequest(NamedTuple):
    """`agenttest-submit status RUN`."""

    run: str  # a run id, or "last" for the newest run


class ReportRequest(NamedTuple):
    """`agenttest-submit report RUN [-o FILE] [--format F] [-v] [--only-failures]`."""

    run: str  # a run id, or "last" for the newest run
    output: str | None = None  # None: stdout
    format: str | None = None  # None: console on stdout, jsonl in `output`
    verbose: bool = False
    only_failures: bool = False  # as on a run: the console alone leaves passed cases out


class ResumeRequest(NamedTuple):
    """`agenttest-submit resume RUN [--parallel N]`."""

    run: str  # a run id, or "last" for the newest run
    parallel: int = 10


class CancelRequest(NamedTuple):
    """`agenttest-submit cancel RUN [--reason TEXT]`."""

    run: str  # a run id, or "last" for the newest run
    reason: str | None = None  # None: "cancelled by USER@HOST"


class PruneRequest(NamedTuple):
    """`agenttest-submit prune --older-than D [--suite S] [--keep-last N] [--dry-run]`."""

    older_than: float  # seconds: runs created longer ago than this
    suite: str | None = None  # None: every suite
    keep_last: int | None = None  # the newest N runs of each suite stay, however old
    dry_run: bool = False  # list what would be removed, remove nothing


class CacheRequest(NamedTuple):
    """`agenttest-submit cache stats|clear [--agent NAME] [--older-than D]`."""

    action: Literal["stats", "clear"]
    agent: str | None = None  # None: every agent's replies
    older_than: float | None = None  # seconds: clear only replies stored longer ago


class DbRequest(NamedTuple):
    """`agenttest-submit db upgrade`."""

    action: Literal["upgrade"] = "upgrade"


# What `agenttest-submit schema KIND` describes: a JSON case file (and one JSONL line), a
# tdx YAML case file, or agenttest.yaml.
SchemaKind = Literal["cases", "yaml", "config"]
SCHEMA_KINDS: tuple[SchemaKind, ...] = get_args(SchemaKind)


class SchemaRequest(NamedTuple):
    """`agenttest-submit schema [cases|yaml|config]`: print a JSON Schema for editors."""

    kind: SchemaKind = "cases"
    output: str | None = None  # -o: written to this file (None: stdout)


class DiffRequest(NamedTuple):
    """`agenttest-submit diff [BASE] [NEW] [--window N] [--format F]`."""

    new: str = "last"  # a run id, or "last"
    # a run id, "last", "suite" or "suite:NAME" (resolve_baseline); None: NEW's suite's
    # previous finished run
    base: str | None = None
    window: int = 10  # the suite's runs over which a case's verdict changing is flaky
    format: str = "console"  # console, json, markdown, junit
    # --confidence, --history-window: pass rates weighed (None and None: verdicts compared)
    confidence: float | None = None
    history_window: int | None = None
    output: str | None = None  # -o: written to this file (None: stdout)
    # --targets A B: two targets of the run NEW compared, A as the base (None: two runs).
    targets: tuple[str, ...] | None = None


class HistoryRequest(NamedTuple):
    """`agenttest-submit history CASE_ID [--suite S] [--last N] [--format F]`."""

    case_id: str
    suite: str | None = None  # None: every suite
    last: int = 20
    format: str = "console"  # console, json
    output: str | None = None  # -o: written to this file (None: stdout)


class RunsRequest(NamedTuple):
    """`agenttest-submit runs [--suite S] [--last N] [--format F]`."""

    suite: str | None = None
    last: int = 20
    format: str = "console"
    output: str | None = None  # -o: written to this file (None: stdout)


class PromoteRequest(NamedTuple):
    """`agenttest-submit promote RUN`: make a finished run its suite's baseline."""

    run: str  # a run id, or "last" for the newest run


class ViewRequest(NamedTuple):
    """`agenttest-submit view [RUN] [--host H] [--port P] [--token T]`: the read-only viewer."""

    run: str | None = None  # a run id or "last" to open at; None: the runs page
    host: str = "127.0.0.1"  # another address than loopback needs `token`
    port: int = 8750  # 0: any free port (printed)
    token: str | None = None  # None: AGENTTEST_VIEW_TOKEN, if set


class MetricsRequest(NamedTuple):
    """`agenttest-submit metrics [--port P] [--host H]`: serve the fleet's progress to
    Prometheus (metrics_exporter.py)."""

    port: int = 9809
    host: str = "127.0.0.1"  # another address needs a token
    token: str | None = None  # None: AGENTTEST_METRICS_TOKEN


# How often `audit-judges` asks each judge again, by default and at most.
AUDIT_TIMES = 3
AUDIT_TIMES_MAX = 20


class AuditRequest(NamedTuple):
    """`agenttest-submit audit-judges RUN [--times N] [--format F] [-o FILE]`."""

    run: str  # a run id, or "last" for the newest run
    times: int = AUDIT_TIMES
    format: Literal["console", "json"] = "console"
    output: str | None = None  # -o: written to this file (None: stdout)
    parallel: int = 10  # conversations re-judged at a time


class LabelRequest(NamedTuple):
    """`agenttest-submit label RUN CASE TURN pass|fail [--note TEXT] [--assertion K]`."""

    run: str  # a run id, or "last" for the newest run
    case_id: str  # the conversation's key (a repetition's: ID#N)
    turn: int  # the turn number; 0: the conversation's final assertions
    label: bool  # pass: True
    note: str | None = None
    assertion: int | None = None  # the position among the turn's assertions (from 1)
    by: str | None = None  # who labels; None: USER@HOST


HistoryCommandRequest = DiffRequest | HistoryRequest | RunsRequest | PromoteRequest
SubcommandRequest = (
    StatusRequest
    | CacheRequest
    | ReportRequest
    | ResumeRequest
    | DbRequest
    | SchemaRequest
    | CancelRequest
    | PruneRequest
    | AuditRequest
    | LabelRequest
)
