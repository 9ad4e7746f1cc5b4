"""Deterministic demo agents served over HTTP with the OpenAI Chat Completions protocol.

No LLM, no randomness, no clock: the same request always gets the same answer, which is
what the README quickstart and the project's tests rely on. One module per model, each a
pure function `respond(request_body) -> response_body`; its docstring is the reference for
that model's behaviour:

- `expense`   (`expense.py`): scripted expense reimbursement assistant with a client-side
  `create_expense` tool (the spec's T001–T003 target).
- `user-sim`  (`simulator.py`): user simulator, replies `{input, goal_achieved, reasoning}`.
- `validator` (`validator.py`): judge checking quoted phrases of the criteria, replies
  `{passed, score, reason, suggestions}` inside a code fence.
- `generator` (`generator.py`): test case generator, replies `{cases: [...]}`.
- `echo`      (`echo.py`): replies with what it was sent (messages, metadata, tools).

`demo_server.py` serves them (`create_app`, `DemoServer`), on a thread of its own through
`threaded.py` (which the test agents in tests/ use too); `SUITE` is the bundled suite's
folder. The `agenttest-demo` command is agenttest_submit's (commands/demo_command.py).
"""

from pathlib import Path

from agenttest_worker.demo.demo_server import DemoServer, start_site

SUITE = Path(__file__).parent / "suite"

__all__ = ["SUITE", "DemoServer", "start_site"]
