"""Proxies for agent calls: HTTPS_PROXY, HTTP_PROXY, ALL_PROXY and NO_PROXY read as curl
reads them (NO_PROXY's host suffixes, IP addresses and CIDR ranges, with ports), and an
agent's own `proxy:`, through a real forward proxy that keeps what passes
(forward_proxy.py): plain http as absolute-URI requests, https tunnelled with CONNECT.
A proxy's `user:password@` becomes Proxy-Authorization and is shown nowhere: not on the
terminal, not in the JSONL report, not in the store.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from agent_servers import refused_url, run
from aiohttp import web
from forward_proxy import ForwardProxy
from pki_kit import Pki, serving_agent

from agenttest_worker.agents.config_loading import load_config
from agenttest_worker.agents.http.proxies import (
    ProxyProblem,
    environment_problems,
    environment_proxies,
    parse_no_proxy,
    proxy_url,
)
from agenttest_worker.agents.interface import AgentError, AgentReply, AgentRequest
from agenttest_worker.agents.protocols.openai import OpenAIClient
from agenttest_worker.errors import ConfigError

PROXY_VARIABLES = (
    *("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"),
    *("no_proxy", "NO_PROXY"),
)
USER, PASSWORD = "proxy-user", "proxy-pw-never-shown"
WRONG_PASSWORD = "wrong-proxy-pw-never-shown"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.make(tmp_path_factory.mktemp("pki"))


@pytest.fixture(autouse=True)
def _no_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    yield


# -- NO_PROXY and the proxy variables, as read ---------------------------------------------


@pytest.mark.parametrize(
    ("no_proxy", "host", "port", "direct"),
    [
        ("*", "anything.example", 443, True),
        ("example.com", "example.com", 443, True),
        ("example.com", "api.example.com", 443, True),
        (".example.com", "example.com", 80, True),
        (".example.com", "deep.api.example.com", 80, True),
        ("example.com", "badexample.com", 443, False),
        ("EXAMPLE.com.", "Api.Example.COM", 443, True),
        ("example.com:8443", "api.example.com", 8443, True),
        ("example.com:8443", "api.example.com", 443, False),
        ("10.1.2.3", "10.1.2.3", 80, True),
        ("10.1.2.3", "10.1.2.4", 80, False),
        ("10.0.0.0/8", "10.200.3.4", 80, True),
        ("10.0.0.0/8", "11.0.0.1", 80, False),
        ("10.0.0.0/8", "ten.example", 80, False),  # names are not resolved
        ("127.0.0.0/8:9000", "127.0.0.1", 9000, True),
        ("127.0.0.0/8:9000", "127.0.0.1", 9001, False),
        ("::1", "::1", 80, True),
        ("[::1]:8080", "::1", 8080, True),
        ("[::1]:8080", "::1", 8081, False),
        ("fd00::/8", "fd12:3456::1", 443, True),
        ("fd00::/8", "fe80::1", 443, False),
        ("fd00::/8", "10.0.0.1", 443, False),
        (" example.org , 192.168.0.0/16 ", "192.168.7.7", 80, True),
        ("10.0.0.0/33, bad:port, [::1", "10.0.0.1", 80, False),  # unreadable: ignored
        ("", "example.com", 443, False),
    ],
)
def test_no_proxy_entries(no_proxy: str, host: str, port: int, direct: bool) -> None:
    assert parse_no_proxy(no_proxy).matches(host, port) is direct


def test_proxy_variables_lower_case_first_then_upper_then_all_proxy() -> None:
    from yarl import URL

    def chosen(env: dict[str, str]) -> tuple[str | None, str | None]:
        proxies = environment_proxies(env)
        return (
            proxies.for_url(URL("https://agent.example/v1")),
            proxies.for_url(URL("http://agent.example/v1")),
        )

    assert chosen({}) == (None, None)
    assert chosen({"HTTPS_PROXY": "http://a:1"}) == ("http://a:1", None)
    assert chosen({"https_proxy": "http://a:1", "HTTPS_PROXY": "http://b:2"})[0] == "http://a:1"
    assert chosen({"https_proxy": "", "HTTPS_PROXY": "http://b:2"})[0] == "http://b:2"
    assert chosen({"HTTP_PROXY": "http://c:3"}) == (None, "http://c:3")
    assert chosen({"ALL_PROXY": "http://d:4"}) == ("http://d:4", "http://d:4")
    assert chosen({"all_proxy": "http://d:4", "HTTP_PROXY": "http://c:3"}) == (
        "http://d:4",
        "http://c:3",
    )
    assert chosen({"ALL_PROXY": "http://d:4", "NO_PROXY": "agent.example"}) == (None, None)
    assert chosen({"ALL_PROXY": "http://d:4", "no_proxy": "*", "NO_PROXY": ""}) == (None, None)


def test_proxy_urls_as_curl_takes_them() -> None:
    assert proxy_url("proxy.corp:3128") == "http://proxy.corp:3128"
    assert proxy_url("http://proxy.corp") == "http://proxy.corp:1080"
    assert proxy_url(" http://u:p@proxy.corp:8080/ ") == "http://u:p@proxy.corp:8080/"
    for unusable, why in [
        ("socks5://u:secret-pw@proxy:1080", "socks5:// proxy is not supported"),
        ("http:///", "needs a host"),
        ("http://proxy:0", "port"),
        ("http://proxy:99999", "not a proxy URL that can be read"),
    ]:
        with pytest.raises(ProxyProblem) as caught:
            proxy_url(unusable)
        assert why in str(caught.value)
        assert "secret-pw" not in str(caught.value)
    assert environment_problems({"HTTPS_PROXY": "socks5://proxy:1080"}) == [
        ("HTTPS_PROXY", "a socks5:// proxy is not supported: give an http:// proxy "
         "(https URLs go through it with CONNECT)"),
    ]  # fmt: skip


def test_the_forward_proxy_is_a_proxy_to_an_independent_client(pki: Pki) -> None:
    """httpx through it, plain and tunnelled: what the tests below count is real proxying."""

    async def main() -> None:
        async with (
            ForwardProxy() as proxy,
            serving_agent(None) as plain,
            serving_agent(pki.server_context()) as secure,
        ):
            trust = ssl.create_default_context(cafile=pki.ca)
            async with httpx.AsyncClient(proxy=proxy.url, verify=trust) as client:
                for root in (plain, secure):
                    response = await client.post(root + "/v1/chat/completions", json={})
                    assert response.json()["choices"][0]["message"]["content"] == "hello"
            port = secure.rsplit(":", 1)[1]
            assert proxy.targets() == [
                f"POST {plain}/v1/chat/completions",
                f"CONNECT 127.0.0.1:{port}",
            ]

    run(main())


# -- agent calls through the environment's proxies --------------------------------------------


def write_config(folder: Path, agents: dict[str, dict[str, Any]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "agenttest.yaml"
    path.write_text(yaml.safe_dump({"agents": agents}, sort_keys=False), encoding="utf-8")
    return path


def agent(root: str, **extra: Any) -> dict[str, Any]:
    return {"base_url": root + "/v1", "model": "m", "max_retries": 0, "timeout": 10, **extra}


async def say_hi(config: Path, name: str) -> AgentReply:
    project = load_config(config)
    client = OpenAIClient(name, project.agents[name], project)
    messages = [{"role": "user", "content": "Hi"}]
    return await client.complete(AgentRequest(role="target", messages=messages))


@pytest.mark.parametrize(
    ("variable", "scheme", "proxied"),
    [
        ("HTTP_PROXY", "http", True),
        ("http_proxy", "http", True),
        ("HTTPS_PROXY", "https", True),
        ("ALL_PROXY", "http", True),
        ("ALL_PROXY", "https", True),
        ("HTTPS_PROXY", "http", False),  # each scheme its own variable
        ("HTTP_PROXY", "https", False),
    ],
)
def test_the_environment_s_proxy_carries_the_calls_of_its_scheme(
    pki: Pki,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    scheme: str,
    proxied: bool,
) -> None:
    async def main() -> None:
        context = pki.server_context() if scheme == "https" else None
        async with ForwardProxy() as proxy, serving_agent(context) as root:
            monkeypatch.setenv(variable, proxy.url)
            config = write_config(tmp_path, {"a": agent(root, tls={"ca_file": str(pki.ca)})})
            assert (await say_hi(config, "a")).content == "hello"
            port = root.rsplit(":", 1)[1]
            through = (
                f"CONNECT 127.0.0.1:{port}"
                if scheme == "https"
                else f"POST {root}/v1/chat/completions"
            )
            assert proxy.targets() == ([through] if proxied else [])

    run(main())


@pytest.mark.parametrize(
    ("no_proxy", "host", "direct"),
    [
        (".localhost", "localhost", True),  # a host suffix
        ("example.com,localhost", "localhost", True),
        ("127.0.0.1", "127.0.0.1", True),  # an exact address
        ("127.0.0.0/8", "127.0.0.1", True),  # a CIDR range
        ("127.0.0.1:{port}", "127.0.0.1", True),  # on the agent's port
        ("127.0.0.1:{other}", "127.0.0.1", False),  # on another port
        ("10.0.0.0/8", "127.0.0.1", False),
        ("127.0.0.0/8", "localhost", False),  # a name is not resolved to match a range
    ],
)
def test_no_proxy_sends_its_hosts_direct(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_proxy: str, host: str, direct: bool
) -> None:
    async def main() -> None:
        async with ForwardProxy() as proxy, serving_agent(None) as root:
            port = int(root.rsplit(":", 1)[1])
            monkeypatch.setenv("HTTP_PROXY", proxy.url)
            monkeypatch.setenv("NO_PROXY", no_proxy.format(port=port, other=port + 1))
            url = f"http://{host}:{port}"
            config = write_config(tmp_path, {"a": agent(url)})
            assert (await say_hi(config, "a")).content == "hello"
            assert proxy.targets() == ([] if direct else [f"POST {url}/v1/chat/completions"])

    run(main())


def test_an_agent_s_proxy_overrides_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        async with ForwardProxy() as proxy, serving_agent(None) as root:
            # The environment's proxy is dead, and would send 127.0.0.1 direct anyway.
            monkeypatch.setenv("HTTP_PROXY", refused_url())
            monkeypatch.setenv("NO_PROXY", "127.0.0.1")
            agents = {
                "own": agent(root, proxy=proxy.url),
                "direct": agent(root, proxy="none"),
                "empty": agent(root, proxy=""),
                "from-env": agent(root.replace("127.0.0.1", "localhost")),
            }
            config = write_config(tmp_path, agents)
            for name in ("own", "direct", "empty"):
                assert (await say_hi(config, name)).content == "hello", name
            assert proxy.targets() == [f"POST {root}/v1/chat/completions"]
            with pytest.raises(AgentError) as caught:
                await say_hi(config, "from-env")  # localhost: not in NO_PROXY
            assert caught.value.kind == "connection"
            dead = refused_url().rsplit(":", 1)[0]
            assert f"cannot reach from-env (cannot connect to proxy {dead.split('//')[1]}:" in (
                caught.value.message
            ), caught.value.message

    run(main())


def test_a_proxy_variable_that_names_no_usable_proxy_is_an_input_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path, {"a": agent("http://127.0.0.1:9")})
    monkeypatch.setenv("ALL_PROXY", f"socks5://{USER}:{PASSWORD}@127.0.0.1:1080")
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert [str(p) for p in caught.value.problems] == [
        "ALL_PROXY: a socks5:// proxy is not supported: give an http:// proxy "
        "(https URLs go through it with CONNECT)"
    ]
    # An agent with a proxy of its own does not read the variables.
    load_config(write_config(tmp_path, {"a": agent("http://127.0.0.1:9", proxy="none")}))
    bad = write_config(tmp_path, {"a": agent("http://127.0.0.1:9", proxy="ftp://p:21")})
    with pytest.raises(ConfigError) as caught:
        load_config(bad)
    assert [p.field for p in caught.value.problems] == ["agents.a.proxy"]


# -- proxy credentials: Proxy-Authorization, and shown nowhere ---------------------------------


def secrets_of(text: str) -> list[str]:
    """The proxy passwords in `text`, as written or as Basic credentials."""
    forms = {
        secret: [secret, base64.b64encode(f"{USER}:{secret}".encode()).decode()]
        for secret in (PASSWORD, WRONG_PASSWORD)
    }
    return [secret for secret, written in forms.items() if any(w in text for w in written)]


async def submit(tmp_path: Path, config: Path, target: str, env: dict[str, str]) -> str:
    """agenttest-submit, embedded and verbose, saying "Hi" to `target`: its stdout,
    stderr and JSONL report, as one text."""
    out = tmp_path / f"{target}.jsonl"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agenttest_submit.cli",
        "-i", "Hi", "-n", target, "--config", str(config), "-o", str(out), "-v",
        env=env, cwd=tmp_path, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(process.communicate(), 120)
    report = out.read_text(encoding="utf-8")
    [record] = [json.loads(line) for line in report.splitlines()]
    assert "Traceback" not in stderr.decode(), stderr.decode()
    return "\n".join([stdout.decode(), stderr.decode(), report, json.dumps(record["status"])])


def test_proxy_credentials_become_proxy_authorization_and_are_shown_nowhere(
    pki: Pki, tmp_path: Path
) -> None:
    async def main() -> None:
        async with (
            ForwardProxy(credentials=(USER, PASSWORD)) as proxy,
            serving_agent(None) as plain,
            serving_agent(pki.server_context()) as secure,
        ):
            agents = {
                # https through the environment's proxy: CONNECT carries the credentials.
                "secure": agent(secure, tls={"ca_file": str(pki.ca)}),
                # Its own proxy, with a password from the environment that the proxy refuses.
                "refused": agent(
                    plain, proxy=f"http://{USER}:${{WRONG_PW}}@127.0.0.1:{proxy.port}"
                ),
                "refused-tunnel": agent(
                    secure,
                    tls={"ca_file": str(pki.ca)},
                    proxy=f"http://{USER}:${{WRONG_PW}}@127.0.0.1:{proxy.port}",
                ),
            }
            config = write_config(tmp_path, agents)
            home = tmp_path / "home"
            env = {
                **{k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")},
                "AGENTTEST_HOME": str(home),
                "HTTPS_PROXY": proxy.url_with(USER, PASSWORD),
                "WRONG_PW": WRONG_PASSWORD,
            }
            shown = {name: await submit(tmp_path, config, name, env) for name in agents}

            expected = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            port = secure.rsplit(":", 1)[1]
            assert [(p.target, p.allowed) for p in proxy.passed] == [
                (f"CONNECT 127.0.0.1:{port}", True),
                (f"POST {plain}/v1/chat/completions", False),
                (f"CONNECT 127.0.0.1:{port}", False),
            ]
            assert proxy.passed[0].proxy_authorization == f"Basic {expected}"
            assert '"passed"' in shown["secure"]
            assert "HTTP 407 from refused" in shown["refused"]
            assert (
                f"cannot reach refused-tunnel (proxy 127.0.0.1:{proxy.port} answered 407 "
                "Proxy Authentication Required)" in shown["refused-tunnel"]
            )
            for name, text in shown.items():
                assert secrets_of(text) == [], (name, text)
            stored = b"".join(p.read_bytes() for p in home.rglob("*") if p.is_file())
            assert secrets_of(stored.decode("latin-1")) == []

    run(main())


def test_each_redirect_chooses_its_proxy_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """127.0.0.1 is in NO_PROXY, localhost is not: the call goes direct, its redirect
    through the proxy."""

    async def main() -> None:
        async with ForwardProxy() as proxy, serving_agent(None) as final:
            moved = final.replace("127.0.0.1", "localhost") + "/v1/chat/completions"

            async def redirect(request: web.Request) -> web.StreamResponse:
                raise web.HTTPTemporaryRedirect(moved)

            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", redirect)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            first = f"http://127.0.0.1:{runner.addresses[0][1]}"
            try:
                monkeypatch.setenv("HTTP_PROXY", proxy.url)
                monkeypatch.setenv("NO_PROXY", "127.0.0.1")
                config = write_config(tmp_path, {"a": agent(first)})
                assert (await say_hi(config, "a")).content == "hello"
            finally:
                await runner.cleanup()
            assert proxy.targets() == [f"POST {moved}"]

    run(main())
