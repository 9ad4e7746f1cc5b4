"""docs/assertions.md lists every registered assertion type, each with an example that
the case model accepts as written (a page whose examples drift from the code misleads
the reader it is for)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from agenttest_worker.assertions import ASSERTION_TYPES
from agenttest_worker.cases import Case

PAGE = Path(__file__).parent.parent / "docs" / "assertions.md"
BLOCK = re.compile(r"```(json|yaml)\n(.*?)```", re.DOTALL)


def _examples() -> list[dict[str, Any]]:
    """Every assertion written in the page's code blocks (a case's, its assertions)."""
    found: list[dict[str, Any]] = []
    for kind, text in BLOCK.findall(PAGE.read_text(encoding="utf-8")):
        if kind == "yaml":
            values = [yaml.safe_load(text)]
        else:
            try:
                values = [json.loads(text)]
            except json.JSONDecodeError:
                values = [json.loads(line) for line in text.splitlines() if line.strip()]
        for value in values:
            if isinstance(value, dict) and "assertions" in value:
                found += value["assertions"]
            elif isinstance(value, dict) and "final_assertions" in value:
                found += value["final_assertions"]
            elif isinstance(value, dict) and "type" in value:
                found.append(value)
    return found


def _types(assertion: dict[str, Any]) -> set[str]:
    inner = [assertion.get("assertion"), *assertion.get("assertions", [])]
    return {assertion["type"]}.union(*(_types(a) for a in inner if isinstance(a, dict)))


def test_every_type_has_a_section_and_an_example_the_case_model_accepts() -> None:
    text = PAGE.read_text(encoding="utf-8")
    examples = _examples()
    shown: set[str] = set()
    for example in examples:
        Case.model_validate({"id": "x", "input": "hi", "final_assertions": [example]})
        shown |= _types(example)
    assert set(ASSERTION_TYPES) <= shown, set(ASSERTION_TYPES) - shown
    for name in ASSERTION_TYPES:
        assert f"[`{name}`]" in text or f"`{name}`" in text.split("\n## ")[0], name
