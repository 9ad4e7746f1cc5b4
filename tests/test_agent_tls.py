"""TLS per agent (`tls:` in agenttest.yaml) and the process-wide CA variables, against
real https agents signed by a certificate authority made for the test (pki_kit.py).

An agent the default trust does not know fails, saying how to trust it; `tls.ca_file`
trusts it (in place of the default trust, as curl's --cacert); SSL_CERT_FILE and
REQUESTS_CA_BUNDLE trust it for the whole process (in agenttest-submit's own process,
SSL_CERT_FILE first); `verify: false` calls it unchecked and says so once; an agent that
asks for a client certificate gets one from `client_cert`/`client_key`; a file that
cannot be used is an input error with file, line and field before anything runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from agent_servers import run
from pki_kit import Pki, serving_agent

from agenttest_submit.cli import main
from agenttest_worker.agents.config_loading import config_from_data, load_config
from agenttest_worker.agents.interface import AgentError, AgentReply, AgentRequest
from agenttest_worker.agents.protocols.openai import OpenAIClient
from agenttest_worker.errors import ConfigError

TRUST_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE")
KEY = "sk-tls-test-key-never-shown"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.make(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A second authority, which signed nothing the agents show."""
    return Pki.make(tmp_path_factory.mktemp("other-pki"), "another test CA")


@pytest.fixture(autouse=True)
def _no_trust_variables(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The machine's own SSL_CERT_FILE & co. (set on some) are not the test's."""
    for name in TRUST_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TLS_TEST_KEY", KEY)
    yield


def write_config(folder: Path, agents: dict[str, dict[str, Any]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "agenttest.yaml"
    path.write_text(yaml.safe_dump({"agents": agents}, sort_keys=False), encoding="utf-8")
    return path


def agent(root: str, **extra: Any) -> dict[str, Any]:
    return {
        "base_url": root + "/v1",
        "model": "m",
        "api_key_env": "TLS_TEST_KEY",
        "max_retries": 0,
        "timeout": 10,
        **extra,
    }


async def say_hi(config_path: Path, name: str = "secure") -> AgentReply:
    project = load_config(config_path)
    client = OpenAIClient(name, project.agents[name], project)
    messages = [{"role": "user", "content": "Hi"}]
    return await client.complete(AgentRequest(role="target", messages=messages))


def call(pki: Pki, tmp_path: Path, tls: dict[str, Any] | None, **server: bool) -> AgentReply:
    """Agent `secure` (https, signed by `pki`) called once with `tls` as its entry's."""

    async def main() -> AgentReply:
        async with serving_agent(pki.server_context(**server)) as root:
            extra = {"tls": tls} if tls is not None else {}
            return await say_hi(write_config(tmp_path, {"secure": agent(root, **extra)}))

    return run(main())


def test_an_agent_signed_by_an_unknown_authority_fails_saying_how_to_trust_it(
    pki: Pki, tmp_path: Path
) -> None:
    with pytest.raises(AgentError) as caught:
        call(pki, tmp_path, None)
    message = caught.value.message
    assert caught.value.kind == "connection"
    assert "certificate verify failed" in message, message
    assert "tls.ca_file, SSL_CERT_FILE or REQUESTS_CA_BUNDLE" in message, message
    assert KEY not in message


def test_tls_ca_file_relative_to_the_config_trusts_the_agent(pki: Pki, tmp_path: Path) -> None:
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "private-ca.pem").write_bytes(pki.ca.read_bytes())
    reply = call(pki, tmp_path, {"ca_file": "certs/private-ca.pem"})
    assert reply.content == "hello"


def test_tls_ca_file_replaces_the_default_trust(
    pki: Pki, other_pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The process trusts the agent's CA, the agent's entry names another: the entry wins.
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))
    assert call(pki, tmp_path / "default", None).content == "hello"
    with pytest.raises(AgentError) as caught:
        call(pki, tmp_path / "own", {"ca_file": str(other_pki.ca)})
    assert "certificate verify failed" in caught.value.message


def test_verify_false_calls_the_agent_unchecked(pki: Pki, tmp_path: Path) -> None:
    assert call(pki, tmp_path, {"verify": False}).content == "hello"


