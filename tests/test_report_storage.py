"""The aggregator's stored reports are exactly the rendered ones. On Postgres they are
streamed to the server as they are rendered (COPY, store/sql/report_copy.py), so text that COPY
escapes, reports larger than one write, and a report already stored are checked there;
the embedded store (SQLite) joins and inserts them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text

from agenttest_worker.report import render, render_chunks
from agenttest_worker.report.aggregation import STORED_FORMATS, aggregate, build_report
from agenttest_worker.store import steps
from agenttest_worker.store.sql import db, runs
from agenttest_worker.store.sql import run_results as results

# What COPY's text format escapes (backslash, tab, newline, carriage return) and more.
AWKWARD = 'a\\b\tc\r\nd "quoted" é ✓ \\N \\.'


def _record(case_id: str, output: str, status: str) -> dict[str, object]:
    turn = {
        "turn": 1,
        "input": "hello\tthere\\",
        "input_source": "static",
        "output": output,
        "status": status,
        "assertions": [
            {"type": "contains", "value": "a\\b", "passed": status == "passed", "reason": "r"}
        ],
        "tool_calls": [],
        "duration_ms": 5,
        "awaiting_input": False,
    }
    return {
        "id": case_id,
        "name": f"case\t{case_id}",
        "status": status,
        "turns": [turn],
        "final_assertions": [],
        "total_turns": 1,
        "duration_ms": 5,
    }


def _finished_run(url: str, outputs: list[str]) -> str:
    db.upgrade(url)
    run_id = steps.new_run_id()
    runs.create_run(url, run_id=run_id, agent="a", input_label="in", options={}, config={})
    runs.add_cases(
        url, run_id, [runs.NewCase(i, f"c{i}", {"id": f"c{i}"}, None) for i in range(len(outputs))]
    )
    statuses = ["passed" if i % 3 else "failed" for i in range(len(outputs))]
    with db.get_engine(url).begin() as connection:
        for i, output in enumerate(outputs):
            connection.execute(
                text(
                    "UPDATE cases SET phase = 'done', status = :s, result = :r"
                    " WHERE run_id = :run AND case_id = :c"
                ),
                {
                    "s": statuses[i],
                    "r": json.dumps(_record(f"c{i}", output, statuses[i])),
                    "run": run_id,
                    "c": f"c{i}",
                },
            )
        connection.execute(
            text(
                "UPDATE runs SET status = 'running', total_cases = :n, finished_cases = :n"
                " WHERE id = :run"
            ),
            {"n": len(outputs), "run": run_id},
        )
    return run_id


def _timeless(report: str | None) -> str | None:
    """The report without its total time (the run's, up to when it was built)."""
    if report is None:
        return None
    return "".join(line for line in report.splitlines(True) if "Total time:" not in line)


def _stored(url: str, run_id: str) -> dict[str, str | None]:
    return {fmt: _timeless(results.get_report(url, run_id, fmt)) for fmt in STORED_FORMATS}


def _rendered(url: str, run_id: str) -> dict[str, str | None]:
    report = build_report(url, run_id)
    return {fmt: _timeless(render(fmt, report)) for fmt in STORED_FORMATS}


def test_streamed_reports_are_the_rendered_ones_on_postgres(pg_database: str) -> None:
    # ~1.5 MB of JSONL: more than one of the streaming's writes (report_copy.py writes
    # each 1 MiB gathered), with awkward text throughout.
    outputs = [f"{AWKWARD} {i} " + "x" * 1500 for i in range(800)]
    run_id = _finished_run(pg_database, outputs)
    built = aggregate(pg_database, run_id)
    assert built is not None
    assert len(list(results.report_parts(pg_database, run_id, "jsonl"))) == 2  # in parts
    expected = _rendered(pg_database, run_id)
    assert expected["jsonl"] is not None and len(expected["jsonl"]) > 1 << 20
    assert _stored(pg_database, run_id) == expected
    first = json.loads(expected["jsonl"].splitlines()[0])
    assert first["turns"][0]["output"].startswith(AWKWARD)


def test_reports_streamed_side_by_side_keep_each_its_own_text(pg_database: str) -> None:
    """The reports are copied in parts, a piece of each in turn: each is stored whole
    and in order, an empty one as empty text."""
    run_id = _finished_run(pg_database, ["plain"])
    big = [f"{AWKWARD} {i}\n" * 400 for i in range(200)]  # several parts of ~1 MiB
    results.complete_run(
        pg_database,
        run_id,
        {"console": iter(big), "jsonl": iter([]), "tsv": iter(["one\t", "two\n"])},
    )
    assert results.get_report(pg_database, run_id, "console") == "".join(big)
    assert results.get_report(pg_database, run_id, "jsonl") == ""
    assert results.get_report(pg_database, run_id, "tsv") == "one\ttwo\n"


def test_a_report_already_stored_is_kept(pg_database: str) -> None:
    run_id = _finished_run(pg_database, [AWKWARD, "plain"])
    results.store_report(pg_database, run_id, "console", "an earlier aggregator's")
    aggregate(pg_database, run_id)
    stored = _stored(pg_database, run_id)
    assert stored["console"] == "an earlier aggregator's"
    assert stored["jsonl"] == _rendered(pg_database, run_id)["jsonl"]


def test_embedded_reports_are_stored_in_parts_as_rendered(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    outputs = [f"{AWKWARD} {i} " + "x" * 1500 for i in range(800)]  # ~1.5 MB of JSONL
    run_id = _finished_run(url, outputs)
    built = aggregate(url, run_id)
    assert built is not None
    assert len(list(results.report_parts(url, run_id, "jsonl"))) == 2
    assert _stored(url, run_id) == _rendered(url, run_id)


def test_an_embedded_report_already_stored_is_kept(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    run_id = _finished_run(url, [AWKWARD, "plain"])
    results.store_report(url, run_id, "console", "an earlier aggregator's")
    aggregate(url, run_id)
    stored = _stored(url, run_id)
    assert stored["console"] == "an earlier aggregator's"
    assert stored["jsonl"] == _rendered(url, run_id)["jsonl"]


@pytest.mark.parametrize("fmt", ["console", "jsonl", "json", "tsv"])
def test_chunks_join_into_the_rendered_report(tmp_path: Path, fmt: str) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    run_id = _finished_run(url, [AWKWARD, "plain", "", "last"])
    report = build_report(url, run_id)
    assert "".join(render_chunks(fmt, report)) == render(fmt, report)
