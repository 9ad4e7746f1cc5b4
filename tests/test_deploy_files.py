"""The deployment files (docker-compose.yml, deploy/) are correct by construction.

No Docker engine or cluster is needed: the files are parsed and every reference in them
is checked against the project (console scripts and their arguments, the Celery app,
settings, paths inside the image), and deploy/start-worker.sh is run for real with
stub `celery` and `agenttest-submit` commands against the local PostgreSQL.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import shlex
import stat
import subprocess
import sys
import sysconfig
import time
import tomllib
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from agenttest_worker.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def queue_lists(queue: str) -> list[str]:
    """The Redis lists of `queue` under the app's transport options: the priority steps'."""
    from agenttest_worker.fleet.celery_app import app

    options = app.conf.broker_transport_options
    steps, sep = options["priority_steps"], options["sep"]
    return [f"{queue}{sep}{step}" if step else queue for step in steps]


COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
START_WORKER = ROOT / "deploy" / "start-worker.sh"
K8S = ROOT / "deploy" / "k8s"
SUITE = ROOT / "agenttest_worker" / "demo" / "suite"
PG_ADMIN_URL = os.environ.get("AGENTTEST_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")

IMAGE_SERVICES = {"migrate", "worker", "flower", "demo", "submitter", "exporter"}
# The monitoring profile's services from public images.
MONITORING_SERVICES = {"prometheus", "grafana"}
SETTINGS_VARS = {f"AGENTTEST_{name.upper()}" for name in Settings.model_fields}
# AGENTTEST_* variables that are not Settings fields, and where they are documented.
DOCUMENTED_EXTRAS = {
    "AGENTTEST_DEMO_URL": SUITE / "agenttest.yaml",
    "AGENTTEST_SCRIPTS_DIR": ROOT / "docs" / "fleet.md",
}
AGENTTEST_VAR = re.compile(r"\bAGENTTEST_[A-Z0-9_]+\b")


# --- helpers ---------------------------------------------------------------------------


@functools.cache
def _compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def _services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = _compose()["services"]
    return services


_INTERPOLATION = re.compile(r"\$\$|\$\{(\w+)(?:(:?[-?])([^}]*))?\}|\$(\w+)")


def _interpolate(value: str, env: dict[str, str] | None = None) -> str:
    """Compose's variable substitution: ${V}, ${V:-default}, ${V-default}, ${V:?err}, $$."""
    env = env or {}

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(4)
        op, arg = match.group(2), match.group(3)
        current = env.get(name)
        if op in (":-", "-"):
            return current if current or (op == "-" and current is not None) else arg
        if op in (":?", "?"):
            if not current:
                raise KeyError(f"{name}: {arg}")
            return current
        return current or ""

    return _INTERPOLATION.sub(substitute, value)


def _argv(command: str | list[str], env: dict[str, str] | None = None) -> list[str]:
    """A compose command as the container gets it (after compose's substitution)."""
    return [_interpolate(word, env) for word in _words(command)]


def _words(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(w) for w in command]


def _duration(text: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


@functools.cache
def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).strip().partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, "Dockerfile ends with a continuation line"
    return instructions


def _copies() -> list[tuple[Path, PurePosixPath]]:
    """(source in the build context, destination in the image) of every COPY."""
    workdir = PurePosixPath("/")
    copies = []
    for keyword, rest in _dockerfile():
        if keyword == "WORKDIR":
            workdir = workdir / rest
        elif keyword in ("COPY", "ADD"):
            words = [w for w in shlex.split(rest) if not w.startswith("--")]
            *sources, dest = words
            dest_path = workdir / dest
            for source in sources:
                src = ROOT / source
                if dest.endswith("/") or len(sources) > 1:
                    copies.append((src, dest_path / PurePosixPath(source).name))
                else:
                    copies.append((src, dest_path))
    return copies


def _source_of(image_path: str) -> Path | None:
    """The build-context file that ends up at `image_path` in the image, if any."""
    target = PurePosixPath(image_path)
    for src, dest in _copies():
        if target == dest:
            return src
        if src.is_dir() and dest in target.parents:
            return src / target.relative_to(dest)
    return None


def _project_scripts() -> dict[str, str]:
    scripts: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "scripts"
    ]
    return scripts


def _venv_bin() -> Path:
    return Path(sysconfig.get_path("scripts"))


def _check_command(argv: list[str], where: str) -> None:
    """The program exists (in the image or the venv) and accepts these arguments."""
    assert argv, f"{where}: empty command"
    program, args = argv[0], argv[1:]
    if program.startswith("/"):
        source = _source_of(program)
        assert source is not None, f"{where}: {program} is not copied into the image"
        assert source.is_file(), f"{where}: {source} does not exist"
        assert os.access(source, os.X_OK), f"{where}: {source} is not executable"
        return
    assert (_venv_bin() / program).exists(), f"{where}: {program} is not in {_venv_bin()}"
    if program == "agenttest-submit":
        assert program in _project_scripts()
        from agenttest_submit.cli.main import build_parser
        from agenttest_submit.cli.subcommand_args import SUBCOMMANDS, build_subcommand_parser

        if args and args[0] in SUBCOMMANDS:
            build_subcommand_parser().parse_args(args)
        else:
            build_parser().parse_args(args)
    elif program == "agenttest-demo":
        assert program in _project_scripts()
        from agenttest_submit.commands.demo_command import _parser as demo_parser

        demo_parser().parse_args(args)
    elif program == "celery":
        _check_celery(args, where)
    else:
        pytest.fail(f"{where}: unexpected program {program!r}")


