"""Model "echo": replies with what it was sent, for tests that check a request's content.

The reply content is `json.dumps({"messages": ..., "metadata": ..., "tools": ...},
sort_keys=True)` of the request's fields as received, each null when absent;
finish_reason is "stop".
"""

from __future__ import annotations

import json
from typing import Any

from agenttest_worker.demo._protocol import completion

MODEL = "echo"


def respond(request_body: dict[str, Any]) -> dict[str, Any]:
    """Echo the request's messages, metadata and tools as sorted JSON."""
    echoed = {key: request_body.get(key) for key in ("messages", "metadata", "tools")}
    return completion(MODEL, request_body, json.dumps(echoed, sort_keys=True))
