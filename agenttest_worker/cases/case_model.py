"""The case model: one internal shape for both spec formats.

A yao JSONL case (single-turn `input` + `assertions`, or multi-turn `turns`) and a tdx
YAML test (flat `user_input` + `criteria`, or `rounds`) both become a `Case` whose
conversation is always `turns`. Readers of files live beside it (files.py and the
reader of each format); this module only knows dictionaries.

Decisions where the specs are open (also in the README):
- `input` and `turns` are exclusive: the spec's single-turn form is shorthand for
  `turns: [{input, assertions}]`, and a case with both would be ambiguous.
- `type` defaults to `single_turn` for the `input` form without a simulator and to
  `multi_turn` otherwise. It gives the case its default `on_missing_input`
  (engine/next_input.py): a single-turn case ends after its turn, a multi-turn one (the
  spec's T002) is skipped when its agent awaits input with nothing to answer it. A
  `single_turn` case with more than one static turn is an error.
- A `max_turns` below the number of static turns is not an error in the file: the
  case plays that many turns and fails with `max turns (N) exceeded`, as a case whose
  simulator needs a turn past it does.
- A case with no input at all, or a blank first one (empty or whitespace only), loads,
  and fails when run with "no initial input" (the spec's test-level error table; for a
  blank one the error says so: "no initial input: the first input is blank ..."). It is
  not an input error that stops the run: the other cases run, as the spec's table is
  about one test's outcome. A later blank turn is sent as written.
- YAML tests (`yaml_model.py`) become a Case too: their `criteria` an `agent`
  assertion on the default judge, over the conversation so far.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from agenttest_worker.agents.options import Options
from agenttest_worker.agents.refs import parse_ref
from agenttest_worker.agents.state_endpoint import StateEndpoint
from agenttest_worker.assertions import AgentAssertion, Assertion, GoldenAssertion, on_change
from agenttest_worker.assertions.checking import walk
from agenttest_worker.durations import parse_duration
from agenttest_worker.errors import FieldPath, InputProblem, format_field

OnMissingInput = Literal["skip", "fail", "end"]
CaseType = Literal["single_turn", "multi_turn"]
DEFAULT_MAX_TURNS = 20


class FieldError(ValueError):
    """A check across fields, raised from a model validator, that belongs to one field.

    Pydantic locates a model validator's error at the model itself; the readers add
    `field` so that the message names what the author should change.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class StrictModel(BaseModel):
    # Unknown keys are errors (they are usually typos); numbers where text is expected
    # (`user_input: 42` in YAML) are meant as text.
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)


class Attachment(StrictModel):
    """A file sent with a turn. `file://` sources are relative to the case file.

    The submitter inlines file sources as `data:` URLs before a run is stored, so that
    workers on other machines never need the submitter's disk.
    """

    type: str = "file"
    source: str
    name: str | None = None
    mime_type: str | None = None

    @field_validator("source")
    @classmethod
    def _known_scheme(cls, source: str) -> str:
        if not source.startswith(("file://", "data:", "http://", "https://")):
            raise ValueError(
                f"{source!r}: an attachment source is file://PATH, data:..., or http(s)://URL"
            )
        return source


class Turn(StrictModel):
    input: str
    assertions: list[Assertion] = Field(default_factory=list)
    options: Options | None = None
    attachments: list[Attachment] = Field(default_factory=list)
    tool_mocks: dict[str, Any] | None = None


class SimulatorConfig(StrictModel):
    """Who plays the user once static turns run out.

    The spec writes the simulator's metadata both as `simulator.options.metadata` and
    (in its hybrid example) as `simulator.metadata`; both are accepted and merged.
    """

    # None: agenttest.yaml's defaults.simulator, filled in when the case is checked.
    use: str | None = None
    options: Options | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("use")
    @classmethod
    def _ref(cls, use: str | None) -> str | None:
        # A bare name is an agent, as in an `agent` assertion's `use`.
        return None if use is None else str(parse_ref(use, default_kind="agents"))

    def effective_metadata(self) -> dict[str, Any]:
        base = self.options.metadata if self.options else {}
        return {**base, **self.metadata}

    def max_turns(self) -> int | None:
        value = self.effective_metadata().get("max_turns")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        if isinstance(value, str) and value.isdigit() and int(value) > 0:
            return int(value)
        return None


