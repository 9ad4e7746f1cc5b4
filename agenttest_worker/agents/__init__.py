"""Agents: who is called, how, and what a call returns.

- `config`: agenttest.yaml's models: the project's named agents (the agent registry),
  its defaults and its scripts folder; `config_loading` reads the file (found, ${VAR}
  interpolated, every problem located), `reply_mappings` an http agent's JSONPaths,
  `stored_credentials` what a run keeps of literal credentials (nothing).
- `refs`: `agents:NAME` / `scripts:NAME` references; `options`: the spec's call options.
- `interface`: the extension point: AgentRequest, AgentReply, AgentError, the
  AgentClient protocol, and the registry of agent protocols (`@protocol("name")`).
- `protocols/`: one module per protocol (openai, azure, openai-responses, anthropic,
  http, script), each registering its client class; importing this package loads them.
- `pool`: one client per configured agent (`AgentPool`) and the role calls the engine
  makes (`RoleSession`: target, simulator, judge, script assertions, generator);
  `roles`: the helper roles' requests and how their replies are read.
- `http/`: calls over HTTP (aiohttp, TLS, proxies, streaming); `limits/`: rate limits,
  learned ones included, retries and the breaker; `secret_masking`: what an agent
  echoes of a secret, masked.
- `script_loader`: Python callables from the scripts folder, and only from there.
"""

from agenttest_worker.agents.config import DEFAULT_AWAITING_TOOLS, AgentConfig, ProjectConfig
from agenttest_worker.agents.config_loading import config_from_stored, find_config, load_config
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
    "config_from_stored",
    "configure_pool",
    "connections_for",
    "find_config",
    "load_config",
    "parse_ref",
    "protocol",
    "protocol_names",
    "warn_unverified_agents",
]
