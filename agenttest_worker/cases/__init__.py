"""Cases: the one internal model both spec formats are read into, and the readers.

`model` holds the case (turns, simulator, assertions, limits); `files` finds case files
and reads each format (JSONL/JSON, tdx YAML) into cases, reporting every problem with
file, line and field; `checks` verifies the references a case makes (agents, scripts)
against the run's agenttest.yaml; `attachments` inlines `file://` attachments.
"""

from agenttest_worker.cases.model import (
    Attachment,
    Case,
    CaseSource,
    FieldError,
    InteractiveConfig,
    OnMissingInput,
    SimulatorConfig,
    Turn,
    YamlTest,
)

__all__ = [
    "Attachment",
    "Case",
    "CaseSource",
    "FieldError",
    "InteractiveConfig",
    "OnMissingInput",
    "SimulatorConfig",
    "Turn",
    "YamlTest",
]