class InteractiveConfig(StrictModel):
    enabled: bool = False
    timeout: float = 300.0

    @field_validator("timeout", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return parse_duration(value)


@dataclass(frozen=True, eq=False)
class CaseSource:
    """How a case was written, so that checks of the normalized case (where the
    one-turn forms became `turns[0]`, and YAML's rounds and criteria turns and
    assertions) name its fields, and find their lines, as the author wrote them.

    Not part of what the case is: the `input` form and its `turns` equivalent are
    the same case, so every CaseSource compares equal."""

    single: bool = False  # the one turn's fields at the case's top level
    turns_key: str = "turns"  # YAML: rounds
    input_key: str = "input"  # YAML: user_input
    # YAML: the index, in each turn's assertions, of the one written as `criteria`.
    criteria: dict[int, int] = field(default_factory=dict)
    base: FieldPath = ()  # YAML: ("tests", n)
    # A field's line, when the case spans several (YAML; JSON written over many lines).
    line_of: Callable[[FieldPath], int | None] | None = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CaseSource)

    def __hash__(self) -> int:
        return 0

    def written(self, path: FieldPath) -> FieldPath:
        """The author's name for a field of the normalized case."""
        if len(path) < 2 or path[0] != "turns" or not isinstance(path[1], int):
            return path
        index, rest = path[1], path[2:]
        if rest[:1] == ("input",):
            rest = (self.input_key, *rest[1:])
        elif len(rest) >= 2 and rest[0] == "assertions" and self.criteria.get(index) == rest[1]:
            rest = ("criteria",)
        return rest if self.single else (self.turns_key, index, *rest)


_AS_NORMALIZED = CaseSource()


class Case(StrictModel):
    id: str = Field(min_length=1)
    name: str | None = None
    description: str | None = None
    type: CaseType | None = None
    agent: str | None = None
    options: Options | None = None
    # Single-turn shorthand; folded into `turns` once validated.
    input: str | None = None
    assertions: list[Assertion] = Field(default_factory=list)
    attachments: list[Attachment] = Field(default_factory=list)
    turns: list[Turn] = Field(default_factory=list)
    simulator: SimulatorConfig | None = None
    interactive: InteractiveConfig | None = None
    on_missing_input: OnMissingInput | None = None
    final_assertions: list[Assertion] = Field(default_factory=list)
    tool_mocks: dict[str, Any] = Field(default_factory=dict)
    max_turns: int | None = Field(default=None, ge=1)
    tags: list[str] = Field(default_factory=list)
    # Play the case this many times, as independent conversations (`--repeat` overrides).
    repeat: int | None = Field(default=None, ge=1)
    # Where the state its agent leaves behind is read (over the agent entry's `state:`).
    state: StateEndpoint | None = None

    # Which of its `repeat` plays a stored conversation is (1-based), set by the
    # submitter when it stores each repetition; like source_file, not the author's.
    repetition: int | None = Field(default=None, exclude=True)
    # Set with `repetition` when the case is played with `--repeat auto`: `repeat` is
    # then the most it may be played (--max-repeat), not how often it is.
    max_repeat: int | None = Field(default=None, exclude=True)
    # Where the case came from, for messages and for resolving file:// attachments.
    source_file: str | None = Field(default=None, exclude=True)
    source_line: int | None = Field(default=None, exclude=True)
    # One shared by every case until told otherwise (a CaseSource never changes; pydantic
    # would deep-copy a plain default for each case).
    _source: CaseSource = PrivateAttr(default_factory=lambda: _AS_NORMALIZED)

    def written_as(self, source: CaseSource) -> None:
        self._source = source

    def problem(self, message: str, path: FieldPath) -> InputProblem:
        """A problem with field `path` of this (normalized) case, named and located as
        its author wrote it."""
        source = self._source
        written = source.written(path)
        line = source.line_of((*source.base, *written)) if source.line_of else None
        return InputProblem(
            message,
            file=self.source_file,
            line=line or self.source_line,
            field=format_field(written) or None,
            test=self.id,
        )

    @field_validator("id", mode="before")
    @classmethod
    def _id_text(cls, value: Any) -> Any:
        # Ids like 1 or 2.5 in hand-written JSONL are meant as text.
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        return value

    @field_validator("agent")
    @classmethod
    def _agent_name(cls, agent: str | None) -> str | None:
        if agent is None:
            return None
        ref = parse_ref(agent, default_kind="agents")
        if ref.kind != "agents":
            raise ValueError(f"{agent!r}: the target is a registry agent name")
        return ref.id

    @field_validator("tags", mode="before")
    @classmethod
    def _tags_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _normalize(self) -> Case:
        single_form = self.input is not None
        if single_form and self.turns:
            raise FieldError(
                "turns", "give either `input` (single-turn) or `turns` (multi-turn), not both"
            )
        if not single_form and (self.assertions or self.attachments):
            field = "assertions" if self.assertions else "attachments"
            raise FieldError(
                field,
                f"top-level `{field}` belongs to the single-turn form (with `input`); "
                "put them on a turn, or use final_assertions",
            )
        if self.type is None:
            dynamic = self.simulator is not None or (
                self.interactive is not None and self.interactive.enabled
            )
            self.type = "single_turn" if single_form and not dynamic else "multi_turn"
        if single_form:
            assert self.input is not None
            self.turns = [
                Turn(input=self.input, assertions=self.assertions, attachments=self.attachments)
            ]
            self.input = None
            self.assertions = []
            self.attachments = []
        if self.type == "single_turn" and len(self.turns) > 1:
            raise FieldError(
                "type", f"type is single_turn but the case has {len(self.turns)} turns"
            )
        return self

    # -- derived values the engine uses ------------------------------------------------

    def limit_turns(self) -> int:
        """max_turns on the case, else the simulator's metadata.max_turns, else 20."""
        if self.max_turns is not None:
            return self.max_turns
        if self.simulator is not None and (sim_max := self.simulator.max_turns()) is not None:
            return sim_max
        return DEFAULT_MAX_TURNS

    def with_simulator_named(self, default: str | None) -> Case:
        """The case with its simulator's `use` filled in from `default` (agenttest.yaml's
        defaults.simulator) when it names none; as it is without a default."""
        if self.simulator is None or self.simulator.use is not None or default is None:
            return self
        named = self.simulator.model_copy(
            update={"use": str(parse_ref(default, default_kind="agents"))}
        )
        return self.model_copy(update={"simulator": named})

    def with_default_simulator(self, use: str) -> Case:
        """The case played on by `--simulator` when it names no simulator of its own.

        A case that gains a simulator is a multi-turn case: that is what asking for a
        simulator on the command line means.
        """
        if self.simulator is not None:
            return self
        return self.model_copy(update={"simulator": SimulatorConfig(use=use), "type": "multi_turn"})

    @property
    def key(self) -> str:
        """The conversation's key in its run: the case id, or `repetition_key` for one
        repetition of a repeated case."""
        return self.id if self.repetition is None else repetition_key(self.id, self.repetition)

    def repetitions(self, times: int) -> list[Case]:
        """The case as `times` conversations (itself when once), each knowing which it is."""
        if times == 1:
            return [self]
        return [
            self.model_copy(update={"repeat": times, "repetition": number})
            for number in range(1, times + 1)
        ]

    def iter_assertions(self) -> list[Assertion]:
        """Every assertion of the case, those nested in groups included."""
        outer: list[Assertion] = [a for t in self.turns for a in t.assertions]
        outer += self.final_assertions
        return [found for a in outer for _, found in walk(a)]

    def needs_default_judge(self) -> bool:
        return any(
            (isinstance(a, AgentAssertion) and a.use is None)
            or (isinstance(a, GoldenAssertion) and a.match == "judge" and a.use is None)
            for a in self.iter_assertions()
        )

    def to_record(self) -> dict[str, Any]:
        """The normalized case as JSON-ready data: what --dry-run prints and -o writes.

        Only what the author gave (or normalization set) is written, so an assertion's
        explicit `"value": null` survives and reading the record back gives an equal case.
        """
        data = self.model_dump(mode="json", exclude_unset=True)
        data["turns"] = [_without_defaults(t, Turn) for t in data.get("turns", [])]
        return _without_defaults(data, Case)

    def to_run_record(self) -> dict[str, Any]:
        """What a run stores of the case: its record, and where it is written
        (`source_file`, `source_line`), which the case's result reports so that CI
        annotations point at the case. Not in to_record: a case written out with -o
        and read back is written elsewhere."""
        record = self.to_record()
        # Generated cases name their generator here ("agents:gen?count=3"): not a place
        # a CI annotation can point at.
        if self.source_file is not None and _is_file(self.source_file):
            record["source_file"] = self.source_file
            if self.source_line is not None:
                record["source_line"] = self.source_line
        if self.repetition is not None:
            record["repetition"] = self.repetition
        if self.max_repeat is not None:
            record["max_repeat"] = self.max_repeat
        return record