def test_an_agent_asking_for_a_client_certificate_refuses_a_call_without_one(
    pki: Pki, tmp_path: Path
) -> None:
    with pytest.raises(AgentError) as caught:
        call(pki, tmp_path, {"ca_file": str(pki.ca)}, require_client=True)
    # (The agent ends the connection: with TLS 1.3 the client learns no more than that.)
    assert caught.value.kind == "connection", caught.value.message
    assert caught.value.call is not None and caught.value.call.status_code is None


@pytest.mark.parametrize("key_apart", [True, False], ids=["cert-and-key", "key-in-cert-file"])
def test_client_cert_and_key_are_shown_to_an_agent_that_asks(
    pki: Pki, tmp_path: Path, key_apart: bool
) -> None:
    tls: dict[str, Any] = {"ca_file": str(pki.ca)}
    if key_apart:
        tls |= {"client_cert": str(pki.client_cert), "client_key": str(pki.client_key)}
    else:
        tls |= {"client_cert": str(pki.client_both)}
    assert call(pki, tmp_path, tls, require_client=True).content == "hello"


# -- files that cannot be used: exit 2, with file, line and field ---------------------------


def problems_of(capsys: pytest.CaptureFixture[str], config: Path) -> tuple[int, str]:
    code = main(["-i", "Hi", "-n", "secure", "--config", str(config), "--dry-run"])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    return code, err


def test_a_missing_ca_file_is_an_input_error_with_file_line_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "agenttest.yaml"
    config.write_text(
        "agents:\n"
        "  secure:\n"
        "    base_url: https://127.0.0.1:9/v1\n"
        "    tls:\n"
        "      ca_file: certs/missing.pem\n",
        encoding="utf-8",
    )
    code, err = problems_of(capsys, config)
    assert code == 2, err
    missing = tmp_path / "certs" / "missing.pem"
    assert (
        f"{config}:5: agents.secure.tls.ca_file: cannot read {missing}: No such file or directory"
        in err
    ), err


def test_unusable_client_certificates_are_input_errors_naming_their_field(
    capsys: pytest.CaptureFixture[str], pki: Pki, other_pki: Pki, tmp_path: Path
) -> None:
    not_pem = tmp_path / "not-a-cert.pem"
    not_pem.write_text("not a certificate\n", encoding="utf-8")
    agents = {
        "secure": agent("https://127.0.0.1:9", tls={"ca_file": str(not_pem)}),
        "no-key": agent("https://127.0.0.1:9", tls={"client_cert": str(pki.client_cert)}),
        "wrong-key": agent(
            "https://127.0.0.1:9",
            tls={"client_cert": str(pki.client_cert), "client_key": str(other_pki.client_key)},
        ),
    }
    config = write_config(tmp_path, agents)
    code, err = problems_of(capsys, config)
    assert code == 2, err
    lines = config.read_text(encoding="utf-8").splitlines()

    def line_of(text: str, after: int = 0) -> int:
        return next(i for i, line in enumerate(lines, 1) if i > after and text in line)

    expected = [
        f"{config}:{line_of('ca_file:')}: agents.secure.tls.ca_file: "
        f"{not_pem} holds no PEM certificate",
        f"{config}:{line_of('client_cert:')}: agents.no-key.tls.client_cert: "
        f"{pki.client_cert} holds no PEM private key (give client_key)",
        f"{config}:{line_of('client_key:')}: agents.wrong-key.tls.client_key: "
        f"{other_pki.client_key}: the private key does not match the certificate",
    ]
    for problem in expected:
        assert problem in err, (problem, err)


def test_a_client_key_without_its_certificate_is_an_input_error(
    capsys: pytest.CaptureFixture[str], pki: Pki, tmp_path: Path
) -> None:
    config = tmp_path / "agenttest.yaml"
    config.write_text(
        "agents:\n"
        "  secure:\n"
        "    base_url: https://127.0.0.1:9/v1\n"
        "    tls:\n"
        f"      client_key: {pki.client_key}\n",
        encoding="utf-8",
    )
    code, err = problems_of(capsys, config)
    assert code == 2, err
    assert f"{config}:4: agents.secure.tls: client_key needs client_cert" in err, err


# -- the process's own trust, in agenttest-submit's process ----------------------------------


def submit_env(tmp_path: Path, **variables: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in TRUST_VARIABLES and not k.startswith("AGENTTEST_")
    }
    return {**env, "AGENTTEST_HOME": str(tmp_path / "home"), **variables}


