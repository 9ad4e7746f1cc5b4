"""The agent protocols, one module each, registered where they are defined.

- `openai`: Chat Completions at `{base_url}/chat/completions` with `model`.
- `azure`: Chat Completions on an Azure OpenAI deployment (the openai protocol's body
  and replies, Azure's URL and keys).
- `openai-responses`: the Responses API at `{base_url}/responses` (module
  `openai_responses`; replies read in `openai_responses_reply`).
- `anthropic`: the Messages API at `{base_url}/v1/messages` (replies read in
  `anthropic_reply`).
- `http`: any JSON endpoint at `url` (or `base_url`): a request template, reply paths.
- `script`: a Python function from the scripts folder (`use: scripts:NAME`).
- `json_client`: what openai, anthropic and http share (one JSON call, retried, rate
  limited, streamed when the agent says `stream:`).
- `chat_history`: reading an http agent's replies back from its chat history.

Each protocol module registers its client class with `@protocol("name", check=...)`
(agents/interface.py); importing this package registers them all. A new protocol is one
module here and its import below; `protocol:` in agenttest.yaml, the message for an
unknown one and the pool's clients follow from the registry.
"""

# isort: off
# Imported in the order messages list the protocols ('openai', 'azure', 'openai-responses',
# 'anthropic', 'http' or 'script'): that is the order they register in.
from agenttest_worker.agents.protocols.openai import OpenAIClient
from agenttest_worker.agents.protocols.azure import AzureOpenAIClient
from agenttest_worker.agents.protocols.openai_responses import OpenAIResponsesClient
from agenttest_worker.agents.protocols.anthropic import AnthropicClient
from agenttest_worker.agents.protocols.http import HttpAgentClient
from agenttest_worker.agents.protocols.python_script import ScriptAgentClient

# isort: on
from agenttest_worker.agents.protocols.json_client import JsonAgentClient

__all__ = [
    "AnthropicClient",
    "AzureOpenAIClient",
    "HttpAgentClient",
    "JsonAgentClient",
    "OpenAIClient",
    "OpenAIResponsesClient",
    "ScriptAgentClient",
]