def repetition_key(case_id: str, number: int) -> str:
    """The stored key of a repeated case's repetition `number` (1-based): "T1#2"."""
    return f"{case_id}#{number}"


@cache
def _is_file(name: str) -> bool:
    # Cached: every case of a 100,000-line file asks about the same name.
    return os.path.isfile(name)


def _without_defaults(record: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    # Only the case's and the turns' own keys: inside an assertion, [] and null are values.
    # A key is dropped only when it holds the field's default (None, [], {}), so that an
    # explicit `"interactive": {}` (which is not None) still reads back as an equal case.
    defaults = _defaults(model)
    return {k: v for k, v in record.items() if k not in defaults or v != defaults[k]}


@cache
def _defaults(model: type[BaseModel]) -> dict[str, Any]:
    # pydantic inspects each default factory's signature on every call: far too slow to
    # do per case when 100,000 cases stream through, so it is done once per model.
    return {
        name: field.get_default(call_default_factory=True)
        for name, field in model.model_fields.items()
    }


def _rebuild_with_registered_types() -> None:
    # An assertion type registered once these models exist (a plugin loaded late, a
    # test): rebuild them, inner models first, so that their assertion fields take it.
    for model in (Turn, Case):
        model.model_rebuild(force=True)


on_change(_rebuild_with_registered_types)
