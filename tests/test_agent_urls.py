"""A malformed agent URL in agenttest.yaml (`base_url`, an http agent's `url`) is an input
error when the file is loaded: exit 2 with file, line and field, before any agent is
called, never retries at run time. Good URLs (and ${VAR}s that make one) still load."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agenttest_submit.cli.main import main
from agenttest_worker.agents.config_loading import load_config
from agenttest_worker.errors import ConfigError


def config_with(url_line: str, protocol: str = "openai") -> str:
    return (
        "agents:\n"
        "  target:\n"
        f"    protocol: {protocol}\n"
        f"{url_line}\n"
        "    model: m\n"
        "    max_retries: 3\n"
        "    base_delay: 1s\n"
    )


BAD_URLS = [
    ("ht!tp://[::1", "not a valid URL"),
    ("localhost:99999/v1", "needs http:// or https://"),
    ("127.0.0.1:8700/v1", "needs http:// or https://"),
    ("api.example.com/v1", "needs http:// or https://"),
    ("http://localhost:99999/v1", "the port is out of range (1-65535)"),
    ("http://localhost:0/v1", "the port is out of range (1-65535)"),
    ("ftp://example.com/v1", "needs http:// or https://"),
    ("http:///v1", "has no host"),
    ("http://exa mple.com/v1", "not a valid host"),
    ("http://[::1/v1", "not a valid URL"),
    ("http://localhost:80a/v1", "not a valid port"),
]


@pytest.mark.parametrize(("url", "message"), BAD_URLS)
def test_a_malformed_base_url_is_refused_at_load(tmp_path: Path, url: str, message: str) -> None:
    path = tmp_path / "agenttest.yaml"
    path.write_text(config_with(f'    base_url: "{url}"'), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    [problem] = caught.value.problems
    assert problem.file == str(path)
    assert problem.line == 4
    assert problem.field == "agents.target.base_url"
    assert message in problem.message


@pytest.mark.parametrize(("url", "message"), BAD_URLS[:3])
def test_a_malformed_http_agent_url_is_refused_at_load(
    tmp_path: Path, url: str, message: str
) -> None:
    path = tmp_path / "agenttest.yaml"
    path.write_text(config_with(f'    url: "{url}"', protocol="http"), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    [problem] = caught.value.problems
    assert (problem.file, problem.line, problem.field) == (str(path), 4, "agents.target.url")
    assert message in problem.message


def test_good_urls_still_load(tmp_path: Path) -> None:
    path = tmp_path / "agenttest.yaml"
    path.write_text(
        "agents:\n"
        "  a: {base_url: 'http://127.0.0.1:8700/v1'}\n"
        "  b: {base_url: 'https://api.example.com/v1/'}\n"
        "  c: {base_url: 'http://[::1]:8700/v1'}\n"
        "  d: {base_url: 'HTTP://Example.COM'}\n"
        "  e: {protocol: http, url: 'https://h.example/chat?key=${KEY}&x=1'}\n"
        "  f: {base_url: '${URL:-http://localhost:8700/v1}'}\n"
        "  g: {base_url: 'http://bob:${PASS}@host.internal:65535/v1'}\n"
        "  h: {base_url: 'http://bücher.example/v1'}\n",
        encoding="utf-8",
    )
    config = load_config(path, env={"KEY": "k", "PASS": "p@ss/word"})
    assert config.agents["f"].base_url == "http://localhost:8700/v1"
    assert config.agents["e"].url == "https://h.example/chat?key=k&x=1"


def test_a_url_made_bad_by_its_variable_names_the_field_and_not_the_secret(
    tmp_path: Path,
) -> None:
    path = tmp_path / "agenttest.yaml"
    path.write_text(config_with("    base_url: ${TARGET_URL}"), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={"TARGET_URL": "s3cr3t-token-host:99999"})
    [problem] = caught.value.problems
    assert (problem.line, problem.field) == (4, "agents.target.base_url")
    assert "s3cr3t" not in str(caught.value)


def test_through_the_cli_it_exits_2_before_anything_is_called(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "agenttest.yaml").write_text(
        config_with('    base_url: "localhost:99999/v1"'), encoding="utf-8"
    )
    started = time.monotonic()
    code = main(["-i", "Hello there", "-n", "target"])
    elapsed = time.monotonic() - started
    out, err = capsys.readouterr()
    assert code == 2, err
    assert out == ""
    assert "Traceback" not in err and "internal error" not in err
    assert (
        "agenttest.yaml:4: agents.target.base_url: not a valid URL: needs http:// or https://"
        in err
    ), err
    assert elapsed < 2, "refused at load, not after retries with 1 s back-offs"
    assert not (tmp_path / ".agenttest").exists(), "nothing was stored"
