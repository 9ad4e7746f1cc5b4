"""TLS for agent calls: whom an https agent is trusted as, and the client certificate it
is shown.

Every agent call goes through one aiohttp session per event loop, whatever the agent,
so TLS is chosen per request (`ssl=`): one `ssl.SSLContext` per distinct setting, made
once per process and shared by every loop. An agent's `tls:` entry gives its own trust
(`ca_file`, which replaces the default trust as curl's `--cacert` does), turns checking
off (`verify: false`) or adds a client certificate (`client_cert`, `client_key`).

Without `tls.ca_file`, the default trust is made here rather than left to aiohttp,
whose context is built once when it is imported and ignores REQUESTS_CA_BUNDLE. In
order (docs/agents.md, "TLS and proxies"):

1. SSL_CERT_FILE set: OpenSSL's default locations, which that variable (and
   SSL_CERT_DIR) replace: `ssl.create_default_context()` reads them.
2. Else REQUESTS_CA_BUNDLE set: that file, and SSL_CERT_DIR's certificates if it is set.
3. Else the system's store (SSL_CERT_DIR, when set, in place of its folder).
"""

from __future__ import annotations

import os
import ssl
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, model_validator

# The variables the default trust is read from, in the order they count.
TRUST_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE")


class TlsSettings(BaseModel):
    """An agent's `tls:` entry. Paths are relative to agenttest.yaml's folder."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ca_file: str | None = None
    verify: bool = True
    client_cert: str | None = None
    # Optional when client_cert holds the private key as well.
    client_key: str | None = None

    @model_validator(mode="after")
    def _key_has_cert(self) -> TlsSettings:
        if self.client_key is not None and self.client_cert is None:
            raise ValueError("client_key needs client_cert (the certificate it belongs to)")
        return self


class TlsFileProblem(Exception):
    """A file that cannot be used: `field` names where it was given (tls.ca_file,
    tls.client_cert, tls.client_key, or a trust variable such as REQUESTS_CA_BUNDLE),
    and `message` says what is wrong with it, in words that quote no secret."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class _Choice:
    """One distinct TLS setting: the files as absolute paths, and the trust variables'
    values when the default trust is used (a context is made again if they change)."""

    verify: bool
    ca_file: Path | None
    client_cert: Path | None
    client_key: Path | None
    trust: tuple[str | None, ...]


class AgentTls(Protocol):
    """An agent entry, as far as its TLS goes (config.AgentConfig)."""

    @property
    def tls(self) -> TlsSettings | None: ...


_contexts: dict[_Choice, ssl.SSLContext] = {}
_warned: set[str] = set()


def trust_values(env: Mapping[str, str] | None = None) -> tuple[str | None, ...]:
    environ = os.environ if env is None else env
    return tuple(environ.get(name) or None for name in TRUST_VARIABLES)


def default_context() -> ssl.SSLContext:
    """The context of every agent without a `tls:` entry: the default trust as the
    environment sets it now (the module's docstring says in which order)."""
    return _context(_Choice(True, None, None, None, trust_values()))


def context_for(agent: str, settings: TlsSettings | None, base_dir: Path) -> ssl.SSLContext:
    """The context of `agent`'s calls; TlsFileProblem when a file it names cannot be
    used. An agent whose certificates are not checked is warned of once per process
    (see `warn_unverified`)."""
    if settings is None:
        return default_context()
    if not settings.verify:
        warn_unverified(agent)
    return _context(_choice(settings, base_dir))


def check_files(settings: TlsSettings, base_dir: Path) -> TlsFileProblem | None:
    """Whether the files `settings` names make a context (read, parsed, the key matching
    its certificate), said before anything runs."""
    try:
        _context(_choice(settings, base_dir))
    except TlsFileProblem as problem:
        return problem
    return None


