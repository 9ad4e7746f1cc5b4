"""What the viewer reads from the store, shaped as the pages render it.

Only SELECTs: nothing here writes. A run's case table and summary are built from its
stored records once (`RunViews`) and kept while the run stands still; a running run's
are rebuilt when more of its conversations have finished, at most every few seconds, so
that a page polling a 10,000-case run does not parse every record each time. Its
progress (finished cases, turns played) is read from the run's row on every request.
A diff between two runs is the `diff` command's (run_history.py).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from sqlalchemy import Text, cast, or_, select

from agenttest_worker.errors import InputError
from agenttest_worker.report import (
    CATEGORIES,
    TITLES,
    RunData,
    build_report,
    case_count,
    case_row,
    case_verdict,
    counted,
    grouped,
    read_cause,
    record_notes,
    search_text,
    sort_rows,
    trace_notes,
    worded_diff,
    words,
)
from agenttest_worker.results import CaseResult
from agenttest_worker.store import (
    CaseRow,
    RunRow,
    StoredSpans,
    results,
    runs,
    session_scope,
    unstable_criteria,
    usage,
)

RUNS_LISTED = 500
# How stale a running run's case table may be (its progress is always current).
REBUILD_SECONDS = 3.0
# Runs whose case tables are kept (the ones being looked at).
KEPT_RUNS = 4
_TIME = "%Y-%m-%d %H:%M:%S"


def conversation_counts(run: RunRow) -> tuple[int, int]:
    """(finished, total) conversations of the run. Under --repeat auto the run row
    counts chains of repetitions (store/repetition_chain.py): the repetitions played
    are added, so that neither count claims a fixed number per case."""
    if not (run.options or {}).get("repeat_auto"):
        return run.finished_cases, run.total_cases
    ended = run.passed + run.failed + run.skipped
    return ended, run.total_cases + max(ended - run.finished_cases, 0)


def _cases(run: RunRow, total: int) -> str:
    """ "20×2", or under --repeat auto "3 (22 conversations)": never a fixed K per case."""
    distinct = (run.options or {}).get("distinct_cases")
    if distinct is not None and (run.options or {}).get("repeat_auto"):
        return f"{distinct} ({counted(total, 'conversation')})"
    return case_count(distinct, total)


def run_facts(run: RunRow) -> dict[str, Any]:
    """A run as the runs page and the live progress show it (never its stored
    configuration: only names, counts and times)."""
    finished, total = conversation_counts(run)
    return {
        "id": run.id,
        "status": run.status,
        "cancelled": bool(run.cancelled),
        "created_at": run.created_at.strftime(_TIME) if run.created_at else None,
        "agent": run.agent,
        "input_label": run.input_label,
        "total_cases": total,
        "finished_cases": finished,
        # Its cases as every listing shows them ("20×2": report.case_count), and what
        # its counts count: conversations when some case repeats.
        "cases": _cases(run, total),
        "unit": "cases" if (run.options or {}).get("distinct_cases") is None else "conversations",
        "passed": run.passed,
        "failed": run.failed,
        "skipped": run.skipped,
        "total_turns": run.total_turns,
        # What its agents' calls cost so far (their `pricing`), budget or not.
        "cost": usage.run_cost(run.total_cost, run.usage),
    }


def runs_page(url: str) -> dict[str, Any]:
    """The newest runs, newest first, grouped by what they ran (a run's suite when the
    store keeps one, else its inputs), the group of the newest run first."""
    with session_scope(url) as session:
        rows = session.scalars(
            select(RunRow).order_by(RunRow.created_at.desc(), RunRow.id.desc()).limit(RUNS_LISTED)
        ).all()
        found = [(getattr(r, "suite", None) or r.input_label or "", run_facts(r)) for r in rows]
    groups: dict[str, list[dict[str, Any]]] = {}
    for name, facts in found:
        groups.setdefault(name, []).append(facts)
    return {"groups": [{"name": name, "runs": listed} for name, listed in groups.items()]}


# What a run's kept case table was built from: its status, finished cases, whether it
# was cancelled, and the criteria its newest audit of the judges found unstable (an
# audit changes causes: report/causes.py).
_Key = tuple[str, int, bool, frozenset[str]]


@dataclass
class _Built:
    key: _Key
    at: float
    header: dict[str, Any]
    rows: list[dict[str, Any]]
    texts: dict[str, str]


class RunViews:
    """Runs' headers, case tables, searches and cases, read from the store at `url`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._built: dict[str, _Built] = {}
        self._lock = threading.Lock()

    def header(self, run_id: str) -> dict[str, Any] | None:
        run = runs.get_run(self.url, run_id)
        if run is None:
            return None
        built = self._view(run)
        played = results.count_played_turns(self.url, run_id)
        progress = {
            "unit": "cases"
            if (run.options or {}).get("distinct_cases") is None
            else "conversations",
            "total": conversation_counts(run)[1],
            "finished": conversation_counts(run)[0],
            "passed": run.passed,
            "failed": run.failed,
            "skipped": run.skipped,
            "played_turns": played,
        }
        facts = run_facts(run)
        return {
            **built.header,
            "status": run.status,
            "cancelled": facts["cancelled"],
            "created_at": facts["created_at"],
            "progress": progress,
        }

    def rows(self, run_id: str) -> list[dict[str, Any]] | None:
        run = runs.get_run(self.url, run_id)
        return None if run is None else self._view(run).rows

    def search(self, run_id: str, query: str) -> list[str] | None:
        """The ids of the cases whose text holds `query` (html_page/data.py search_text)."""
        run = runs.get_run(self.url, run_id)
        if run is None:
            return None
        wanted = query.lower()
        return [case for case, text in self._view(run).texts.items() if wanted in text]

    def _view(self, run: RunRow) -> _Built:
        key = (run.status, run.finished_cases, bool(run.cancelled), _unstable(self.url, run.id))
        with self._lock:
            kept = self._built.get(run.id)
            fresh = kept is not None and (
                kept.key == key
                or (run.status != "done" and time.monotonic() - kept.at < REBUILD_SECONDS)
            )
            if kept is not None and fresh:
                return kept
            built = self._build(run.id, key)
            self._built.pop(run.id, None)
            self._built[run.id] = built
            while len(self._built) > KEPT_RUNS:
                self._built.pop(next(iter(self._built)))
            return built

    def _build(self, run_id: str, key: _Key) -> _Built:
        report = build_report(self.url, run_id)
        data = RunData(report)
        texts: dict[str, str] = {}
        index = 0
        for records in grouped(report.results):
            data.add(records, index)
            index += len(records)
            # A run of several targets: a case's text is every target's.
            case_id = records[0].id
            texts[case_id] = texts.get(case_id, "") + search_text(records)
        return _Built(key, time.monotonic(), data.header(), sort_rows(data.rows), texts)

    def case(self, run_id: str, case_id: str) -> dict[str, Any] | None:
        """A case's records (a repeated case's repetitions in order) with their notes and
        its table row; or, while one of them still runs, only that it exists."""
        run = runs.get_run(self.url, run_id)
        if run is None:
            return None
        with session_scope(self.url) as session:
            found = session.execute(
                select(CaseRow.phase, CaseRow.next_turn, CaseRow.case, cast(CaseRow.result, Text))
                .where(
                    CaseRow.run_id == run_id,
                    # A repetition is stored as "ID#N" (cases/case_model.py), a
                    # target's conversation as "ID@TARGET" (inputs/spool_lines.py).
                    or_(
                        CaseRow.case_id == case_id,
                        CaseRow.case_id.startswith(f"{case_id}#", autoescape=True),
                        CaseRow.case_id.startswith(f"{case_id}@", autoescape=True),
                    ),
                )
                .order_by(CaseRow.seq)
            ).all()
        mine = [row for row in found if (row[2] or {}).get("id") == case_id]
        if not mine:
            return {"exists": False, "row": None, "message": f"no case {case_id} in run {run_id}"}
        waiting = [row for row in mine if row[3] is None]
        if waiting:
            done = len(mine) - len(waiting)
            at = f"{words('phase', waiting[0][0])}, next turn {waiting[0][1]}"
            return {
                "exists": True,
                "row": None,
                "message": f"not finished yet ({done}/{len(mine)} finished; {at})",
            }
        records = [CaseResult.model_validate_json(row[3]) for row in mine]
        # A failed repetition of a case another repetition of which (with the same
        # target) passed: a flake; one resting on a criterion the run's newest audit
        # found unstable: the judge's.
        unstable = _unstable(self.url, run_id)
        for record in records:
            mates = [r for r in records if r.agent == record.agent]
            repeated_pass = len(mates) > 1 and any(r.status == "passed" for r in mates)
            record.cause = read_cause(record, repeated_pass, unstable)
        rule = (run.options or {}).get("pass_rule") or "all"
        pairs = []
        for (_, _, definition, text), record in zip(mine, records, strict=True):
            notes = record_notes(record)
            spans = StoredSpans(self.url).spans_of(record.trace_id) if record.trace_id else None
            notes.update(trace_notes(record, spans))
            attached = _attachments(definition or {}, record)
            if any(attached):
                notes["attachments"] = attached
            # The record exactly as stored: the JSONL line, fields added later included
            # (its cause as the run's reports give it).
            stored = json.loads(text)
            if record.cause is not None:
                stored["cause"] = record.cause
            pairs.append([stored, notes])
        return {
            "exists": True,
            "row": case_row(records, case_verdict(records, rule)),
            "records": pairs,
        }


