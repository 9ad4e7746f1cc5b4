"""Which proxy an agent call goes through, chosen for each request (and each redirect).

The environment's proxies are read as curl reads them: `https_proxy`/`HTTPS_PROXY` for
https URLs, `http_proxy`/`HTTP_PROXY` for http ones, `all_proxy`/`ALL_PROXY` for either
when its own is unset (the lower-case name first, an empty value as unset), and
`no_proxy`/`NO_PROXY`, a comma-separated list of where to go direct: `*` (everywhere),
host names (`example.com` and `.example.com` both match the host and its subdomains),
IP addresses, CIDR ranges (`10.0.0.0/8`, `fd00::/8`), each with an optional `:port`
(`[::1]:8080` for an IPv6 address). Addresses and ranges match hosts written as IP
addresses; names are never resolved to match them. An agent's `proxy:` (a URL, or
`none` to go direct) overrides all of these for its calls.

aiohttp's own reading (`trust_env`) is not used: its NO_PROXY knows no ranges, and it
reads the variables through a thread on every request. A proxy URL's `user:password@`
is sent as Proxy-Authorization by aiohttp (which takes it from the URL it is given);
the URL itself is never shown (`proxy_secrets` names what errors must mask).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from yarl import URL

from agenttest_worker.errors import url_secrets

# Where each scheme's proxy is read from, in order; all_proxy comes after either's own.
SCHEME_VARIABLES = {
    "https": ("https_proxy", "HTTPS_PROXY"),
    "http": ("http_proxy", "HTTP_PROXY"),
}
ALL_VARIABLES = ("all_proxy", "ALL_PROXY")
NO_PROXY_VARIABLES = ("no_proxy", "NO_PROXY")
_ALL_NAMES = (*SCHEME_VARIABLES["https"], *SCHEME_VARIABLES["http"], *ALL_VARIABLES)
DEFAULT_PROXY_PORT = 1080
# An agent's `proxy:` that means "go direct" (also the empty string).
DIRECT = "none"

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class ProxyProblem(ValueError):
    """A proxy that cannot be used, in words that do not quote its URL."""


def proxy_url(text: str) -> str:
    """`text` as the proxy URL to use: `host:port` alone is an http proxy, and a proxy
    without a port is on 1080, as curl takes them. ProxyProblem if it is not an http://
    proxy with a host and a valid port."""
    text = text.strip()
    if "://" not in text:
        text = "http://" + text
    scheme = text.partition("://")[0].lower()
    if scheme != "http":
        raise ProxyProblem(
            f"a {scheme}:// proxy is not supported: give an http:// proxy "
            "(https URLs go through it with CONNECT)"
        )
    try:
        url = URL(text)
    except ValueError:
        raise ProxyProblem("not a proxy URL that can be read") from None
    if not url.host:
        raise ProxyProblem("a proxy URL needs a host")
    try:
        port = url.port
    except ValueError:
        port = None
    if port is None or not 0 < port < 65536:
        raise ProxyProblem("a proxy URL's port must be 1–65535")
    if url.explicit_port is None:
        # As curl: a proxy without a port is on 1080, not on its scheme's 80.
        return str(url.with_port(DEFAULT_PROXY_PORT))
    return text


def proxy_secrets(proxy: str, written: str | None = None) -> list[str]:
    """What no error may show of `proxy`: its password (or a user name alone)."""
    return url_secrets(proxy, written)


# -- NO_PROXY ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NoProxy:
    """Where to go direct: everywhere, or hosts by name suffix or by address range,
    each on one port or on any (None)."""

    everywhere: bool = False
    names: tuple[tuple[str, int | None], ...] = ()
    networks: tuple[tuple[IpNetwork, int | None], ...] = ()

    def matches(self, host: str, port: int | None) -> bool:
        if self.everywhere:
            return True
        host = host.strip("[]").rstrip(".").lower()
        for name, on_port in self.names:
            if (on_port is None or on_port == port) and (host == name or host.endswith("." + name)):
                return True
        if not self.networks:
            return False
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False  # a name: never resolved to be matched against ranges
        return any(
            (on_port is None or on_port == port)
            and address.version == network.version
            and address in network
            for network, on_port in self.networks
        )


def parse_no_proxy(text: str) -> NoProxy:
    """NO_PROXY's entries; one that cannot be read (`a:b:c:port`, `10.0.0.0/33`) matches
    nothing, as curl ignores it."""
    names: list[tuple[str, int | None]] = []
    networks: list[tuple[IpNetwork, int | None]] = []
    for raw in text.split(","):
        entry = raw.strip().lower()
        if entry == "*":
            return NoProxy(everywhere=True)
        host, port = _split_port(entry)
        if not host or port == -1:
            continue
        network = _network(host)
        if network is not None:
            networks.append((network, port))
        elif ":" not in host and "/" not in host:
            name = host.lstrip(".").rstrip(".")
            if name:
                names.append((name, port))
    return NoProxy(False, tuple(names), tuple(networks))


def _split_port(entry: str) -> tuple[str, int | None]:
    """(host, port or None); port -1 for a port that cannot be read."""
    if entry.startswith("["):
        host, bracket, rest = entry[1:].partition("]")
        if not bracket:
            return "", None
        if not rest:
            return host, None
        return host, _port(rest[1:]) if rest.startswith(":") else -1
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, _port(port)
    return entry, None  # a name, an IPv4 address, or an IPv6 address without a port


def _port(text: str) -> int:
    return int(text) if text.isdigit() and 0 < int(text) < 65536 else -1


def _network(host: str) -> IpNetwork | None:
    try:
        return ipaddress.ip_network(host, strict=False)
    except ValueError:
        return None


# -- the environment ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EnvironmentProxies:
    """The proxies the environment names for each scheme (absent: direct), and NO_PROXY.
    A variable that names no usable proxy is kept as a problem, said at each call it
    would serve (and before a run, by `environment_problems`)."""

    by_scheme: Mapping[str, str]
    problems: Mapping[str, str]
    no_proxy: NoProxy

    def for_url(self, url: URL) -> str | None:
        """The proxy for `url`, or None to go direct; ProxyProblem if the variable that
        names it cannot be used."""
        proxy = self.by_scheme.get(url.scheme)
        problem = self.problems.get(url.scheme)
        if proxy is None and problem is None:
            return None
        if url.host and self.no_proxy.matches(url.host, url.port):
            return None
        if problem is not None:
            raise ProxyProblem(problem)
        return proxy


def environment_proxies(env: Mapping[str, str] | None = None) -> EnvironmentProxies:
    """The environment's proxies as they are set now (parsed once per distinct value)."""
    environ = os.environ if env is None else env
    values = tuple(environ.get(name) or None for name in (*_ALL_NAMES, *NO_PROXY_VARIABLES))
    return _parsed(values)


