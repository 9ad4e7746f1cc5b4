"""Whether an agent's URL can be called, said for the user when it cannot."""

from __future__ import annotations

from urllib.parse import urlsplit

URL_EXAMPLE = "http://127.0.0.1:8700/v1"
# What a host may be made of (RFC 3986 reg-name, international names as written);
# a space, a quote or a bracket in it would only fail at call time.
_HOST_PUNCTUATION = frozenset("-._~%")


def url_problem(url: str) -> str | None:
    """What is wrong with an agent's URL, said for the user; None when it can be called.

    Checked when agenttest.yaml is loaded, so that a typo is an input error with its
    line, not a failed call retried for every case. The message never repeats the URL:
    it may hold a secret from the environment.
    """
    lead = "not a valid URL: "
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed [ of an IPv6 address
        return f"{lead}it does not parse (write e.g. {URL_EXAMPLE})"
    if parts.scheme.lower() not in ("http", "https"):
        return f"{lead}needs http:// or https:// (e.g. {URL_EXAMPLE})"
    host = parts.hostname
    if not host:
        return f"{lead}has no host (e.g. {URL_EXAMPLE})"
    if not parts.netloc.rpartition("@")[2].startswith("[") and not all(
        c.isalnum() or c in _HOST_PUNCTUATION for c in host
    ):
        return f"{lead}not a valid host name"
    try:
        port = parts.port
    except ValueError as exc:
        if "out of range" in str(exc):
            return f"{lead}the port is out of range (1-65535)"
        return f"{lead}not a valid port (a number, 1-65535)"
    if port == 0:
        return f"{lead}the port is out of range (1-65535)"
    return None
