"""JSON as Postgres can store it: no NUL character.

Postgres text, and so jsonb, cannot hold U+0000: an agent's reply (or a tool call's
arguments, an agent's reported state, a judge's reason) carrying one made the turn's
write fail with "unsupported Unicode escape sequence", every time the turn was played
again, and its run never finished. On Postgres every JSON document the store writes
goes through `storable_json`, which turns each NUL into U+FFFD, the replacement
character, as decoders do with bytes they cannot represent, and so do the text values
of the rows it inserts (`storable_row`). SQLite keeps them as they are.
"""

from __future__ import annotations

import json
import re
from typing import Any

# A \u0000 escape, not an escaped backslash followed by "u0000": preceded by an even
# number of backslashes (none included).
_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def storable_json(text: str) -> str:
    """JSON text with every NUL character (the escape `\\u0000`) as U+FFFD."""
    if "\\u0000" not in text:  # the common case: one scan, no copy
        return text
    return _NUL_ESCAPE.sub(lambda m: m.group(1) + "\\ufffd", text)


def dumps_storable(value: Any) -> str:
    """`json.dumps`, storable by Postgres (what its JSON columns are written with)."""
    return storable_json(json.dumps(value))


def storable_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row whose text values hold no NUL (JSON values are written by `dumps_storable`)."""
    if not any(isinstance(value, str) and "\x00" in value for value in row.values()):
        return row
    return {
        key: value.replace("\x00", "\ufffd") if isinstance(value, str) else value
        for key, value in row.items()
    }
