"""Input problems: everything wrong with what the user gave us, located precisely.

A case file with errors is rejected before anything runs, so loaders collect every
problem they can find (not just the first) and raise them together.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# A field's place in a case: ("turns", 0, "assertions", 1, "use").
FieldPath = tuple[str | int, ...]


def format_field(path: FieldPath) -> str:
    """turns[0].assertions[1].use"""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


@dataclass(frozen=True)
class InputProblem:
    """One thing wrong with an input, located by file, line (or test name) and field."""

    message: str
    file: str | None = None
    line: int | None = None
    field: str | None = None
    test: str | None = None
    # The id of the case it is about, when it has one (not shown: `test` names it): a
    # later case with the same id is still a duplicate of this one.
    case_id: str | None = dataclasses.field(default=None, compare=False)

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = self.file
            if self.line is not None:
                where += f":{self.line}"
        if self.test:
            where += f" (test {self.test!r})" if where else f"test {self.test!r}"
        parts = [p for p in (where, self.field) if p]
        parts.append(self.message)
        return ": ".join(parts)


class InputError(Exception):
    """One or more input problems; the CLI prints each and exits with code 2."""

    def __init__(self, problems: list[InputProblem] | InputProblem | str) -> None:
        if isinstance(problems, str):
            problems = [InputProblem(problems)]
        elif isinstance(problems, InputProblem):
            problems = [problems]
        self.problems: list[InputProblem] = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class ConfigError(InputError):
    """A problem in agenttest.yaml or the environment it refers to."""
