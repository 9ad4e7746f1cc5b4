"""References to agents and scripts as users write them: `agents:NAME`, `scripts:NAME`.

The `-i` flag adds query parameters (`agents:ID?count=10&focus=edge-cases`); the same
parser serves both. A reference never names an arbitrary module: scripts resolve only
inside the configured scripts folder (see agents/script_loader.py).
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import parse_qsl

from pydantic import BaseModel, ConfigDict

RefKind = Literal["agents", "scripts"]

# Registry names look like `workers.test.validator` or `assistants.expense`; script ids
# like `tests.validate-expense`. No slashes, no leading dots: they are names, not paths.
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


class Ref(BaseModel):
    """A parsed `kind:id?params` reference."""

    model_config = ConfigDict(frozen=True)

    kind: RefKind
    id: str
    params: dict[str, str] = {}

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}"


def is_valid_name(name: str) -> bool:
    return bool(_NAME.match(name)) and ".." not in name


def parse_ref(text: str, *, default_kind: RefKind | None = None, allow_params: bool = False) -> Ref:
    """Parse `agents:ID`, `scripts:ID` (and `ID` when a default kind is given).

    Raises ValueError with a message fit for the user.
    """
    raw = text.strip()
    kind: str | None
    if ":" in raw and raw.split(":", 1)[0] in ("agents", "scripts"):
        kind, rest = raw.split(":", 1)
    else:
        kind, rest = default_kind, raw
    if kind is None:
        raise ValueError(f"{text!r} is not a reference: write agents:NAME or scripts:NAME")
    ident, _, query = rest.partition("?")
    if query and not allow_params:
        raise ValueError(f"{text!r}: query parameters are only allowed on -i generator inputs")
    if not ident or not is_valid_name(ident):
        raise ValueError(
            f"{text!r}: {ident!r} is not a valid name (letters, digits, '.', '-', '_'; no paths)"
        )
    params = dict(parse_qsl(query, keep_blank_values=True)) if query else {}
    return Ref(kind=kind, id=ident, params=params)