def _unstable(url: str, run_id: str) -> frozenset[str]:
    return frozenset(u.criterion for u in unstable_criteria(url, run_id))


def run_diff(url: str, run_id: str, base: str) -> dict[str, Any] | None:
    """What changed from a base run to `run_id`, case by case (report/diff.py): `base`
    is a run id, `last` (the run before) or `suite` (its suite's previous finished run).
    None: no such run; {"message"} alone: no base to compare with."""
    from agenttest_submit.commands.run_diffs import build_diff, resolve_baseline

    new = runs.get_run(url, run_id)
    if new is None:
        return None
    try:
        found = resolve_baseline(url, base or "suite", new)
    except InputError as exc:
        return {"message": "; ".join(p.message for p in exc.problems)}
    diff = worded_diff(build_diff(url, found, new).as_dict())
    return {**diff, "titles": TITLES, "order": list(CATEGORIES)}


def _attachments(definition: dict[str, Any], record: CaseResult) -> list[list[str]]:
    """Per turn of `record`, the names of the files its static input was sent with (the
    record has none; the stored case does). Never the file's content or a data: URL."""
    written = iter(definition.get("turns") or [])
    names: list[list[str]] = []
    for turn in record.turns:
        step = next(written, None) if turn.input_source == "static" else None
        files = (step or {}).get("attachments") or [] if isinstance(step, dict) else []
        names.append([_name(a) for a in files if isinstance(a, dict)])
    return names


def _name(attachment: dict[str, Any]) -> str:
    if attachment.get("name"):
        return str(attachment["name"])
    source = str(attachment.get("source") or "")
    if source.startswith(("file://", "http://", "https://")):
        return PurePosixPath(source.split("?", 1)[0]).name or str(attachment.get("type") or "file")
    return str(attachment.get("type") or "file")
