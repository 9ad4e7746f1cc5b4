"""A strict stand-in for Azure OpenAI's Chat Completions.

Written from Azure OpenAI's data-plane reference: POST
`/openai/deployments/{deployment}/chat/completions?api-version=YYYY-MM-DD[-preview]`,
authenticated by an `api-key` header or a Microsoft Entra ID token as `Authorization:
Bearer`. The body is the Chat Completions body (checked as tests/standins/chat_request.py
checks it, `model` optional since the deployment names the model); Azure refuses an
unknown field as OpenAI does ("Unrecognized request argument supplied: x").

Fields come with API versions: `stream_options` is in the reference from 2024-09-01
(2024-09-01-preview, and 2024-10-21 of the stable ones); an earlier version refuses it
as an unknown field.

What Azure answers otherwise, in its own error shape `{"error": {"code", "message"}}`:
any other path, a missing or malformed api-version: 404 "Resource not found"; an
unknown deployment: 404 `DeploymentNotFound`; no key or a wrong one: 401.
"""

from __future__ import annotations

import json
import re

from aiohttp import web

from standins.chat_request import openai_error
from standins.openai_chat import OpenAIChatStandIn
from standins.scripting import Received, Refusal

API_VERSION = re.compile(r"\d{4}-\d{2}-\d{2}(-preview)?")
ROUTE = re.compile(r"/openai/deployments/([^/]+)/chat/completions")


def azure_error(status: int, code: str, message: str) -> Refusal:
    return Refusal(status, {"error": {"code": code, "message": message}})


NOT_FOUND = azure_error(404, "404", "Resource not found")
# The first API version whose reference has `stream_options` (the dates compare as text).
STREAM_OPTIONS_SINCE = "2024-09-01"


def _fields(raw: bytes) -> list[str]:
    try:
        body = json.loads(raw)
    except ValueError:
        return []
    return list(body) if isinstance(body, dict) else []


class AzureOpenAIStandIn(OpenAIChatStandIn):
    """Deployments by name (each answers from the script of the same name). `api_key`:
    the `api-key` the resource accepts; `ad_token`: the Entra ID bearer token it accepts."""

    name = "azure-openai-standin"
    path = ""

    def __init__(
        self, deployments: list[str], api_key: str | None = None, ad_token: str | None = None
    ) -> None:
        super().__init__()
        self.deployments = list(deployments)
        self.azure_key = api_key
        self.ad_token = ad_token

    def model_of(self, received: Received) -> str | None:
        match = ROUTE.fullmatch(received.path)
        return match.group(1) if match else None

    def check_auth(self, received: Received) -> None:
        key = received.headers.get("api-key")
        bearer = received.headers.get("Authorization", "")
        if key is not None and key == self.azure_key:
            return
        if bearer.startswith("Bearer ") and bearer.removeprefix("Bearer ") == self.ad_token:
            return
        if key is None and not bearer:
            raise azure_error(
                401,
                "401",
                "Access denied due to missing subscription key. Make sure to include "
                "subscription key when making requests to an API.",
            )
        raise azure_error(
            401,
            "401",
            "Access denied due to invalid subscription key or wrong API endpoint. Make sure "
            "to provide a valid key for an active subscription and use a correct regional "
            "API endpoint for your resource.",
        )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        received, raw = await self.record(request)
        try:
            match = ROUTE.fullmatch(request.path)
            version = request.query.get("api-version")
            if request.method != "POST" or match is None:
                raise NOT_FOUND
            if version is None or not API_VERSION.fullmatch(version):
                raise NOT_FOUND
            self.check_auth(received)
            deployment = match.group(1)
            if deployment not in self.deployments:
                raise azure_error(
                    404,
                    "DeploymentNotFound",
                    "The API deployment for this resource does not exist. If you created the "
                    "deployment within the last 5 minutes, please wait a moment and try again.",
                )
            if version < STREAM_OPTIONS_SINCE and "stream_options" in _fields(raw):
                raise openai_error("Unrecognized request argument supplied: stream_options")
            return await self.complete(request, raw, model_required=False, model=deployment)
        except Refusal as refusal:
            return self.refused(received, refusal)
