"""Ports for a local stack (libs/runtime/ports.py, teto/stack/up.py, teto/stack/supervisor.py).

A clean CI run once lost the clustered rehearsal to a port clash: its harness took ``--http-port`` from the
kernel's ephemeral range, the second gateway replica listens on the port after it, and another stack's process
had been handed that one; the replica exited with uvicorn's start-up failure (3) until given up, and nothing
said why."""

from __future__ import annotations

import socket

from libs.runtime.ports import _ephemeral_range, free_port, free_port_block, port_is_free
from teto.stack.supervisor import last_line
from teto.stack.up import UpOptions, up


def _listen(port: int) -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_a_listening_port_is_not_free_and_a_closed_one_is():
    s = _listen(0)
    port = s.getsockname()[1]
    assert not port_is_free(port)
    s.close()
    assert port_is_free(port)


def test_a_block_is_consecutive_free_ports_below_the_ephemeral_range():
    low, _ = _ephemeral_range()
    for _ in range(20):
        first = free_port_block(3)
        assert first + 3 <= low  # the kernel never hands these out to a bind on port 0
        assert all(port_is_free(first + i) for i in range(3))


def test_every_server_port_and_the_agents_collective_port_are_below_the_ephemeral_range():
    """NATS, PostgreSQL and /metrics (free_port) and a check collective's rank 0 (reach.free_port, on every
    address): an ephemeral port could be handed to an outgoing connection before its server binds it."""
    from agents.executor.checks import reach

    low, _ = _ephemeral_range()
    for pick, host in ((free_port, "127.0.0.1"), (reach.free_port, "0.0.0.0")):
        ports = [pick() for _ in range(20)]
        assert all(1024 <= p < low and port_is_free(p, host) for p in ports), ports


def test_a_port_held_on_any_address_is_not_offered_for_every_address():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert not port_is_free(port, "0.0.0.0") and not port_is_free(port)


def test_the_ephemeral_range_is_read_from_the_kernel():
    low, high = _ephemeral_range()
    assert 1024 < low < high <= 65535


def test_teto_up_refuses_a_busy_gateway_port_before_starting_anything(tmp_path, capsys):
    first = free_port_block(2)
    with _listen(first + 1):  # the second replica's port
        assert up(UpOptions(data_dir=tmp_path / "stack", http_port=first, nats_cluster=3, replicas=2)) == 2
    err = capsys.readouterr().err
    assert f"port {first + 1} is in use" in err and "other replicas" in err
    assert not (tmp_path / "stack").exists()


def test_a_single_gateway_busy_port_is_named_without_replicas(tmp_path, capsys):
    first = free_port_block(1)
    with _listen(first):
        assert up(UpOptions(data_dir=tmp_path / "stack", http_port=first)) == 2
    err = capsys.readouterr().err
    assert f"port {first} is in use" in err and "replicas" not in err


def test_the_supervisor_names_the_last_line_of_an_exited_parts_log(tmp_path):
    log = tmp_path / "gateway-2.log"
    log.write_text("starting\nERROR: [Errno 98] address already in use\n\n")
    assert last_line(log) == "ERROR: [Errno 98] address already in use"
    assert last_line(tmp_path / "missing.log") == "-"
    (tmp_path / "empty.log").write_text("")
    assert last_line(tmp_path / "empty.log") == "-"


def test_last_line_reads_only_the_end_of_a_long_log(tmp_path):
    log = tmp_path / "big.log"
    log.write_text("x" * 100_000 + "\nthe end\n")
    assert last_line(log) == "the end"


def test_cluster_members_get_distinct_consecutive_ports_outside_the_ephemeral_range():
    from teto.stack.cluster import plan_members

    low, _ = _ephemeral_range()
    members = plan_members(5)
    ports = [p for m in members for p in (m.port, m.monitor_port, m.cluster_port)]
    assert len(set(ports)) == 15 and max(ports) < low
    assert [m.name for m in members] == [f"node-{i}" for i in range(1, 6)]
    assert all(m.monitor_port == m.port + 1 and m.cluster_port == m.port + 2 for m in members)
