"""The clustered rehearsal's rules (teto/stack/cluster.py): which topologies ``teto up`` accepts, the stream
replicas a cluster gets, the names and ports of service replicas, each member's cluster config, the members'
configs written by LocalBus, and how the rehearsal reads JetStream's view of a stream's replicas."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from types import SimpleNamespace

import pytest

from libs.runtime.settings import CommonSettings, SettingsError
from teto.stack import cluster
from teto.stack.busauth import LocalBus
from teto.stack.up import UpOptions, up
from tests.support.clusterstack import StreamView, behind, stream_view


@pytest.mark.parametrize("members", [1, 3, 5, 7])
def test_one_server_or_three_and_more_members_are_accepted(members):
    cluster.check_topology(members, 2)


def test_two_members_are_refused_because_they_survive_no_loss():
    with pytest.raises(cluster.TopologyError, match="survives no loss"):
        cluster.check_topology(2, 2)


@pytest.mark.parametrize(("members", "replicas"), [(0, 1), (8, 1), (3, 0), (3, 6)], ids=str)
def test_topologies_out_of_bounds_are_refused(members, replicas):
    with pytest.raises(cluster.TopologyError):
        cluster.check_topology(members, replicas)


@pytest.mark.parametrize(("members", "expected"), [(1, 1), (3, 3), (5, 3), (7, 3)])
def test_streams_are_r3_from_three_members_and_r1_on_one_server(members, expected):
    assert cluster.stream_replicas(members) == expected


def test_one_replica_keeps_the_plain_name_and_several_are_numbered():
    assert cluster.replica_names("queue", 1) == ["queue"]
    assert cluster.replica_names("queue", 2) == ["queue-1", "queue-2"]


def test_gateway_replicas_listen_on_consecutive_ports():
    assert cluster.gateway_ports(8080, 1) == [8080]
    assert cluster.gateway_ports(8080, 3) == [8080, 8081, 8082]


MEMBERS = [cluster.Member(f"node-{i}", 4000 + i, 5000 + i, 6000 + i) for i in (1, 2, 3)]


def test_a_member_routes_to_every_other_member_with_the_route_user_and_not_to_itself():
    config = cluster.member_config(MEMBERS[1], MEMBERS, "s3cret")
    assert config["server_name"] == "node-2"
    block = config["cluster"]
    assert block["listen"] == "127.0.0.1:6002"
    assert block["authorization"]["user"] == cluster.ROUTE_USER and block["authorization"]["password"] == "s3cret"
    assert block["routes"] == [f"nats-route://{cluster.ROUTE_USER}:s3cret@127.0.0.1:{p}" for p in (6001, 6003)]


def test_members_do_not_gossip_cluster_urls_to_clients():
    # Clients get every URL from TETO_NATS_URL; an INFO reaching a client mid-connect can wedge nats-py 2.16.
    assert cluster.member_config(MEMBERS[0], MEMBERS, "pw")["cluster"]["no_advertise"] is True


def test_the_cluster_url_lists_every_member():
    assert cluster.NatsCluster.url.fget(SimpleNamespace(members=MEMBERS)) == \
        "nats://127.0.0.1:4001,nats://127.0.0.1:4002,nats://127.0.0.1:4003"


def test_local_bus_writes_each_member_the_same_users_and_its_own_cluster_block(tmp_path):
    bus_auth = LocalBus(tmp_path / "nats", "teto")
    bus_auth.node_configs = {m.name: cluster.member_config(m, MEMBERS, "pw") for m in MEMBERS}
    bus_auth.write()
    single = json.loads(bus_auth.config_path.read_text())
    for m in MEMBERS:
        path = bus_auth.node_config_path(m.name)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        config = json.loads(path.read_text())
        assert config["authorization"] == single["authorization"]
        assert config["server_name"] == m.name and config["cluster"]["name"] == cluster.CLUSTER_NAME
    # A new executor's user reaches every member's config too.
    bus_auth.executor_env("local-1-abcdef", [])
    users = {u["user"] for u in json.loads(bus_auth.node_config_path("node-3").read_text())["authorization"]["users"]}
    assert "executor-local-1-abcdef" in users


def test_reload_skips_members_that_are_down_or_gone(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    bus_auth = LocalBus(tmp_path / "nats", "teto")
    bus_auth.members = lambda: [(None, "http://127.0.0.1:9"), (gone.pid, "http://127.0.0.1:9")]
    bus_auth.reload(timeout=1)  # nothing to signal, nothing to wait for: returns at once


def test_stream_replicas_is_a_bounded_setting_defaulting_to_one():
    assert CommonSettings.from_env(env={}).stream_replicas == 1
    assert CommonSettings.from_env(env={"TETO_STREAM_REPLICAS": "3"}).stream_replicas == 3
    for bad in ("0", "6"):
        with pytest.raises(SettingsError, match="stream_replicas"):
            CommonSettings.from_env(env={"TETO_STREAM_REPLICAS": bad})


def test_teto_up_refuses_a_two_member_cluster_before_starting_anything(tmp_path, capsys):
    assert up(UpOptions(data_dir=tmp_path / "stack", nats_cluster=2, replicas=2)) == 2
    assert "survives no loss" in capsys.readouterr().err
    assert not (tmp_path / "stack").exists()


def test_teto_up_refuses_a_cluster_with_an_external_nats(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TETO_NATS_URL", "nats://elsewhere:4222")
    assert up(UpOptions(data_dir=tmp_path / "stack", nats_cluster=3)) == 2
    assert "TETO_STREAM_REPLICAS" in capsys.readouterr().err


# -- the rehearsal's reading of JetStream's stream info (tests/support/clusterstack.py) ----------------------

def _info(leader, *peers):
    replicas = [SimpleNamespace(name=n, current=c, offline=o) for n, c, o in peers]
    return SimpleNamespace(config=SimpleNamespace(name="TETO_CMD"),
                           cluster=SimpleNamespace(leader=leader, replicas=replicas))


NODES = {"node-1", "node-2", "node-3"}


def test_a_stream_at_full_strength_shows_nothing_behind():
    view = stream_view(_info("node-1", ("node-2", True, None), ("node-3", True, None)))
    assert view == StreamView("TETO_CMD", "node-1", {"node-1": True, "node-2": True, "node-3": True})
    assert behind([view], NODES, 3) == {}


def test_an_offline_member_is_behind_even_if_it_was_current():
    view = stream_view(_info("node-1", ("node-2", True, None), ("node-3", True, True)))
    assert behind([view], NODES, 3) == {"TETO_CMD": ["node-3 not current", "2 of 3 current"]}


def test_a_stream_without_a_leader_is_behind():
    view = stream_view(_info(None, ("node-2", True, None), ("node-3", True, None)))
    assert behind([view], NODES, 3) == {"TETO_CMD": ["no leader", "2 of 3 current"]}


def test_a_missing_replica_counts_as_behind():
    view = stream_view(_info("node-1", ("node-2", True, None)))
    assert behind([view], NODES, 3) == {"TETO_CMD": ["2 of 3 current"]}