async def submit(
    tmp_path: Path, config: Path, env: dict[str, str], *args: str
) -> tuple[int, str, list[dict[str, Any]]]:
    """agenttest-submit, embedded, saying "Hi" to agent `secure`: its exit code, stderr
    and JSONL records."""
    out = tmp_path / "out.jsonl"
    out.unlink(missing_ok=True)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agenttest_submit.cli",
        "-i", "Hi", "-n", "secure", "--config", str(config), "-o", str(out), *args,
        env=env, cwd=tmp_path, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(process.communicate(), 120)
    text = err.decode()
    assert "Traceback" not in text, text
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    assert process.returncode is not None
    return process.returncode, text, records


def statuses(records: list[dict[str, Any]]) -> list[str]:
    return [record["status"] for record in records]


def test_ssl_cert_file_and_requests_ca_bundle_trust_agents_process_wide(
    pki: Pki, other_pki: Pki, tmp_path: Path
) -> None:
    async def main() -> None:
        async with serving_agent(pki.server_context()) as root:
            config = write_config(tmp_path, {"secure": agent(root)})
            ca, other = str(pki.ca), str(other_pki.ca)
            runs = {
                "nothing": submit_env(tmp_path),
                "SSL_CERT_FILE": submit_env(tmp_path, SSL_CERT_FILE=ca),
                "REQUESTS_CA_BUNDLE": submit_env(tmp_path, REQUESTS_CA_BUNDLE=ca),
                # SSL_CERT_FILE comes first: the bundle is not read when it is set.
                "both": submit_env(tmp_path, SSL_CERT_FILE=other, REQUESTS_CA_BUNDLE=ca),
            }
            outcomes = {}
            for label, env in runs.items():
                code, err, records = await submit(tmp_path, config, env)
                outcomes[label] = (code, statuses(records))
                if label in ("nothing", "both"):
                    assert "certificate verify failed" in err or any(
                        "certificate verify failed" in json.dumps(r) for r in records
                    ), err
            assert outcomes == {
                "nothing": (1, ["failed"]),
                "SSL_CERT_FILE": (0, ["passed"]),
                "REQUESTS_CA_BUNDLE": (0, ["passed"]),
                "both": (1, ["failed"]),
            }

    run(main())


def test_verify_false_warns_once_per_run_naming_the_agent(pki: Pki, tmp_path: Path) -> None:
    async def main() -> None:
        async with serving_agent(pki.server_context()) as root:
            config = write_config(tmp_path, {"secure": agent(root, tls={"verify": False})})
            code, err, records = await submit(
                tmp_path, config, submit_env(tmp_path), "--repeat", "3"
            )
            assert code == 0, err
            assert statuses(records) == ["passed"] * 3
            warnings = [line for line in err.splitlines() if "not checked" in line]
            assert warnings == [
                "warning: agent secure: TLS certificates are not checked (tls.verify: false)"
            ], err
            assert KEY not in err

    run(main())


def test_a_trust_variable_naming_no_readable_file_is_an_input_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path, {"secure": agent("https://127.0.0.1:9")})
    missing = tmp_path / "no-such-bundle.pem"
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(missing))
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert [str(p) for p in caught.value.problems] == [
        f"REQUESTS_CA_BUNDLE: {missing} is not a file that can be read"
    ]
    # SSL_CERT_FILE comes first: the bundle is then not read, nor checked.
    monkeypatch.setenv("SSL_CERT_FILE", str(missing))
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert [p.field for p in caught.value.problems] == ["SSL_CERT_FILE"]


def test_a_tls_file_gone_where_a_stored_run_plays_fails_its_calls_saying_which(
    pki: Pki, tmp_path: Path
) -> None:
    """A run's config rebuilt from the store is not checked for files (they were, when it
    was submitted): a worker without the file fails the agent's calls, at once."""
    gone = tmp_path / "gone-ca.pem"
    entry = agent("https://127.0.0.1:9", tls={"ca_file": str(gone)}, max_retries=3)
    project = config_from_data({"agents": {"secure": entry}}, str(tmp_path / "agenttest.yaml"))
    client = OpenAIClient("secure", project.agents["secure"], project)
    request = AgentRequest(role="target", messages=[{"role": "user", "content": "Hi"}])
    with pytest.raises(AgentError) as caught:
        run(client.complete(request))
    assert caught.value.kind == "config"
    assert caught.value.message == (
        f"agent error: secure: tls.ca_file: cannot read {gone}: No such file or directory"
    )
