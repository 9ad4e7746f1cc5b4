"""Attachments: `file://` sources are read once, at submission, and sent as data: URLs.

Paths are relative to the case file and must stay inside the case file's folder, so a
case file cannot make the runner read (and send to an agent) an arbitrary file.
Workers never read the submitter's disk: the inlined case is what gets stored.
"""

from __future__ import annotations

import base64
import mimetypes
from pathlib import Path
from urllib.parse import unquote

from agenttest_worker.cases.case_model import Attachment, Case
from agenttest_worker.errors import InputError, InputProblem

MAX_ATTACHMENT_BYTES = 20 * 1024 * 1024


def attachment_path(source: str, base_dir: Path) -> Path:
    """The file a `file://` source names, checked to lie inside `base_dir`."""
    raw = unquote(source.removeprefix("file://"))
    root = base_dir.resolve()
    path = (root / raw).resolve() if not Path(raw).is_absolute() else Path(raw).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"{source!r} is outside the case file's folder {root}")
    if not path.is_file():
        raise ValueError(f"{source!r}: file not found ({path})")
    size = path.stat().st_size
    if size > MAX_ATTACHMENT_BYTES:
        raise ValueError(
            f"{source!r} is {size / 1e6:.1f} MB; attachments may be at most "
            f"{MAX_ATTACHMENT_BYTES >> 20} MB"
        )
    return path


def data_url(path: Path, mime_type: str | None = None) -> str:
    mime = mime_type or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def inline_attachments(case: Case) -> Case:
    """The case with every file:// attachment replaced by a data: URL (or an InputError)."""
    if not any(a.source.startswith("file://") for t in case.turns for a in t.attachments):
        return case
    base_dir = Path(case.source_file).parent if case.source_file else Path.cwd()
    problems: list[InputProblem] = []
    turns = []
    for i, turn in enumerate(case.turns):
        attachments: list[Attachment] = []
        for j, attachment in enumerate(turn.attachments):
            if not attachment.source.startswith("file://"):
                attachments.append(attachment)
                continue
            try:
                path = attachment_path(attachment.source, base_dir)
            except ValueError as exc:
                problems.append(case.problem(str(exc), ("turns", i, "attachments", j, "source")))
                continue
            attachments.append(
                attachment.model_copy(
                    update={
                        "source": data_url(path, attachment.mime_type),
                        "name": attachment.name or path.name,
                    }
                )
            )
        turns.append(turn.model_copy(update={"attachments": attachments}))
    if problems:
        raise InputError(problems)
    return case.model_copy(update={"turns": turns})
