"""Cases: the one internal model both spec formats are read into, and the readers.

- `model`: the case (turns, simulator, assertions, limits); `yaml_model`: the tdx test
  it may be written as. Both know dictionaries, not files.
- `files`: finding case files and reading each by its suffix (`iter_cases`,
  `load_cases`), with one reader per format: `json_reader` (JSONL/JSON, yao format)
  and `yaml_reader` (YAML, tdx format).
- `validation`: what the readers share: a raw case with where it was read (`Located`),
  its validation into a Case (`validate_case`), every problem with file, line and field.
- `checks`: the references a case makes (agents, scripts) against the run's
  agenttest.yaml. `attachments`: `file://` attachments inlined as data: URLs.
"""

from typing import TYPE_CHECKING

from agenttest_worker.cases.attachments import inline_attachments
from agenttest_worker.cases.case_model import (
    Attachment,
    Case,
    CaseSource,
    FieldError,
    InteractiveConfig,
    OnMissingInput,
    SimulatorConfig,
    Turn,
    repetition_key,
)
from agenttest_worker.cases.checks import check_case_refs, check_ref
from agenttest_worker.cases.files import (
    CASE_SUFFIXES,
    case_files_in,
    iter_cases,
    iter_stream_cases,
    load_cases,
)
from agenttest_worker.cases.validation import Located, validate_case

if TYPE_CHECKING:
    from agenttest_worker.cases.yaml_model import YamlTest

# `YamlTest` (yaml_model.py) is imported when asked for: only runs of tdx YAML files
# need its models (files.py reads those).


def __getattr__(name: str) -> object:
    if name == "YamlTest":
        from agenttest_worker.cases.yaml_model import YamlTest

        return YamlTest
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CASE_SUFFIXES",
    "Attachment",
    "Case",
    "CaseSource",
    "FieldError",
    "InteractiveConfig",
    "Located",
    "OnMissingInput",
    "SimulatorConfig",
    "Turn",
    "YamlTest",
    "case_files_in",
    "check_case_refs",
    "check_ref",
    "inline_attachments",
    "iter_cases",
    "iter_stream_cases",
    "load_cases",
    "repetition_key",
    "validate_case",
]
