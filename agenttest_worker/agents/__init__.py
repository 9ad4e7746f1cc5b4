"""Agents: who is called, how, and what a call returns.

- `config`: agenttest.yaml, the project's named agents (the agent registry), its
  default judge and simulator and its scripts folder, with ${ENV} interpolation.
- `refs`: `agents:NAME` / `scripts:NAME` references; `options`: the spec's call options.
- `base`: the extension point: AgentRequest, AgentReply, AgentError, the AgentClient
  protocol, and the registry of agent protocols (`@protocol("name")`).
- `protocols/`: one module per protocol (openai, http, script), each registering its
  client class; importing this package loads them.
- `pool`: one client per configured agent (`AgentPool`) and the role calls the engine
  makes (`RoleSession`: target, simulator, judge, script assertions, generator).
- `roles`: the helper roles' requests and how their replies are read.
- `transport`, `retry`, `ratelimit`: HTTP calls with bounded bodies, backoff, and
  fleet-wide rate limits.
- `script_loader`: Python callables from the scripts folder, and only from there.
"""

from agenttest_worker.agents.config import (
    DEFAULT_AWAITING_TOOLS,
    AgentConfig,
    ProjectConfig,
    load_config,
)
from agenttest_worker.agents.http.exchange import close_session, configure_pool, connections_for
from agenttest_worker.agents.http.tls import warn_unverified_agents
from agenttest_worker.agents.interface import (
    AgentClient,
    AgentError,
    AgentReply,
    AgentRequest,
    protocol,
    protocol_names,
)
from agenttest_worker.agents.pool import AgentPool, RoleSession
from agenttest_worker.agents.protocols import HttpAgentClient, OpenAIClient, ScriptAgentClient
from agenttest_worker.agents.refs import Ref, parse_ref
from agenttest_worker.agents.reply_cache import CachePolicy, ReplyCacheStore

__all__ = [
    "DEFAULT_AWAITING_TOOLS",
    "AgentClient",
    "AgentConfig",
    "AgentError",
    "AgentPool",
    "AgentReply",
    "AgentRequest",
    "CachePolicy",
    "HttpAgentClient",
    "OpenAIClient",
    "ProjectConfig",
    "Ref",
    "ReplyCacheStore",
    "RoleSession",
    "ScriptAgentClient",
    "close_session",
    "configure_pool",
    "connections_for",
    "load_config",
    "parse_ref",
    "protocol",
    "protocol_names",
    "warn_unverified_agents",
]
