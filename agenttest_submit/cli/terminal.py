"""What the terminal we write to can show: colour, and a line redrawn in place.

Colour follows the conventions users set once for every tool, in this order:
`NO_COLOR` (set and not empty: never, https://no-color.org), `FORCE_COLOR` (set and
not empty: always, even into a pipe or a file, unless it is 0/false/no, which turns
colour off), `TERM=dumb` (never), and otherwise colour only on a terminal. A line
redrawn in place (the progress bar) needs a terminal that is not `dumb`: FORCE_COLOR
asks for colour, it does not make a pipe a terminal.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TextIO

_FALSE = ("0", "false", "no", "off")


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed, or not a real stream
        return False


def color_wanted(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Whether text written to `stream` should carry ANSI colours."""
    env = os.environ if environ is None else environ
    if env.get("NO_COLOR"):
        return False
    forced = env.get("FORCE_COLOR")
    if forced:
        return forced.strip().lower() not in _FALSE
    if env.get("TERM") == "dumb":
        return False
    return _is_terminal(stream)


def redraws_in_place(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Whether `stream` is a terminal that understands "\\r" and erase-line."""
    env = os.environ if environ is None else environ
    return _is_terminal(stream) and env.get("TERM") != "dumb"
