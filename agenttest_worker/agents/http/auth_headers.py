"""One Authorization header per request: credentials in an agent's URL and another
Authorization header cannot both be sent.

Credentials in a URL (`user:password@`) become an Authorization header of their own
(HTTP Basic), and aiohttp refuses a request that would carry a second one ("Cannot
combine AUTHORIZATION header with AUTH argument or credentials encoded in URL"), so
every call of such an agent would fail. agenttest.yaml is checked for it when loaded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit


def has_userinfo(url: str) -> bool:
    """Whether `url` carries a user name or a password."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False  # not a URL: urls.url_problem says so
    return parts.username is not None or parts.password is not None


def authorization_clash(
    sent: Iterable[tuple[str | None, Mapping[str, str]]], bearer: bool
) -> str | None:
    """Why an agent's calls would all be refused: one of its (URL, headers) pairs has
    credentials in the URL and an Authorization header, or `bearer` (its `api_key_env`
    is sent as `Authorization: Bearer`); None when none does."""
    for url, headers in sent:
        if url is None or not has_userinfo(url):
            continue
        named = next((h for h in headers if h.lower() == "authorization"), None)
        if named or bearer:
            given = f"an {named} header" if named else "api_key_env (sent as Authorization)"
            return (
                f"its URL carries credentials (user:password@) and it has {given}: HTTP "
                "sends one Authorization header, so every call would be refused; keep one "
                "of them"
            )
    return None