def _check_celery(args: list[str], where: str) -> None:
    from celery import Celery
    from celery.app.utils import find_app

    assert args[:2] == ["-A", "agenttest_worker"], f"{where}: celery must use -A agenttest_worker"
    import agenttest_worker

    app = find_app("agenttest_worker")  # what `celery -A agenttest_worker` does
    assert isinstance(app, Celery) and app is agenttest_worker.celery
    command, options = args[2], args[3:]
    if command == "worker":
        from celery.bin.worker import worker as click_command
    elif command == "inspect":
        from celery.bin.control import inspect as click_command
    elif command == "flower":
        from importlib.metadata import entry_points

        assert "flower" in {e.name for e in entry_points(group="celery.commands")}
        import flower.options  # noqa: F401  (defines Flower's options)
        from tornado.options import options as flower_options

        for option in options:
            assert option.startswith("--"), f"{where}: {option}"
            name = option[2:].split("=", 1)[0].replace("-", "_")
            assert hasattr(flower_options, name), f"{where}: flower has no option {option}"
        return
    else:
        pytest.fail(f"{where}: unexpected celery command {command!r}")
    known = {opt for param in click_command.params for opt in param.opts}
    for option in options:
        if option.startswith("-"):
            assert option.split("=", 1)[0] in known, f"{where}: celery {command} {option}?"


