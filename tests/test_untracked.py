"""Records that keep no fields-set (agenttest_worker/untracked.py): they behave as models
in every way the project uses them, hold no set of their own, and no model dumped with
`exclude_unset` (the one thing a fields-set is for) contains one."""

from __future__ import annotations

import copy
import json
import pickle
import re
import types
import typing
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import agenttest_worker.assertions  # noqa: F401  (registers every assertion spec)
from agenttest_worker.assertions.base import AssertionSpec
from agenttest_worker.cases.model import Case
from agenttest_worker.cases.yaml_model import YamlTest
from agenttest_worker.driver.run_cache import case_of
from agenttest_worker.engine.state import ConversationState, PendingInput
from agenttest_worker.results import AgentCallRecord, TurnResult, Usage
from agenttest_worker.store import steps
from agenttest_worker.untracked import UntrackedFields, share_fields_sets

ROOT = Path(__file__).resolve().parents[1]


def a_turn() -> TurnResult:
    turn = TurnResult(turn=1, input="hi", input_source="static")
    turn.output = "hello"
    turn.duration_ms = 12
    turn.calls = [AgentCallRecord.model_validate(_call())]
    turn.usage = Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7)
    return turn


def _call() -> dict[str, Any]:
    # Every field a call record requires, from its own schema.
    schema = AgentCallRecord.model_json_schema()
    sample = {"string": "x", "integer": 1, "number": 1.0, "boolean": False}
    props = schema["properties"]
    return {
        name: sample[props[name].get("type", "string")]
        if "enum" not in props[name]
        else props[name]["enum"][0]
        for name in schema.get("required", [])
    }


def test_a_record_filled_in_keeps_no_fields_set_and_shares_none() -> None:
    turn = a_turn()
    assert turn.model_fields_set == set()
    assert turn.__pydantic_fields_set__ is TurnResult(turn=2).__pydantic_fields_set__
    turn.__pydantic_fields_set__.add("output")  # what pydantic does on assignment
    assert TurnResult(turn=3).model_fields_set == set()


def test_a_record_dumps_copies_and_compares_as_a_model() -> None:
    turn = a_turn()
    text = turn.model_dump_json()
    again = TurnResult.model_validate_json(text)
    assert again == turn and again.model_dump_json() == text
    assert '"input":"hi"' in text and '"error"' not in text  # None fields left out
    deep = turn.model_copy(deep=True)
    deep.output = "changed"
    assert turn.output == "hello" and deep != turn
    assert turn.model_copy(update={"output": "x"}).output == "x"
    assert copy.deepcopy(turn) == turn
    assert pickle.loads(pickle.dumps(turn)) == turn
    state = ConversationState(case_id="c", session_id="s", turns=[turn])
    state.next_input = PendingInput(text="next", source="static", static_index=1)
    loaded = ConversationState.model_validate_json(state.model_dump_json())
    assert loaded == state and loaded.model_fields_set == set()


def _holds_untracked(annotation: Any, seen: set[type]) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if issubclass(annotation, UntrackedFields):
            return True
        if annotation in seen:
            return False
        seen.add(annotation)
        return any(_holds_untracked(f.annotation, seen) for f in annotation.model_fields.values())
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _holds_untracked(typing.get_args(annotation)[0], seen)
    if origin is not None or isinstance(annotation, types.UnionType):
        return any(_holds_untracked(arg, seen) for arg in typing.get_args(annotation))
    return False


def test_only_tracked_models_are_dumped_with_exclude_unset() -> None:
    # The files that dump with exclude_unset, and the models they dump there.
    dumped_in = {
        "agenttest_worker/cases/model.py": [Case],
        "agenttest_worker/cases/yaml_model.py": [YamlTest],
        "agenttest_worker/engine/assess.py": _subclasses(AssertionSpec),
    }
    found = {
        str(path.relative_to(ROOT))
        for package in ("agenttest_worker", "agenttest_submit")
        for path in (ROOT / package).rglob("*.py")
        if re.search(r"exclude_unset\s*=\s*True", path.read_text())
    }
    assert found == set(dumped_in), "a new exclude_unset: add what it dumps here"
    assert len(dumped_in["agenttest_worker/engine/assess.py"]) > 5
    for models in dumped_in.values():
        for model in models:
            assert not _holds_untracked(model, set()), model


def _subclasses(model: type[BaseModel]) -> list[type[BaseModel]]:
    found = [model]
    for sub in model.__subclasses__():
        found += _subclasses(sub)
    return found


