"""The deployment's bus (``teto secrets nats``): a real nats-server with the generated config serves TLS only,
to the parts' own users, with the same permissions as ``teto up``; the shipped template never drifts from it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
from pathlib import Path

import nats
import pytest

from libs.contracts.subjects import Subjects
from libs.runtime import bus
from teto.cli_bus import template, write_deployment
from teto.stack.embedded import EmbeddedNats

from .busprobe import Probe, subscribe_is_refused

TEMPLATE = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "nats.conf.template"


def test_the_shipped_template_is_what_the_generator_writes():
    assert TEMPLATE.read_text() == template(), "regenerate deploy/nats/nats.conf.template with teto.cli_bus.template()"


def _certificates(tls: Path) -> None:
    """A throwaway CA and a server certificate for 127.0.0.1 (what an operator brings in a deployment)."""
    tls.mkdir(parents=True)

    def run(*argv: str) -> None:
        subprocess.run(["openssl", *argv], check=True, capture_output=True, cwd=tls)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca-key.pem", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=teto-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server-key.pem", "-out", "server.csr",
        "-subj", "/CN=127.0.0.1")
    (tls / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make a test certificate")
def test_a_deployment_bus_speaks_tls_to_its_own_users_only(tmp_path: Path):
    tls = tmp_path / "tls"
    _certificates(tls)
    out = tmp_path / "secrets"
    write_deployment(out, prefix="teto", executors=[("exec-1", "node-1")], client_ca=str(tls / "ca.pem"),
                     tls_dir=str(tls), rounds=4)
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in [out / "nats.conf", *(out / "creds").glob("*.json")])
    server = EmbeddedNats(tmp_path / "nats", config=out / "nats.conf").start()
    try:
        asyncio.run(_check(server.url.replace("nats://", "tls://"), out / "creds"))
    finally:
        server.stop()


async def _check(url: str, creds: Path) -> None:
    logging.getLogger("nats.aio.client").disabled = True
    admin = await bus.connect(url, "admin", credentials_file=creds / "admin.json", attempts=1)
    await bus.ensure_streams(admin.jetstream(), Subjects("teto"))
    await admin.close()
    executor = await Probe.connect(url, creds / "executor-exec-1.json")
    try:
        await executor.nc.jetstream().publish(Subjects("teto").heartbeat("exec-1"), b"{}")
        assert await subscribe_is_refused(executor, "teto.agent.exec-2.>")
    finally:
        await executor.close()
    plain = json.loads((creds / "gateway.json").read_text())
    with pytest.raises(Exception):  # noqa: B017,PT011 - without the CA: the server's certificate is not trusted
        await nats.connect(url, user=plain["user"], password=plain["password"], allow_reconnect=False,
                           connect_timeout=3)
