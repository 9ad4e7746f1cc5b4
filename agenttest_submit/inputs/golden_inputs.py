"""Golden conversations read at submission into the cases that compare with them.

A case's `golden` assertion (or the one `--golden` adds to every case) is given the
contents of the case's golden file before the run is stored, as attachments are read
in: the workers of a fleet never read the submitter's disk. A golden file that cannot
be read as one is an input problem naming the file (and its line or field), before
anything runs; a missing one is not: the case runs and its golden assertion fails,
naming the file to record (docs/DESIGN.md).

With `--update-golden` the run records golden files instead, so the cases' golden
assertions are left out of it: a case is recorded when its other assertions pass.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from agenttest_worker.assertions import (
    AssertionSpec,
    GoldenAssertion,
    GoldenConversation,
    GoldenMatch,
    golden_path,
)
from agenttest_worker.cases import Case
from agenttest_worker.errors import InputError, InputProblem

# A golden file is a conversation's text: anything this large is not one.
MAX_GOLDEN_BYTES = 20 * 1024 * 1024


@dataclass(frozen=True)
class GoldenUse:
    """What the run does with golden conversations: `compare` (--golden MATCH) adds a
    golden assertion with that match to every case without one; `update`
    (--update-golden) records them, leaving the cases' golden assertions out."""

    compare: GoldenMatch | None = None
    update: bool = False


def case_golden_file(case: Case) -> Path | None:
    """Where the case's golden conversation is kept (None: it has no case file)."""
    if case.source_file is None or not os.path.isfile(case.source_file):
        return None
    return golden_path(case.source_file, case.id)


def with_golden(case: Case, use: GoldenUse) -> Case:
    """The case with its golden assertions as the run plays them (see the module)."""
    finals: list[AssertionSpec] = list(case.final_assertions)
    if use.update:
        kept = [a for a in finals if not isinstance(a, GoldenAssertion)]
        return (
            case if len(kept) == len(finals) else case.model_copy(update={"final_assertions": kept})
        )
    if use.compare is not None and not any(isinstance(a, GoldenAssertion) for a in finals):
        finals.append(GoldenAssertion(type="golden", match=use.compare))
    wanting = [
        i for i, a in enumerate(finals) if isinstance(a, GoldenAssertion) and a.recorded is None
    ]
    if not wanting:
        return case if len(finals) == len(case.final_assertions) else _with(case, finals)
    path = case_golden_file(case)
    recorded = read_golden(path) if path is not None and path.exists() else None
    for index in wanting:
        spec = finals[index]
        update: dict[str, object] = {"golden_file": None if path is None else str(path)}
        if recorded is not None:
            update["recorded"] = recorded
        finals[index] = spec.model_copy(update=update)
    return _with(case, finals)


def _with(case: Case, finals: list[AssertionSpec]) -> Case:
    return case.model_copy(update={"final_assertions": finals})


def read_golden(path: Path) -> GoldenConversation:
    """The golden conversation in `path`, or an InputError naming the file, line, field."""
    where = str(path)
    try:
        size = path.stat().st_size
        if size > MAX_GOLDEN_BYTES:
            raise InputError(
                InputProblem(
                    f"a golden file is at most {MAX_GOLDEN_BYTES >> 20} MB; this one is "
                    f"{size / 1e6:.1f} MB",
                    file=where,
                )
            )
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(InputProblem(f"cannot read the golden file: {exc}", file=where)) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            InputProblem(f"not JSON: {exc.msg}", file=where, line=exc.lineno)
        ) from None
    try:
        return GoldenConversation.model_validate(data)
    except ValidationError as exc:
        problems = [
            InputProblem(
                error["msg"],
                file=where,
                field=".".join(str(part) for part in error["loc"]) or None,
            )
            for error in exc.errors()
        ]
        raise InputError(problems) from None
