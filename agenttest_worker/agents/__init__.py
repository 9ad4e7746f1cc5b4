"""Agents: the registry (agenttest.yaml), the protocols (openai, http, script), retries."""

from agenttest_worker.agents.base import AgentError, AgentReply, AgentRequest
from agenttest_worker.agents.config import AgentConfig, ProjectConfig, load_config
from agenttest_worker.agents.pool import AgentPool, RoleSession

__all__ = [
    "AgentConfig",
    "AgentError",
    "AgentPool",
    "AgentReply",
    "AgentRequest",
    "ProjectConfig",
    "RoleSession",
    "load_config",
]
