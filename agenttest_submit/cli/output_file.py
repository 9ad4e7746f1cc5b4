"""-o FILE: whether it can be written, checked before anything runs, and a command's
printed output written to it."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from agenttest_worker.errors import InputProblem


def output_problem(output: str | None, flag: str = "-o") -> InputProblem | None:
    """Why `output` cannot be written, found before anything runs (not after an hour)."""
    if not output:
        return None
    path = Path(output).expanduser()
    folder = path.parent
    if path.is_dir():
        why = "it is a folder; give a file name"
    elif not folder.is_dir():
        why = f"folder {folder} does not exist"
    elif not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        why = "permission denied"
    else:
        return None
    return InputProblem(f"cannot write {output}: {why}", field=flag)


@contextlib.contextmanager
def written_to(output: str | None) -> Iterator[None]:
    """While inside, what is printed on stdout goes to `output` (-o of a subcommand),
    said on stderr once written; None: stdout as it is."""
    if not output:
        yield
        return
    with (
        Path(output).expanduser().open("w", encoding="utf-8") as handle,
        contextlib.redirect_stdout(handle),
    ):
        yield
    print(f"written to {output}", file=sys.stderr)