@functools.cache
def _k8s_documents() -> list[tuple[Path, dict[str, Any]]]:
    documents = []
    for path in sorted(K8S.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document is not None:
                documents.append((path, document))
    return documents


def _k8s(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in _k8s_documents() if doc["kind"] == kind]


def _one(kind: str, name: str) -> dict[str, Any]:
    matches = [doc for doc in _k8s(kind) if doc["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}"
    return matches[0]


def _containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    containers: list[dict[str, Any]] = workload["spec"]["template"]["spec"]["containers"]
    return containers


def _configmap_data() -> dict[str, str]:
    data: dict[str, str] = _one("ConfigMap", "agenttest-config")["data"]
    return data


def _per_case_timeout() -> float:
    from agenttest_submit.cli.main import build_parser

    return float(build_parser().get_default("timeout"))


# --- docker-compose.yml ----------------------------------------------------------------


def test_compose_services_share_one_image_and_environment() -> None:
    services = _services()
    assert set(services) == {"redis", "postgres", *IMAGE_SERVICES, *MONITORING_SERVICES}
    assert services["redis"]["image"].startswith("redis:7")
    assert services["postgres"]["image"].startswith("postgres:16")
    images = {services[name]["image"] for name in IMAGE_SERVICES}
    assert len(images) == 1
    for name in IMAGE_SERVICES:
        build = services[name]["build"]
        assert (ROOT / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    text = COMPOSE.read_text()
    assert "&agenttest-env" in text and "<<: *agenttest-env" in text
    for name in ("migrate", "worker", "submitter"):
        env = services[name]["environment"]
        assert env["AGENTTEST_BROKER_URL"] == "redis://redis:6379/0", name
        assert "OPENAI_API_KEY" in env and env["OPENAI_API_KEY"] is None, name  # pass-through
    # Flower gets the broker and nothing secret.
    flower_env = services["flower"]["environment"]
    assert flower_env["AGENTTEST_BROKER_URL"] == "redis://redis:6379/0"
    assert not {"AGENTTEST_DATABASE_URL", "OPENAI_API_KEY"} & set(flower_env)


def test_compose_urls_match_the_services() -> None:
    from sqlalchemy.engine import make_url

    services = _services()
    env = services["worker"]["environment"]
    postgres = services["postgres"]["environment"]
    for host_env in ({}, {"POSTGRES_PASSWORD": "p4ss"}):
        url = make_url(_interpolate(env["AGENTTEST_DATABASE_URL"], host_env))
        assert url.get_backend_name() == "postgresql"
        assert (url.host, url.port) == ("postgres", 5432)
        assert url.database == postgres["POSTGRES_DB"] == "agenttest"
        assert url.username == postgres["POSTGRES_USER"]
        assert url.password == _interpolate(postgres["POSTGRES_PASSWORD"], host_env)
    broker = env["AGENTTEST_BROKER_URL"]
    assert broker.split("://")[1].split(":")[0] in services


def test_compose_dependencies_wait_for_healthy_and_migrated() -> None:
    services = _services()
    expected = {
        "migrate": {"postgres": "service_healthy"},
        "worker": {
            "redis": "service_healthy",
            "postgres": "service_healthy",
            "migrate": "service_completed_successfully",
        },
        "flower": {"redis": "service_healthy"},
        "submitter": {
            "demo": "service_healthy",
            "worker": "service_started",
            "migrate": "service_completed_successfully",
        },
        "exporter": {"redis": "service_healthy", "migrate": "service_completed_successfully"},
        "grafana": {"prometheus": "service_healthy"},
    }
    for name, service in services.items():
        depends = service.get("depends_on", {})
        assert isinstance(depends, dict), f"{name}: depends_on needs conditions"
        assert {dep: d["condition"] for dep, d in depends.items()} == expected.get(name, {}), name
        for dep, d in depends.items():
            if d["condition"] == "service_healthy":
                check = services[dep].get("healthcheck", {})
                assert check.get("test") and not check.get("disable"), f"{dep} has no healthcheck"
    assert services["migrate"].get("restart") == "no"
    assert services["submitter"]["profiles"] == ["submit"]
    for name in ("redis", "postgres", "worker", "flower", "demo"):
        assert services[name]["restart"] == "unless-stopped", name


def test_compose_healthchecks() -> None:
    services = _services()
    assert "redis-cli" in str(services["redis"]["healthcheck"]["test"])
    assert "pg_isready" in str(services["postgres"]["healthcheck"]["test"])
    assert services["migrate"]["healthcheck"] == {"disable": True}
    assert services["submitter"]["healthcheck"] == {"disable": True}
    # The worker pings itself by the name start-worker.sh gives it; $$ keeps compose from
    # substituting the host's HOSTNAME.
    worker_check = " ".join(services["worker"]["healthcheck"]["test"])
    assert "worker@$$HOSTNAME" in worker_check
    assert '-n "worker@%h"' in START_WORKER.read_text()
    ping = _argv(worker_check.split("CMD-SHELL", 1)[1].split(">")[0])
    _check_command(ping, "worker healthcheck")
    assert ping[3:6] == ["inspect", "ping", "-d"]
    # Flower: its unauthenticated /healthcheck, on the port it is told to use.
    flower_check = " ".join(services["flower"]["healthcheck"]["test"])
    assert "127.0.0.1:5555/healthcheck" in flower_check
    from flower.urls import handlers

    assert any(isinstance(h, tuple) and h[0] == "/healthcheck" for h in handlers)
    # Demo: a route the demo server really has.
    demo_check = " ".join(services["demo"]["healthcheck"]["test"])
    assert "127.0.0.1:8700/v1/models" in demo_check
    server = (ROOT / "agenttest_worker" / "demo" / "demo_server.py").read_text()
    assert 'add_get("/v1/models"' in server


def test_compose_worker_replicas_grace_and_volumes() -> None:
    data = _compose()
    services = data["services"]
    worker = services["worker"]
    assert worker["deploy"]["replicas"] == "${WORKERS:-2}"
    assert int(_interpolate(worker["deploy"]["replicas"])) == 2
    assert int(_interpolate(worker["deploy"]["replicas"], {"WORKERS": "7"})) == 7
    assert "container_name" not in worker  # replicas need generated names
    grace = _duration(worker["stop_grace_period"])
    visibility = int(_interpolate(worker["environment"]["AGENTTEST_VISIBILITY_TIMEOUT"]))
    assert _per_case_timeout() < grace < visibility
    volume, mount = services["postgres"]["volumes"][0].split(":")
    assert volume in data["volumes"] and mount == "/var/lib/postgresql/data"


def test_compose_flower_requires_a_password_and_is_published() -> None:
    flower = _services()["flower"]
    assert any(str(port).endswith(":5555") for port in flower["ports"])
    with pytest.raises(KeyError, match="FLOWER_PASSWORD"):
        _argv(flower["command"])
    argv = _argv(flower["command"], {"FLOWER_PASSWORD": "pw"})
    assert "--basic-auth=admin:pw" in argv and "--port=5555" in argv
    argv = _argv(flower["command"], {"FLOWER_PASSWORD": "pw", "FLOWER_USER": "ops"})
    assert "--basic-auth=ops:pw" in argv


def test_compose_commands_exist() -> None:
    services = _services()
    host_env = {"FLOWER_PASSWORD": "pw"}
    for name in sorted(IMAGE_SERVICES):
        _check_command(_argv(services[name]["command"], host_env), f"compose service {name}")
    assert _argv(services["worker"]["command"]) == ["/app/deploy/start-worker.sh"]
    assert _argv(services["migrate"]["command"]) == ["agenttest-submit", "db", "upgrade"]
    demo = _argv(services["demo"]["command"])
    assert demo[:2] == ["agenttest-demo", "serve"] and "0.0.0.0" in demo


def test_compose_submitter_runs_the_demo_suite_against_the_demo_service() -> None:
    from agenttest_worker.agents.config_loading import load_config

    services = _services()
    submitter = services["submitter"]
    (mount,) = submitter["volumes"]
    source, target, mode = mount.split(":")
    assert (ROOT / source).resolve() == SUITE and mode == "ro"
    argv = _argv(submitter["command"])

    def on_host(path: str) -> Path:
        assert path.startswith(target + "/"), path
        return SUITE / path[len(target) + 1 :]

    suite_file = on_host(argv[argv.index("-i") + 1])
    config_file = on_host(argv[argv.index("--config") + 1])
    assert suite_file.is_file() and config_file.is_file()
    demo_url = submitter["environment"]["AGENTTEST_DEMO_URL"]
    demo_argv = _argv(services["demo"]["command"])
    assert demo_url == f"http://demo:{demo_argv[demo_argv.index('--port') + 1]}/v1"
    config = load_config(config_file, env={"AGENTTEST_DEMO_URL": demo_url})
    agent = argv[argv.index("-n") + 1]
    assert config.agents[agent].base_url == demo_url


# --- AGENTTEST_* variables ---------------------------------------------------------------


def _compose_env_vars() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for service in _services().values():
        env = service.get("environment") or {}
        assert isinstance(env, dict), "use the mapping form for environment"
        found.update(env)
    return found


def _k8s_env_names() -> set[str]:
    names: set[str] = set()
    for _, doc in _k8s_documents():
        if doc["kind"] == "ConfigMap":
            names |= set(doc["data"])
        elif doc["kind"] == "Secret":
            names |= set(doc.get("stringData", {})) | set(doc.get("data", {}))
        elif doc["kind"] in ("Deployment", "Job"):
            for container in _containers(doc):
                for item in container.get("env", []):
                    names.add(item["name"])
                    ref = item.get("valueFrom", {})
                    for key in ("secretKeyRef", "configMapKeyRef"):
                        if key in ref:
                            names.add(ref[key]["key"])
    return names


def test_every_agenttest_variable_is_a_setting() -> None:
    used: dict[str, str] = {}
    for name in _compose_env_vars():
        used.setdefault(name, "docker-compose.yml environment")
    for name in _k8s_env_names():
        used.setdefault(name, "deploy/k8s")
    for path in (COMPOSE, DOCKERFILE, START_WORKER, *K8S.glob("*.yaml")):
        for name in AGENTTEST_VAR.findall(path.read_text()):
            used.setdefault(name, str(path.relative_to(ROOT)))
    agenttest_vars = {name: where for name, where in used.items() if name.startswith("AGENTTEST_")}
    assert {"AGENTTEST_BROKER_URL", "AGENTTEST_DATABASE_URL"} <= set(agenttest_vars)
    for name, where in sorted(agenttest_vars.items()):
        if name in DOCUMENTED_EXTRAS:
            assert name in DOCUMENTED_EXTRAS[name].read_text(), f"{name} is not documented"
        else:
            assert name in SETTINGS_VARS, f"{name} ({where}) is not a Settings field"


def test_other_worker_variables_are_read_by_the_start_script() -> None:
    script = START_WORKER.read_text()
    worker_env = _services()["worker"]["environment"]
    names = {n for n, v in worker_env.items() if v is not None} | set(_configmap_data())
    for name in sorted(n for n in names if not n.startswith("AGENTTEST_")):
        assert f"${{{name}" in script, f"{name} is set but deploy/start-worker.sh ignores it"


def test_configured_values_are_valid_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        name: _interpolate(value)
        for name, value in _compose_env_vars().items()
        if name in SETTINGS_VARS and value is not None
    }
    for values in (env, {k: v for k, v in _configmap_data().items() if k in SETTINGS_VARS}):
        for name in SETTINGS_VARS:
            monkeypatch.delenv(name, raising=False)
        for name, value in values.items():
            monkeypatch.setenv(name, value)
        settings = Settings.from_environment()
        assert settings.queue == "agenttest"
        assert settings.visibility_timeout > _per_case_timeout()


# --- deploy/Dockerfile -----------------------------------------------------------------


def test_dockerfile() -> None:
    instructions = _dockerfile()
    keywords = [keyword for keyword, _ in instructions]
    assert instructions[0] == ("FROM", "python:3.11-slim")
    assert "ENTRYPOINT" not in keywords
    users = [rest for keyword, rest in instructions if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    for source, _ in _copies():
        assert source.exists(), f"COPY source {source.relative_to(ROOT)} does not exist"
    # What `pip install` needs: pyproject.toml, its readme and every package.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    copied = {source.relative_to(ROOT).as_posix() for source, _ in _copies()}
    assert {"pyproject.toml", pyproject["project"]["readme"]} <= copied
    for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]:
        assert pattern.rstrip("*") in copied
    runs = " ".join(rest for keyword, rest in instructions if keyword == "RUN")
    install = re.search(r"pip install (\S+)", runs)
    assert install and _source_of(install.group(1) + "/pyproject.toml") == ROOT / "pyproject.toml"
    (cmd,) = [rest for keyword, rest in instructions if keyword == "CMD"]
    cmd_argv = json.loads(cmd)  # exec form: SIGTERM goes straight to the script
    _check_command(cmd_argv, "Dockerfile CMD")
    assert _source_of(cmd_argv[0]) == START_WORKER
    (healthcheck,) = [rest for keyword, rest in instructions if keyword == "HEALTHCHECK"]
    ping = _words(healthcheck.split(" CMD ", 1)[1].split(">")[0])
    _check_command(ping, "Dockerfile HEALTHCHECK")
    assert ping[3:] == ["inspect", "ping", "-d", "worker@$HOSTNAME", "--timeout", "10"]


# --- deploy/start-worker.sh --------------------------------------------------------------


def test_start_worker_script_is_valid_bash() -> None:
    mode = START_WORKER.stat().st_mode
    assert mode & stat.S_IXUSR and mode & stat.S_IXOTH
    text = START_WORKER.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "\nset -euo pipefail\n" in text
    assert "\nexec celery -A agenttest_worker worker " in text
    # Deployments retry the database once a second unless told otherwise.
    assert '\nDB_WAIT_INTERVAL="${DB_WAIT_INTERVAL:-1}"\n' in text
    subprocess.run(["bash", "-n", str(START_WORKER)], check=True)


def _stubs(tmp_path: Path) -> tuple[Path, Path]:
    """A bin dir with stub celery/agenttest-submit (recording argv, pid) and python."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.jsonl"
    bin_dir.mkdir()
    recorder = (
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "record = {'cmd': os.path.basename(sys.argv[0]), 'argv': sys.argv[1:], "
        "'pid': os.getpid(), 'db': os.environ.get('AGENTTEST_DATABASE_URL')}\n"
        "with open(os.environ['STUB_LOG'], 'a') as f:\n"
        "    f.write(json.dumps(record) + '\\n')\n"
        "sys.exit(int(os.environ.get('STUB_EXIT_' + record['cmd'].replace('-', '_'), '0')))\n"
    )
    for name in ("celery", "agenttest-submit"):
        (bin_dir / name).write_text(recorder)
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    return bin_dir, log


def _script_env(bin_dir: Path, log: Path, **extra: str) -> dict[str, str]:
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(bin_dir.parent),
        "STUB_LOG": str(log),
        "AGENTTEST_BROKER_URL": "redis://127.0.0.1:6379/15",
    }
    env.update(extra)
    return env


def _calls(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_start_worker_waits_for_the_database_migrates_and_execs_celery(tmp_path: Path) -> None:
    import psycopg

    bin_dir, log = _stubs(tmp_path)
    name = f"agenttest_wait_{os.getpid()}_{secrets.token_hex(3)}"
    url = f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"
    env = _script_env(
        bin_dir,
        log,
        AGENTTEST_DATABASE_URL=url,
        DB_WAIT_TIMEOUT="20",
        DB_WAIT_INTERVAL="0.1",  # (the default is 1 s; the retry is the same)
        AGENTTEST_QUEUE="nightly",
        AGENTTEST_WORKER_CONCURRENCY="7",
        LOG_LEVEL="DEBUG",
    )
    stderr_path = tmp_path / "stderr"
    try:
        psycopg.connect(PG_ADMIN_URL, connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is required at {PG_ADMIN_URL} (see .ci/run): {exc}")
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            [str(START_WORKER), "--without-gossip"], env=env, stderr=stderr, cwd=tmp_path
        )
    try:
        # The database does not exist yet: the script must say it waits, and keep trying.
        deadline = time.monotonic() + 15
        while "waiting for database" not in stderr_path.read_text():
            assert proc.poll() is None, stderr_path.read_text()
            assert time.monotonic() < deadline, "the script never said it was waiting"
            time.sleep(0.05)
        assert _calls(log) == []
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        assert proc.wait(timeout=20) == 0, stderr_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    output = stderr_path.read_text()
    assert "is reachable" in output
    submit, celery = _calls(log)
    assert submit["cmd"] == "agenttest-submit" and submit["argv"] == ["db", "upgrade"]
    assert submit["db"] == url
    assert celery["cmd"] == "celery"
    assert celery["argv"] == [
        "-A", "agenttest_worker", "worker", "--loglevel=DEBUG", "--concurrency=7",
        "-n", "worker@%h", "-Q", "nightly", "--without-gossip",
    ]  # fmt: skip
    # exec: Celery is the script's own process, so SIGTERM reaches it.
    assert celery["pid"] == proc.pid


def test_start_worker_defaults(tmp_path: Path) -> None:
    bin_dir, log = _stubs(tmp_path)
    env = _script_env(bin_dir, log, AGENTTEST_DATABASE_URL=f"sqlite:///{tmp_path / 'a.db'}")
    result = subprocess.run(
        [str(START_WORKER)], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert [c["argv"] for c in _calls(log)] == [
        ["db", "upgrade"],
        ["-A", "agenttest_worker", "worker", "--loglevel=INFO", "--concurrency=64",
         "-n", "worker@%h", "-Q", "agenttest"],
    ]  # fmt: skip
    defaults = Settings.model_fields
    assert defaults["queue"].default == "agenttest"
    assert defaults["worker_concurrency"].default == 64


def test_start_worker_stops_when_the_migration_fails(tmp_path: Path) -> None:
    bin_dir, log = _stubs(tmp_path)
    env = _script_env(
        bin_dir,
        log,
        AGENTTEST_DATABASE_URL=f"sqlite:///{tmp_path / 'a.db'}",
        STUB_EXIT_agenttest_submit="3",
    )
    result = subprocess.run(
        [str(START_WORKER)], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 3
    assert [c["cmd"] for c in _calls(log)] == ["agenttest-submit"]


def test_start_worker_gives_up_on_an_unreachable_database(tmp_path: Path) -> None:
    bin_dir, log = _stubs(tmp_path)
    env = _script_env(
        bin_dir,
        log,
        AGENTTEST_DATABASE_URL="postgresql://agenttest:s3cret-pw@127.0.0.1:1/agenttest",
        DB_WAIT_TIMEOUT="1",
    )
    started = time.monotonic()
    result = subprocess.run(
        [str(START_WORKER)], env=env, capture_output=True, text=True, timeout=30
    )
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert elapsed >= 1
    assert "database postgresql://agenttest:***@127.0.0.1:1/agenttest not reachable after 1s" in (
        result.stderr
    )
    assert "s3cret-pw" not in result.stderr + result.stdout
    assert _calls(log) == []


def test_start_worker_requires_the_urls(tmp_path: Path) -> None:
    bin_dir, log = _stubs(tmp_path)
    env = _script_env(bin_dir, log)
    result = subprocess.run([str(START_WORKER)], env=env, capture_output=True, text=True)
    assert result.returncode == 2
    assert "AGENTTEST_DATABASE_URL is not set" in result.stderr
    del env["AGENTTEST_BROKER_URL"]
    result = subprocess.run([str(START_WORKER)], env=env, capture_output=True, text=True)
    assert result.returncode == 2
    assert "AGENTTEST_BROKER_URL is not set" in result.stderr
    assert _calls(log) == []


# --- deploy/k8s ------------------------------------------------------------------------


def test_k8s_manifests_parse_and_are_namespace_agnostic() -> None:
    documents = _k8s_documents()
    kinds = Counter(doc["kind"] for _, doc in documents)
    assert kinds == {
        "ConfigMap": 1,
        "Secret": 2,
        "Deployment": 3,
        "Job": 1,
        "Service": 3,
        "ScaledObject": 1,
        "ServiceMonitor": 2,
        "Kustomization": 1,
    }
    for path, doc in documents:
        assert doc.get("apiVersion"), path
        if doc["kind"] != "Kustomization":
            assert doc["metadata"].get("name"), path
            assert "namespace" not in doc["metadata"], f"{path}: hard-coded namespace"
    (kustomization,) = _k8s("Kustomization")
    assert "namespace" not in kustomization
    listed = set(kustomization["resources"])
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    # The Secret template holds placeholders: it is applied by hand, never by -k.
    assert listed == manifests - {"secret.example.yaml"}
    for path, doc in documents:
        if doc["kind"] == "Secret":
            assert path.name == "secret.example.yaml"
            assert "TEMPLATE" in path.read_text().splitlines()[0]
            assert all("REPLACE_ME" in value for value in doc["stringData"].values())
    images = {c["image"] for kind in ("Deployment", "Job") for d in _k8s(kind)
              for c in _containers(d)}  # fmt: skip
    assert len(images) == 1
    assert images.pop().split(":")[0] == kustomization["images"][0]["name"]


def test_k8s_workloads_reference_existing_config_and_commands() -> None:
    configmaps = {d["metadata"]["name"]: d for d in _k8s("ConfigMap")}
    secrets_ = {d["metadata"]["name"]: d for d in _k8s("Secret")}
    for kind in ("Deployment", "Job"):
        for workload in _k8s(kind):
            name = workload["metadata"]["name"]
            pod = workload["spec"]["template"]
            if kind == "Deployment":
                selector = workload["spec"]["selector"]["matchLabels"]
                assert selector.items() <= pod["metadata"]["labels"].items(), name
            assert pod["spec"]["securityContext"]["runAsNonRoot"] is True, name
            for container in _containers(workload):
                _check_command(container["command"], f"{kind} {name}")
                assert container["resources"]["requests"], name
                for source in container.get("envFrom", []):
                    if "configMapRef" in source:
                        assert source["configMapRef"]["name"] in configmaps, name
                    if "secretRef" in source:
                        assert source["secretRef"]["name"] in secrets_, name
                for item in container.get("env", []):
                    ref = item.get("valueFrom", {})
                    if "secretKeyRef" in ref:
                        secret = secrets_[ref["secretKeyRef"]["name"]]
                        assert ref["secretKeyRef"]["key"] in secret["stringData"], name
                    if "configMapKeyRef" in ref:
                        config = configmaps[ref["configMapKeyRef"]["name"]]
                        assert ref["configMapKeyRef"]["key"] in config["data"], name
    job = _one("Job", "agenttest-migrate")
    assert _containers(job)[0]["command"] == ["agenttest-submit", "db", "upgrade"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] in ("Never", "OnFailure")


def test_k8s_worker_deployment_shuts_down_warm_and_probes_celery() -> None:
    worker = _one("Deployment", "agenttest-worker")
    spec = worker["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert _source_of(container["command"][0]) == START_WORKER
    assert "lifecycle" not in container  # no preStop: SIGTERM is Celery's warm shutdown
    grace = spec["terminationGracePeriodSeconds"]
    visibility = int(_configmap_data()["AGENTTEST_VISIBILITY_TIMEOUT"])
    assert _per_case_timeout() < grace < visibility
    assert {"readinessProbe", "livenessProbe"} <= set(container)
    startup = container["startupProbe"]
    startup_window = startup["periodSeconds"] * startup["failureThreshold"]
    assert startup_window > int(_configmap_data()["DB_WAIT_TIMEOUT"])  # then it migrates
    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container[probe_name]
        shell, flag, script = probe["exec"]["command"]
        assert (shell, flag) == ("sh", "-c"), probe_name  # so that $HOSTNAME is expanded
        ping = _words(script.split(">")[0])
        _check_command(ping, f"worker {probe_name}")
        assert ping[3:7] == ["inspect", "ping", "-d", "worker@$HOSTNAME"], probe_name
        assert probe["timeoutSeconds"] > 10, probe_name  # above the ping's own timeout
    assert container["resources"]["limits"]["memory"]


def test_k8s_flower_service_reaches_flower() -> None:
    deployment = _one("Deployment", "agenttest-flower")
    service = _one("Service", "agenttest-flower")
    (container,) = _containers(deployment)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] in ports
    assert f"--port={ports[service_port['targetPort']]}" in container["command"]
    env = {item["name"] for item in container["env"]}
    assert {"AGENTTEST_BROKER_URL", "FLOWER_BASIC_AUTH"} <= env
    assert "AGENTTEST_DATABASE_URL" not in env and "envFrom" not in container
    import flower.options  # noqa: F401  (defines the options FLOWER_* env vars set)
    from tornado.options import options as flower_options

    assert hasattr(flower_options, "basic_auth")  # what FLOWER_BASIC_AUTH sets
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/healthcheck"


def _flower_commands() -> list[tuple[str, list[str]]]:
    """(where, command as written) of everything in the deploy files that starts Flower."""
    found = [
        (f"compose {name}", _words(service["command"]))
        for name, service in _services().items()
        if "flower" in _words(service.get("command") or [])
    ]
    for kind in ("Deployment", "Job"):
        for workload in _k8s(kind):
            for container in _containers(workload):
                if "flower" in container["command"]:
                    found.append((f"k8s {workload['metadata']['name']}", container["command"]))
    return found


def test_flower_never_starts_without_a_login() -> None:
    """Unauthenticated, Flower refuses its /api/* but its pages list every task with its
    arguments and results: each Flower the deploy files start has --basic-auth from a
    value that must be set, or it does not start."""
    assert {where for where, _ in _flower_commands()} == {
        "compose flower",
        "k8s agenttest-flower",
    }
    for where, command in _flower_commands():
        logins = [word for word in command if word.startswith("--basic-auth=")]
        assert len(logins) == 1, f"{where}: Flower without --basic-auth"
    # compose: FLOWER_PASSWORD unset or empty is an error of `docker compose` itself.
    flower = _services()["flower"]
    for env in ({}, {"FLOWER_PASSWORD": ""}):
        with pytest.raises(KeyError, match="FLOWER_PASSWORD"):
            _argv(flower["command"], env)
    argv = _argv(flower["command"], {"FLOWER_PASSWORD": "pw"})
    assert "--basic-auth=admin:pw" in argv
    assert "--basic-auth=ops:pw" in _argv(flower["command"], {"FLOWER_PASSWORD": "pw",
                                                              "FLOWER_USER": "ops"})  # fmt: skip
    assert not any(name.startswith("FLOWER_") for name in flower.get("environment") or {})
    # k8s: $(FLOWER_BASIC_AUTH), which Kubernetes expands from a required Secret key.
    (container,) = _containers(_one("Deployment", "agenttest-flower"))
    assert "--basic-auth=$(FLOWER_BASIC_AUTH)" in container["command"]
    env = {item["name"]: item for item in container["env"]}
    assert "FLOWER_UNAUTHENTICATED_API" not in env
    ref = env["FLOWER_BASIC_AUTH"]["valueFrom"]["secretKeyRef"]
    assert ref.get("optional", False) is False  # a missing Secret keeps the pod from starting
    user, colon, password = _one("Secret", ref["name"])["stringData"][ref["key"]].partition(":")
    assert user and colon and password
    guide = (ROOT / "docs" / "fleet.md").read_text()
    assert "Flower never runs without a login" in guide


def test_k8s_keda_scales_the_workers_on_the_queue() -> None:
    (path,) = [p for p, doc in _k8s_documents() if doc["kind"] == "ScaledObject"]
    header = path.read_text().split("apiVersion", 1)[0]
    assert "KEDA" in header and "required" in header
    scaled = _k8s("ScaledObject")[0]
    assert scaled["apiVersion"].startswith("keda.sh/")
    target = scaled["spec"]["scaleTargetRef"]
    assert target.get("kind", "Deployment") == "Deployment"
    assert _one("Deployment", target["name"]) is not None
    assert _source_of(_containers(_one("Deployment", target["name"]))[0]["command"][0]) == (
        START_WORKER
    )
    assert "replicas" not in _one("Deployment", target["name"])["spec"]  # KEDA owns it
    triggers = scaled["spec"]["triggers"]
    assert {t["type"] for t in triggers} == {"redis"}
    # Both lists the queue's messages wait in (kombu's Redis transport keeps a list per
    # priority step, fleet/celery_app.py).
    lists = [t["metadata"]["listName"] for t in triggers]
    assert lists == queue_lists(Settings.model_fields["queue"].default)
    assert lists == queue_lists(_configmap_data()["AGENTTEST_QUEUE"])
    assert {t["metadata"]["address"] for t in triggers} == {triggers[0]["metadata"]["address"]}
    assert {t["metadata"]["databaseIndex"] for t in triggers} == {
        triggers[0]["metadata"]["databaseIndex"]
    }
    assert all(int(t["metadata"]["listLength"]) > 0 for t in triggers)
    meta = triggers[0]["metadata"]
    assert 1 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]
    # The same Redis database as the broker URL in the Secret template.
    broker = _one("Secret", "agenttest-secrets")["stringData"]["AGENTTEST_BROKER_URL"]
    match = re.fullmatch(r"redis://[^/:]+:(\d+)/(\d+)", broker)
    assert match, broker
    port, db = match.groups()
    assert meta["address"].rsplit(":", 1)[1] == port
    assert meta.get("databaseIndex", "0") == db


# --- metrics: the monitoring profile, Prometheus, Grafana, Kubernetes ----------------------


def _metrics_ports() -> tuple[int, int]:
    """(the workers' AGENTTEST_METRICS_PORT, the exporter's --port) in docker-compose.yml."""
    services = _services()
    worker = int(_interpolate(services["worker"]["environment"]["AGENTTEST_METRICS_PORT"]))
    exporter = _argv(services["exporter"]["command"])
    _check_command(exporter, "compose exporter")
    assert exporter[:2] == ["agenttest-submit", "metrics"]
    return worker, int(exporter[exporter.index("--port") + 1])


def test_compose_monitoring_profile_scrapes_the_workers_and_the_exporter() -> None:
    services = _services()
    for name in ("exporter", *MONITORING_SERVICES):
        assert services[name]["profiles"] == ["monitoring"], name
        assert services[name]["restart"] == "unless-stopped", name
        assert services[name]["healthcheck"]["test"], name
    # The exporter reads the store and the broker, and nothing secret of the agents.
    env = services["exporter"]["environment"]
    assert (
        env["AGENTTEST_DATABASE_URL"] == services["worker"]["environment"]["AGENTTEST_DATABASE_URL"]
    )
    assert env["AGENTTEST_BROKER_URL"] == "redis://redis:6379/0"
    assert not any(name.endswith("_API_KEY") for name in env)
    # Published on the host's loopback only.
    for name in MONITORING_SERVICES:
        assert all(str(port).startswith("127.0.0.1:") for port in services[name]["ports"]), name
    assert "ports" not in services["exporter"] and "ports" not in services["worker"]
    # Prometheus scrapes every worker replica and the exporter, on their ports.
    worker_port, exporter_port = _metrics_ports()
    mounts = {
        dest: src for src, dest, *_ in (v.split(":") for v in services["prometheus"]["volumes"])
    }
    config_file = ROOT / mounts["/etc/prometheus/prometheus.yml"]
    config = yaml.safe_load(config_file.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    (workers,) = jobs["agenttest-workers"]["dns_sd_configs"]
    assert workers["names"] == ["worker"] and workers["port"] == worker_port
    (fleet,) = jobs["agenttest-fleet"]["static_configs"]
    assert fleet["targets"] == [f"exporter:{exporter_port}"]
    # Served on the stack's network, both answer only scrapes carrying METRICS_TOKEN:
    # Prometheus reads it from the compose secret made of that variable.
    worker_env = services["worker"]["environment"]
    assert worker_env["AGENTTEST_METRICS_HOST"] == "0.0.0.0"
    assert worker_env["AGENTTEST_METRICS_TOKEN"] == "${METRICS_TOKEN:-}"
    assert env["AGENTTEST_METRICS_TOKEN"] == "${METRICS_TOKEN:-}"
    exporter = _argv(services["exporter"]["command"])
    assert exporter[exporter.index("--host") + 1] == "0.0.0.0"
    assert "AGENTTEST_METRICS_TOKEN" in " ".join(services["exporter"]["healthcheck"]["test"])
    secrets = yaml.safe_load(COMPOSE.read_text())["secrets"]
    assert secrets["metrics_token"] == {"environment": "METRICS_TOKEN"}
    assert services["prometheus"]["secrets"] == ["metrics_token"]
    for job in jobs.values():
        assert job["authorization"] == {"credentials_file": "/run/secrets/metrics_token"}


def test_compose_grafana_is_provisioned_with_the_dashboard() -> None:
    grafana = _services()["grafana"]
    mounts = {dest: ROOT / src for src, dest, *_ in (v.split(":") for v in grafana["volumes"])
              if src.startswith("./")}  # fmt: skip
    provisioning = mounts["/etc/grafana/provisioning"]
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert datasource["type"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"  # the service and its port
    assert any(str(p).endswith(":9090") for p in _services()["prometheus"]["ports"])
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "agenttest.yml").read_text())[
        "providers"
    ]
    folder = provider["options"]["path"]
    dashboards = {dest: src for dest, src in mounts.items() if dest.startswith(folder + "/")}
    assert list(dashboards.values()) == [ROOT / "deploy" / "grafana" / "agenttest.json"]
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "agenttest.json").read_text())
    assert dashboard["uid"] == "agenttest" and dashboard["panels"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home in dashboards
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"


def test_k8s_workers_and_the_exporter_are_scraped() -> None:
    port = int(_configmap_data()["AGENTTEST_METRICS_PORT"])
    services = {d["metadata"]["name"]: d for d in _k8s("Service")}
    for name, expected in (("agenttest-worker", port), ("agenttest-metrics-exporter", 9809)):
        deployment = _one("Deployment", name)
        pod = deployment["spec"]["template"]
        annotations = pod["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", name
        assert int(annotations["prometheus.io/port"]) == expected, name
        (container,) = _containers(deployment)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["metrics"] == expected, name
        # A Service selects these pods by the port's name, and a ServiceMonitor the Service.
        labels = pod["metadata"]["labels"]
        (service,) = [
            s
            for s in services.values()
            if s["spec"]["selector"].items() <= labels.items()
            and any(p.get("targetPort") == "metrics" for p in s["spec"]["ports"])
        ]
        service_labels = service["metadata"]["labels"].items()
        monitors = [
            m
            for m in _k8s("ServiceMonitor")
            if m["spec"]["selector"]["matchLabels"].items() <= service_labels
        ]
        assert len(monitors) == 1, name
        (endpoint,) = monitors[0]["spec"]["endpoints"]
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}, name
    exporter = _containers(_one("Deployment", "agenttest-metrics-exporter"))[0]
    assert exporter["command"][:2] == ["agenttest-submit", "metrics"]
    assert int(exporter["command"][exporter["command"].index("--port") + 1]) == 9809
    env = {item["name"] for item in exporter["env"]}
    assert env == {
        "AGENTTEST_BROKER_URL",
        "AGENTTEST_DATABASE_URL",
        "AGENTTEST_QUEUE",
        "AGENTTEST_METRICS_TOKEN",
    }
    # On every address of their pods, so every scrape carries the token.
    assert exporter["command"][exporter["command"].index("--host") + 1] == "0.0.0.0"
    assert _configmap_data()["AGENTTEST_METRICS_HOST"] == "0.0.0.0"
    for monitor in _k8s("ServiceMonitor"):
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["authorization"]["credentials"] == {
            "name": "agenttest-secrets",
            "key": "AGENTTEST_METRICS_TOKEN",
        }
    assert "envFrom" not in exporter  # the agents' API keys stay with the workers
    assert _one("Deployment", "agenttest-metrics-exporter")["spec"]["replicas"] == 1
    (path,) = {p for p, doc in _k8s_documents() if doc["kind"] == "ServiceMonitor"}
    assert "Prometheus Operator" in path.read_text().split("apiVersion", 1)[0]
