"""Assertion types: one module per family, each registering its types where it defines them.

- `base`: the extension point: AssertionSpec (the fields every assertion carries),
  AssertionContext (what a checker sees), RoleCaller (how agent-backed assertions reach
  a judge), the registry (`register`, `assertion_types`, `on_change`), `Assertion` and
  `evaluate`.
- `text`: contains, equals, regex, not_contains, not_regex. `structure`: json_path,
  type (on the JSON document). `tools`: tool_called, tool_not_called. `agent`: a judge
  agent decides. `script`: a Python callable from the scripts folder decides.
  `latency`: how fast the target answered (its time to first token and to the end of
  its reply; the engine gives it a TimedContext). `trajectory`: tool_sequence,
  tool_count, turn_count (the calls made, the turns played). `traces`: trace_tool_called,
  trace_span_count, trace_error_spans, trace_duration (the spans the agent sent of its
  turn, received over OTLP). `groups`: not, any, all (assertions made of assertions).
  `golden`: the conversation compared with its golden conversation (exact, tools, or a
  judge on the replies); `golden_conversations`: the golden file's model, its name and
  folder, and the turn-by-turn comparison (which the reports show too).

`Assertion` is what the case model validates assertions against: the discriminated
union of the registered spec models, so an unknown `type` or a misspelt field is a
load-time error naming the field. A new type is one family module (its spec model and
its `@register(Spec)` checker) and its import below.
"""

from agenttest_worker.assertions.checking import (
    Assertion,
    AssertionContext,
    AssertionOutcome,
    AssertionSpec,
    RoleCaller,
    assertion_types,
    evaluate,
    on_change,
    register,
)

# isort: off
# Imported in the order messages list the types ("known: contains, equals, ..."): that
# is the order they register in.
from agenttest_worker.assertions.text import (
    ContainsAssertion,
    EqualsAssertion,
    NotContainsAssertion,
    NotRegexAssertion,
    RegexAssertion,
)
from agenttest_worker.assertions.structure import TYPE_ALIASES, JsonPathAssertion, TypeAssertion
from agenttest_worker.assertions.tools import ToolCalledAssertion, ToolNotCalledAssertion
from agenttest_worker.assertions.agent import AgentAssertion
from agenttest_worker.assertions.scripted import ScriptAssertion
from agenttest_worker.assertions.latency import LatencyAssertion, TimedContext
from agenttest_worker.assertions.trajectory import (
    ToolCountAssertion,
    ToolSequenceAssertion,
    TurnCountAssertion,
)
from agenttest_worker.assertions.traces import (
    TraceDurationAssertion,
    TraceErrorSpansAssertion,
    TraceSpanCountAssertion,
    TraceToolCalledAssertion,
)
from agenttest_worker.assertions.groups import AllAssertion, AnyAssertion, NotAssertion
from agenttest_worker.assertions.golden import GoldenAssertion
from agenttest_worker.assertions.golden_conversations import (
    GoldenConversation,
    GoldenMatch,
    conversation_of,
    golden_folder,
    golden_name,
    golden_path,
)

# isort: on

# The types of this package; `assertion_types()` also lists any registered later.
ASSERTION_TYPES = assertion_types()

__all__ = [
    "ASSERTION_TYPES",
    "TYPE_ALIASES",
    "AgentAssertion",
    "AllAssertion",
    "AnyAssertion",
    "Assertion",
    "AssertionContext",
    "AssertionOutcome",
    "AssertionSpec",
    "ContainsAssertion",
    "EqualsAssertion",
    "GoldenAssertion",
    "GoldenConversation",
    "GoldenMatch",
    "JsonPathAssertion",
    "LatencyAssertion",
    "NotAssertion",
    "NotContainsAssertion",
    "NotRegexAssertion",
    "RegexAssertion",
    "RoleCaller",
    "ScriptAssertion",
    "TimedContext",
    "ToolCalledAssertion",
    "ToolCountAssertion",
    "ToolNotCalledAssertion",
    "ToolSequenceAssertion",
    "TraceDurationAssertion",
    "TraceErrorSpansAssertion",
    "TraceSpanCountAssertion",
    "TraceToolCalledAssertion",
    "TurnCountAssertion",
    "TypeAssertion",
    "assertion_types",
    "conversation_of",
    "evaluate",
    "golden_folder",
    "golden_name",
    "golden_path",
    "on_change",
    "register",
]