def _stored_case(case_id: str) -> str:
    """A case as a run stores it: its record's text."""
    case = Case.model_validate(
        {
            "id": case_id,
            "turns": [
                {"input": "hi", "assertions": [{"type": "contains", "value": "x"}]},
                {"input": "and then", "assertions": [{"type": "regex", "pattern": "y+"}]},
            ],
            "final_assertions": [{"type": "contains", "value": "done"}],
        }
    )
    return json.dumps(case.to_run_record())


def _loaded(case_id: str) -> steps.LoadedCase:
    return steps.LoadedCase(
        run_id=f"run-{uuid.uuid4().hex}",
        case_id=case_id,
        case=_stored_case(case_id),
        agent=None,
        phase="new",
        next_turn=1,
        state=None,
        deliveries=1,
        run_cancelled=False,
        cancel_reason=None,
        run_options={},
        run_config={},
        deadline_at=None,
    )


def test_the_cases_a_worker_plays_share_one_fields_set_per_shape() -> None:
    first, second = case_of(_loaded("one")), case_of(_loaded("two"))
    assert first.__pydantic_fields_set__ is second.__pydantic_fields_set__
    for mine, theirs in zip(first.turns, second.turns, strict=True):
        assert mine.__pydantic_fields_set__ is theirs.__pydantic_fields_set__
        assert mine.assertions[0].__pydantic_fields_set__ is (
            theirs.assertions[0].__pydantic_fields_set__
        )
    # Different shapes keep different sets: the two turns' assertions set other fields.
    contains, regex = first.turns[0].assertions[0], first.turns[1].assertions[0]
    assert contains.__pydantic_fields_set__ is not regex.__pydantic_fields_set__
    assert first.final_assertions[0].__pydantic_fields_set__ is (contains.__pydantic_fields_set__)
    # What exclude_unset reads is what validation set: the record is the same.
    fresh = Case.model_validate_json(_stored_case("one"))
    assert first.to_record() == fresh.to_record()
    assert first.model_fields_set == fresh.model_fields_set


def test_a_shared_fields_set_refuses_changes_and_copies_are_plain() -> None:
    case = Case.model_validate_json(_stored_case("one"))
    other = Case.model_validate_json(_stored_case("two"))
    share_fields_sets(case)
    share_fields_sets(other)
    before = set(other.model_fields_set)
    with pytest.raises(TypeError, match="shared fields-set"):
        case.tags = ["changed"]
    assert other.model_fields_set == before and "tags" not in other.model_fields_set
    for copied in (
        case.model_copy(update={"id": "three"}),
        copy.deepcopy(case),
        pickle.loads(pickle.dumps(case)),
    ):
        assert type(copied.__pydantic_fields_set__) is set
        copied.__pydantic_fields_set__.add("tags")  # a copy's own, changed freely
    assert "tags" not in other.model_fields_set
    assert case.model_copy(update={"id": "three"}).model_fields_set >= {"id", "turns"}


def test_the_cases_a_worker_plays_share_one_empty_list_and_dict() -> None:
    """Every empty list and dict of a played case's models is one shared object (seven
    lists and a dict in a short case, held by every turn in flight): it refuses changes;
    a copy of the case has lists and dicts of its own; the record is the same."""
    first, second = case_of(_loaded("one")), case_of(_loaded("two"))
    empty_lists = [first.tags, first.attachments, first.turns[0].attachments, second.tags]
    assert first.tags == [] and all(found is first.tags for found in empty_lists)
    assert first.tool_mocks == {} and first.tool_mocks is second.tool_mocks
    for change in (
        lambda: first.tags.append("x"),
        lambda: first.tags.extend(["x"]),
        lambda: first.tags.insert(0, "x"),
        lambda: first.tool_mocks.update(x=1),
        lambda: first.tool_mocks.setdefault("x", 1),
        lambda: first.tool_mocks.__setitem__("x", 1),
    ):
        with pytest.raises(TypeError, match="shared empty"):
            change()
    assert second.tags == [] and second.tool_mocks == {}
    for copied in (copy.deepcopy(first), pickle.loads(pickle.dumps(first))):
        copied.tags.append("mine")
        copied.tool_mocks["mine"] = 1
        assert type(copied.tags) is list and type(copied.tool_mocks) is dict
    deep = first.model_copy(deep=True)
    deep.tags.append("mine")
    assert first.tags == [] and second.tags == []
    fresh = Case.model_validate_json(_stored_case("one"))
    assert first.to_record() == fresh.to_record()
    assert first.model_dump_json() == fresh.model_dump_json()
