"""`state:` on an agent entry or a case: where the state an agent left in its system is
read (its end state), as users write it.

After the conversation (and with `each_turn: true` after every turn) the runner calls
`url` with `method`, `headers` and, for a POST, the body template `request` (the http
protocol's templates: `{{session_id}}`, `{{case_id}}`, `{{turn}}`), and takes the state
from the reply at the JSONPath `response` (the whole body by default). The call itself
is made by agents/state_fetch.py.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from agenttest_worker.agents.http.urls import url_problem
from agenttest_worker.json_values import compile_path

# The placeholders a state URL and body may hold (as in an http agent's templates).
STATE_PLACEHOLDERS = ("session_id", "case_id", "turn")
_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")


class StateEndpoint(BaseModel):
    """Where an agent's state is read after a conversation (docs/agents.md "End state")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(min_length=1)
    method: Literal["GET", "POST"] = "GET"
    headers: dict[str, str] = Field(default_factory=dict)
    request: Any = None
    response: str = "$"
    each_turn: bool = False

    @field_validator("url")
    @classmethod
    def _callable_url(cls, url: str) -> str:
        unknown = sorted(set(_PLACEHOLDER.findall(url)) - set(STATE_PLACEHOLDERS))
        if unknown:
            raise ValueError(
                f"unknown placeholder {{{{{unknown[0]}}}}} in the state URL "
                f"(it may hold {', '.join('{{' + p + '}}' for p in STATE_PLACEHOLDERS)})"
            )
        # Placeholders are filled in at call time; checked as the URL they will be.
        problem = url_problem(_PLACEHOLDER.sub("x", url))
        if problem:
            raise ValueError(problem)
        return url

    @field_validator("response")
    @classmethod
    def _valid_path(cls, path: str) -> str:
        compile_path(path)
        return path

    @field_validator("request")
    @classmethod
    def _body_for_post(cls, request: Any, info: ValidationInfo) -> Any:
        # (`method` is validated first: it is declared before `request`.)
        if request is not None and info.data.get("method", "GET") != "POST":
            raise ValueError("a state `request` body is sent with method: POST")
        return request
