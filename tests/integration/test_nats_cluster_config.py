"""The per-node NATS configs a deployment mounts (teto/natscluster.py) really form a cluster: three real
nats-servers started from them, on loopback, route to each other over mutual TLS with the route password, and a
stream declared with three replicas (``teto bus declare --replicas 3``) has a leader and two current followers;
the parts connect with their own credentials over TLS."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from libs.contracts.subjects import Subjects
from libs.runtime import bus
from libs.runtime.ports import free_port
from teto.cli_bus import write_deployment
from teto.natscluster import ROUTE_USER, Node, write_cluster
from teto.stack.embedded import nats_server_binary
from teto.tls import make_tls
from tests.support.services import eventually

TETO = str(Path(sys.executable).parent / "teto")  # the CLI of this installation


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - loopback monitor endpoint
        return json.loads(resp.read())


@pytest.fixture
def cluster(tmp_path: Path):
    nats_dir = tmp_path / "nats"
    tls_dir = nats_dir / "tls"
    files = make_tls(tls_dir, ["127.0.0.1", "localhost"], client_auth=True)
    files.cert.replace(tls_dir / "server.pem")
    files.key.replace(tls_dir / "server-key.pem")
    write_deployment(nats_dir, prefix="clu", executors=[("executor-1", "node-1")], tls=True,
                     client_ca=str(files.ca), tls_dir=str(tls_dir), rounds=4)
    nodes = [Node(f"nats-{i}", "127.0.0.1", free_port(), free_port()) for i in (1, 2, 3)]
    write_cluster(nats_dir, nodes, tls_dir=str(tls_dir))
    procs, monitors = [], []
    try:
        for node in nodes:
            monitor = free_port()
            store = tmp_path / node.name
            procs.append(subprocess.Popen(
                [nats_server_binary(), "-c", str(nats_dir / "nodes" / f"{node.name}.conf"), "-js", "-sd", str(store),
                 "-m", str(monitor)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            monitors.append(f"http://127.0.0.1:{monitor}")
        yield nats_dir, nodes, monitors
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


async def test_the_generated_node_configs_form_a_jetstream_cluster_with_r3_streams(cluster):
    nats_dir, nodes, monitors = cluster
    for monitor in monitors:  # every node routes to the two others
        await eventually(lambda m=monitor: _get(f"{m}/routez")["num_routes"] >= 2, timeout=60.0,
                         what=f"{monitor} to route to both other members", every=0.2, ignoring=(OSError,))
    url = ",".join(f"tls://127.0.0.1:{n.client_port}" for n in nodes)
    # What bus-init runs (deploy/compose.yml): the CLI, as the NATS admin; it asks again while no leader is elected.
    env = {**os.environ, "TETO_NATS_URL": url, "TETO_SUBJECT_PREFIX": "clu",
           "TETO_NATS_CREDENTIALS_FILE": str(nats_dir / "creds" / "admin.json")}
    done = await asyncio.to_thread(subprocess.run, [TETO, "bus", "declare", "--replicas", "3", "--wait", "90"],
                                   env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    nc = await bus.connect(url, "cluster-test", credentials_file=nats_dir / "creds" / "admin.json", attempts=60)
    try:
        js = nc.jetstream(timeout=15.0)
        subjects = Subjects("clu")
        info = await js.stream_info(subjects.stream_name("CMD"))
        assert info.config.num_replicas == 3
        assert info.cluster.leader in {n.name for n in nodes}
        assert len(info.cluster.replicas) == 2
        ack = await js.publish(subjects.cmd("submit"), b"{}", timeout=15.0)
        assert ack.stream == subjects.stream_name("CMD")
    finally:
        await nc.close()
    # A part connects with its own (least-privilege) credentials over TLS too.
    nc = await bus.connect(url, "cluster-queue", credentials_file=nats_dir / "creds" / "queue.json", attempts=10)
    assert nc.is_connected
    await nc.close()


def test_routes_are_authenticated(cluster):
    nats_dir, nodes, _ = cluster
    conf = json.loads((nats_dir / "nodes" / "nats-1.conf").read_text())
    password = conf["cluster"]["authorization"]["password"]
    assert conf["cluster"]["authorization"]["user"] == ROUTE_USER
    assert all(f"{ROUTE_USER}:{password}@" in route for route in conf["cluster"]["routes"])
    assert len(conf["cluster"]["routes"]) == 2 and conf["server_name"] == "nats-1"
    assert conf["cluster"]["tls"]["ca_file"].endswith("ca.pem")
    assert (nats_dir / "nodes" / "nats-1.conf").stat().st_mode & 0o077 == 0  # it holds the route password


def test_bus_declare_asks_again_while_jetstream_is_not_ready_then_says_why(tmp_path):
    port = free_port()
    server = subprocess.Popen([nats_server_binary(), "-a", "127.0.0.1", "-p", str(port)],  # no JetStream at all
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TETO_")}
        env.update(TETO_NATS_URL=f"nats://127.0.0.1:{port}", TETO_SUBJECT_PREFIX="nojs")
        done = subprocess.run([TETO, "bus", "declare", "--wait", "2"], env=env, capture_output=True, text=True,
                              timeout=120)
    finally:
        server.terminate()
        server.wait(10)
    assert done.returncode == 3
    assert "JetStream not ready" in done.stderr and "trying again" in done.stderr
