"""The tdx YAML test: a `tests:` entry, flat (`user_input` + `criteria`) or `rounds`,
and how it becomes the one internal `Case` shape (`to_case_data`).

YAML `criteria` become an `agent` assertion on the configured default judge that sees
the conversation so far; YAML cases default to `on_missing_input: end`. How that judge
is asked and what its verdict needs (`votes`, `tie`, `min_agreement`, `min_score`,
`judge_params`) may be given next to `criteria`, on a test or a round (a round's own
over its test's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from agenttest_worker.agents.options import Options
from agenttest_worker.agents.state_endpoint import StateEndpoint
from agenttest_worker.assertions import Assertion, on_change
from agenttest_worker.cases.case_model import (
    Attachment,
    CaseSource,
    FieldError,
    OnMissingInput,
    SimulatorConfig,
    StrictModel,
)
from agenttest_worker.errors import FieldPath

# What a test or a round may say of how its criteria are judged: the agent assertion's
# fields of the same names (assertions/agent.py).
JUDGING = ("votes", "tie", "min_agreement", "min_score")


class _Judging(StrictModel):
    votes: int | None = Field(default=None, ge=1)
    tie: Literal["fail", "pass"] | None = None
    min_agreement: float | None = Field(default=None, ge=0, le=1)
    min_score: float | None = Field(default=None, allow_inf_nan=False)
    # Model parameters for the criteria's judge, over its entry's `params` (the agent
    # assertion's `options.params`).
    judge_params: dict[str, Any] | None = None

    def judging(self) -> dict[str, Any]:
        """The judging fields this test or round gives."""
        return {k: getattr(self, k) for k in JUDGING if getattr(self, k) is not None}

    def _judging_needs_criteria(self, judged: bool) -> None:
        # Where no criteria are judged, a judging field is a mistake (a misplaced one).
        given = next(iter(self.judging()), "judge_params" if self.judge_params else None)
        if not judged and given:
            raise FieldError(given, f"`{given}` says how `criteria` are judged: give criteria")


class _Round(_Judging):
    user_input: str
    criteria: str | None = None
    assertions: list[Assertion] = Field(default_factory=list)
    attachments: list[Attachment] = Field(default_factory=list)
    options: Options | None = None

    @model_validator(mode="after")
    def _judged(self) -> _Round:
        self._judging_needs_criteria(bool(self.criteria))
        return self


class YamlTest(_Judging):
    """One entry of a tdx `tests:` list: flat (user_input + criteria) or `rounds`."""

    name: str = Field(min_length=1)
    id: str | None = None
    description: str | None = None
    user_input: str | None = None
    criteria: str | None = None
    rounds: list[_Round] | None = None
    assertions: list[Assertion] = Field(default_factory=list)
    attachments: list[Attachment] = Field(default_factory=list)
    agent: str | None = None
    options: Options | None = None
    simulator: SimulatorConfig | None = None
    on_missing_input: OnMissingInput | None = None
    final_assertions: list[Assertion] = Field(default_factory=list)
    tool_mocks: dict[str, Any] = Field(default_factory=dict)
    max_turns: int | None = Field(default=None, ge=1)
    tags: list[str] = Field(default_factory=list)
    repeat: int | None = Field(default=None, ge=1)
    state: StateEndpoint | None = None

    @field_validator("tags", mode="before")
    @classmethod
    def _tags_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_form(self) -> YamlTest:
        if self.user_input is None and not self.rounds:
            raise FieldError("user_input", "a test needs `user_input` (flat format) or `rounds`")
        if self.user_input is not None and self.rounds:
            raise FieldError(
                "rounds", "a test has either `user_input` (flat format) or `rounds`, not both"
            )
        if self.rounds is not None and (self.criteria or self.assertions or self.attachments):
            field = next(f for f in ("criteria", "assertions", "attachments") if getattr(self, f))
            raise FieldError(field, "with `rounds`, put criteria and assertions on each round")
        self._judging_needs_criteria(
            bool(self.criteria) or any(r.criteria for r in self.rounds or [])
        )
        return self

    def source(self, base: FieldPath, line_of: Callable[[FieldPath], int | None]) -> CaseSource:
        """How the case of `to_case_data` maps back to this test (`base`: its place in
        the file): a flat test's one turn is the test itself, each round a turn, and
        `criteria` the assertion appended after a round's own."""
        rounds: list[_Round] | None = self.rounds or None
        criteria = (
            {i: len(r.assertions) for i, r in enumerate(rounds) if r.criteria}
            if rounds
            else ({0: len(self.assertions)} if self.criteria else {})
        )
        return CaseSource(
            single=rounds is None,
            turns_key="rounds",
            input_key="user_input",
            criteria=criteria,
            base=base,
            line_of=line_of,
        )

    def to_case_data(self) -> dict[str, Any]:
        rounds = self.rounds or [
            _Round(
                user_input=self.user_input or "",
                criteria=self.criteria,
                assertions=self.assertions,
                attachments=self.attachments,
            )
        ]
        turns = [
            {
                "input": _block_text(r.user_input),
                "assertions": [
                    *(a.model_dump(exclude_unset=True) for a in r.assertions),
                    *(
                        [
                            criteria_assertion(
                                r.criteria,
                                {**(self.judge_params or {}), **(r.judge_params or {})},
                                **{**self.judging(), **r.judging()},
                            )
                        ]
                        if r.criteria
                        else []
                    ),
                ],
                "attachments": [a.model_dump(exclude_none=True) for a in r.attachments],
                **({"options": r.options.model_dump(exclude_none=True)} if r.options else {}),
            }
            for r in rounds
        ]
        data: dict[str, Any] = {
            "id": self.id or self.name,
            "name": self.name,
            "type": "multi_turn" if self.rounds else "single_turn",
            "turns": turns,
            "on_missing_input": self.on_missing_input or "end",
            "final_assertions": [a.model_dump(exclude_unset=True) for a in self.final_assertions],
            "tool_mocks": self.tool_mocks,
            "tags": self.tags,
        }
        if self.simulator is not None:
            data["type"] = "multi_turn"
        optional = {
            "description": self.description,
            "agent": self.agent,
            "options": self.options.model_dump(exclude_none=True) if self.options else None,
            "simulator": self.simulator.model_dump(exclude_none=True) if self.simulator else None,
            "max_turns": self.max_turns,
            "repeat": self.repeat,
            "state": self.state.model_dump(exclude_unset=True) if self.state else None,
        }
        data.update({k: v for k, v in optional.items() if v is not None})
        return data


def _block_text(text: str) -> str:
    # YAML `|` blocks end in a newline the author did not mean to send.
    return text.rstrip("\n")


def criteria_assertion(criteria: str, params: dict[str, Any], **judging: Any) -> dict[str, Any]:
    """A tdx criterion as an agent assertion on the default judge, over the conversation,
    judged as `judging` says (votes, tie, min_agreement, min_score), the judge called
    with `params` over its entry's."""
    options: dict[str, Any] = {"metadata": {"criteria": _block_text(criteria)}}
    if params:
        options["params"] = params
    return {"type": "agent", "conversation": True, "options": options, **judging}


def _rebuild_with_registered_types() -> None:
    # As cases/case_model.py does for its models: a late assertion type reaches these too.
    for model in (_Round, YamlTest):
        model.model_rebuild(force=True)


on_change(_rebuild_with_registered_types)