def trust_problems(env: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """The trust variables that name a file that is not there: (variable, problem). An
    unreadable bundle would leave no certificate trusted, and every https call failing."""
    values = dict(zip(TRUST_VARIABLES, trust_values(env), strict=True))
    in_use = ["SSL_CERT_FILE"] if values["SSL_CERT_FILE"] else ["REQUESTS_CA_BUNDLE"]
    problems = []
    for name in in_use:
        value = values[name]
        if value is not None and not os.access(value, os.R_OK):
            problems.append((name, f"{value} is not a file that can be read"))
    return problems


def warn_unverified(agent: str) -> None:
    """Say on stderr, once per process (or per run: `warn_unverified_agents`), that
    `agent`'s certificates are not checked."""
    if agent in _warned:
        return
    _warned.add(agent)
    print(
        f"warning: agent {agent}: TLS certificates are not checked (tls.verify: false)",
        file=sys.stderr,
    )


def warn_unverified_agents(agents: Mapping[str, AgentTls]) -> None:
    """Warn of each of `agents` (agenttest.yaml's entries) whose certificates are not
    checked: a new run in this process says it again, once."""
    _warned.clear()
    for name, agent in agents.items():
        if agent.tls is not None and not agent.tls.verify:
            warn_unverified(name)


def _choice(settings: TlsSettings, base_dir: Path) -> _Choice:
    def where(path: str | None) -> Path | None:
        return None if path is None else (base_dir / Path(path).expanduser()).resolve()

    own_trust = settings.ca_file is not None or not settings.verify
    return _Choice(
        verify=settings.verify,
        ca_file=where(settings.ca_file) if settings.verify else None,
        client_cert=where(settings.client_cert),
        client_key=where(settings.client_key),
        trust=() if own_trust else trust_values(),
    )


def _context(choice: _Choice) -> ssl.SSLContext:
    context = _contexts.get(choice)
    if context is None:
        # Reading the files blocks, once per setting and process: a race between two
        # loops makes the same context twice, harmlessly.
        context = _contexts[choice] = _new_context(choice)
    return context


def _new_context(choice: _Choice) -> ssl.SSLContext:
    if not choice.verify:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif choice.ca_file is not None:
        _readable("tls.ca_file", choice.ca_file)
        try:
            context = ssl.create_default_context(cafile=str(choice.ca_file))
        except ssl.SSLError:
            raise TlsFileProblem(
                "tls.ca_file", f"{choice.ca_file} holds no PEM certificate"
            ) from None
    else:
        context = _default_trust(choice.trust)
    if choice.client_cert is not None:
        _load_client_certificate(context, choice.client_cert, choice.client_key)
    # As aiohttp's own contexts: it speaks HTTP/1.1 only.
    context.set_alpn_protocols(("http/1.1",))
    return context


def _default_trust(trust: tuple[str | None, ...]) -> ssl.SSLContext:
    cert_file, cert_dir, requests_bundle = trust
    if cert_file is None and requests_bundle is not None:
        try:
            context = ssl.create_default_context(cafile=requests_bundle)
        except (OSError, ssl.SSLError):
            raise TlsFileProblem(
                "REQUESTS_CA_BUNDLE", f"{requests_bundle} is not a PEM bundle that can be read"
            ) from None
        if cert_dir is not None:
            context.load_verify_locations(capath=cert_dir)
        return context
    # OpenSSL's default locations, which SSL_CERT_FILE and SSL_CERT_DIR replace.
    return ssl.create_default_context()


class _Encrypted(Exception):
    pass


def _no_password() -> bytes:
    # Asked for a key's passphrase: OpenSSL would otherwise prompt at the terminal.
    raise _Encrypted


def _load_client_certificate(context: ssl.SSLContext, cert: Path, key: Path | None) -> None:
    cert_text = _readable("tls.client_cert", cert)
    key_field, key_text = "tls.client_cert", cert_text
    if key is not None:
        key_field, key_text = "tls.client_key", _readable("tls.client_key", key)
    if b"CERTIFICATE-----" not in cert_text:
        raise TlsFileProblem("tls.client_cert", f"{cert} holds no PEM certificate")
    if b"PRIVATE KEY-----" not in key_text:
        hint = "" if key else " (give client_key)"
        raise TlsFileProblem(key_field, f"{key or cert} holds no PEM private key{hint}")
    try:
        context.load_cert_chain(str(cert), str(key) if key else None, password=_no_password)
    except _Encrypted:
        raise TlsFileProblem(key_field, f"{key or cert}: the private key is encrypted") from None
    except ssl.SSLError as exc:
        reason = (exc.reason or str(exc)).replace("_", " ").lower()
        raise TlsFileProblem(
            key_field, f"{key or cert}: the private key does not match the certificate ({reason})"
        ) from None


def _readable(field: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TlsFileProblem(field, f"cannot read {path}: {exc.strerror or exc}") from None