def environment_problems(env: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """Each proxy variable in use that names no usable proxy: (variable, problem)."""
    environ = os.environ if env is None else env
    problems = []
    for scheme in SCHEME_VARIABLES:
        name, value = _first_set(environ, (*SCHEME_VARIABLES[scheme], *ALL_VARIABLES))
        if value is not None:
            try:
                proxy_url(value)
            except ProxyProblem as problem:
                problems.append((name, str(problem)))
    return list(dict.fromkeys(problems))


@lru_cache(maxsize=16)
def _parsed(values: tuple[str | None, ...]) -> EnvironmentProxies:
    environ = {
        name: value
        for name, value in zip((*_ALL_NAMES, *NO_PROXY_VARIABLES), values, strict=True)
        if value is not None
    }
    by_scheme: dict[str, str] = {}
    problems: dict[str, str] = {}
    for scheme, own in SCHEME_VARIABLES.items():
        name, value = _first_set(environ, (*own, *ALL_VARIABLES))
        if value is None:
            continue
        try:
            by_scheme[scheme] = proxy_url(value)
        except ProxyProblem as problem:
            problems[scheme] = f"{name}: {problem}"
    _, no_proxy = _first_set(environ, NO_PROXY_VARIABLES)
    return EnvironmentProxies(by_scheme, problems, parse_no_proxy(no_proxy or ""))


def _first_set(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str | None]:
    for name in names:
        value = environ.get(name)
        if value:
            return name, value
    return "", None


# -- an agent's choice ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProxyRoute:
    """How one agent's calls choose a proxy: its own `proxy:` when it has one (`fixed`,
    None to go direct), else the environment's, for each URL it calls."""

    from_environment: bool = True
    fixed: str | None = None

    def for_url(self, url: URL, environment: EnvironmentProxies) -> str | None:
        """The proxy for `url` (None: direct), given the environment's."""
        if self.from_environment:
            return environment.for_url(url)
        return self.fixed


FROM_ENVIRONMENT = ProxyRoute()


def proxy_route(setting: str | None) -> ProxyRoute:
    """An agent's `proxy:` (unset: None) as its route; checked when the file was loaded."""
    if setting is None:
        return FROM_ENVIRONMENT
    if setting.strip().lower() in ("", DIRECT):
        return ProxyRoute(from_environment=False)
    return ProxyRoute(from_environment=False, fixed=proxy_url(setting))


def setting_problem(setting: str | None) -> str | None:
    """What is wrong with an agent's `proxy:`, if anything (for agenttest.yaml's checks)."""
    try:
        proxy_route(setting)
    except ProxyProblem as problem:
        return str(problem)
    return None
