"""The `azure` protocol: Chat Completions on an Azure OpenAI deployment.

Posts to `{base_url}/openai/deployments/{deployment}/chat/completions?api-version=
{api_version}` (`base_url` is the resource's endpoint, https://NAME.openai.azure.com).
The key goes in the `api-key` header, from `api_key_env`; or, with `azure_ad_token_env`,
a Microsoft Entra ID token goes as `Authorization: Bearer`. An `openai` entry that sets
both `deployment` and `api_version` is an azure one (agents/config.py). The body and the
replies, whole or streamed, are the openai protocol's (`model` is the entry's `model`,
else the deployment; Azure routes by the deployment), but for `stream_options`, which
API versions before 2024-09-01 refuse: streamed replies come without usage there.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote, urlencode

from agenttest_worker.agents.config import AgentConfig
from agenttest_worker.agents.interface import AgentRequest, protocol
from agenttest_worker.agents.protocols.openai import OpenAIClient, streams_whole


def needs_endpoint(config: AgentConfig) -> str | None:
    if not config.base_url:
        return (
            "an azure agent needs base_url, the resource's endpoint (https://NAME.openai.azure.com)"
        )
    if config.api_key_env and config.azure_ad_token_env:
        return "an azure agent authenticates with api_key_env or azure_ad_token_env, not both"
    return streams_whole(config, "an azure")


# The first API version that takes `stream_options` (2024-09-01-preview; of the stable
# ones 2024-10-21). Versions are dates: they compare as text.
STREAM_OPTIONS_SINCE = "2024-09-01"


@protocol("azure", check=needs_endpoint, needs=("deployment", "api_version"))
class AzureOpenAIClient(OpenAIClient):
    def endpoint(self) -> str:
        assert self.config.base_url is not None and self.config.deployment is not None
        deployment = quote(self.config.deployment, safe="")
        query = urlencode({"api-version": self.config.api_version})
        base = self.config.base_url.rstrip("/")
        return f"{base}/openai/deployments/{deployment}/chat/completions?{query}"

    def ad_token(self) -> str | None:
        """The Entra ID token from the environment at call time (never stored or logged)."""
        variable = self.config.azure_ad_token_env
        return (os.environ.get(variable) or None) if variable else None

    def headers(self) -> dict[str, str]:
        headers = dict(self.config.headers)
        key, token = self.config.api_key(), self.ad_token()
        if key:
            headers["api-key"] = key
        elif token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def hidden(self) -> list[str]:
        token = self.ad_token()
        return [*super().hidden(), token] if token else super().hidden()

    def body(self, request: AgentRequest) -> dict[str, Any]:
        body = super().body(request)
        body["model"] = self.config.model or self.config.deployment
        if str(self.config.api_version) < STREAM_OPTIONS_SINCE:
            # Earlier API versions refuse the field: their streams carry no usage.
            body.pop("stream_options", None)
        return body
