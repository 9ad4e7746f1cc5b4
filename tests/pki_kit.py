"""A private certificate authority made at test time with the `openssl` command, and
small https servers that speak Chat Completions, for the TLS and proxy tests.

    pki = Pki.make(tmp_path / "pki")          # ca.pem, server.pem/.key, client.pem/.key
    async with serving_agent(pki.server_context()) as root:   # https://127.0.0.1:PORT
        ...

The server certificate names 127.0.0.1 and localhost; the client certificate is for
mutual TLS (`Pki.server_context(require_client=True)` asks for one signed by the CA).
EC keys: made in milliseconds, unlike RSA ones.
"""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from agent_servers import completion
from aiohttp import web

_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
_LEAF = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
"""


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr


@dataclass(frozen=True)
class Pki:
    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def client_cert(self) -> Path:
        return self.folder / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.folder / "client.key"

    @property
    def client_both(self) -> Path:
        """The client certificate and its key in one file."""
        return self.folder / "client-both.pem"

    @classmethod
    def make(cls, folder: Path, name: str = "agenttest test CA") -> Pki:
        folder.mkdir(parents=True, exist_ok=True)
        _openssl(
            "req", "-x509", *_KEY, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            cwd=folder,
        )  # fmt: skip
        leaves = {
            "server": ("/CN=127.0.0.1", "subjectAltName = IP:127.0.0.1, DNS:localhost\n"
                       "extendedKeyUsage = serverAuth\n"),
            "client": ("/CN=agenttest client", "extendedKeyUsage = clientAuth\n"),
        }  # fmt: skip
        for leaf, (subject, extensions) in leaves.items():
            (folder / f"{leaf}.ext").write_text(_LEAF + extensions, encoding="ascii")
            _openssl(
                "req", *_KEY, "-keyout", f"{leaf}.key", "-out", f"{leaf}.csr", "-subj", subject,
                cwd=folder,
            )  # fmt: skip
            _openssl(
                "x509", "-req", "-in", f"{leaf}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{leaf}.pem", "-days", "2",
                "-extfile", f"{leaf}.ext",
                cwd=folder,
            )  # fmt: skip
        pki = cls(folder)
        pki.client_both.write_bytes(pki.client_cert.read_bytes() + pki.client_key.read_bytes())
        return pki

    def server_context(self, *, require_client: bool = False) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.folder / "server.pem", self.folder / "server.key")
        if require_client:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(self.ca)
        return context


@asynccontextmanager
async def serving_agent(
    context: ssl.SSLContext | None, host: str = "127.0.0.1", seen: list[str] | None = None
) -> AsyncIterator[str]:
    """A Chat Completions agent on `host` (https with `context`, else http) answering
    every request "hello"; yields its root URL. Each request's path goes into `seen`."""

    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        if seen is not None:
            seen.append(request.path)
        return web.json_response(completion("hello"))

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"{'https' if context is not None else 'http'}://{host}:{port}"
    finally:
        await runner.cleanup()
