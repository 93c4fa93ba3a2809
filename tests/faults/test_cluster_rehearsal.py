"""The clustered rehearsal (issue 13, "Proof"): ``teto up --nats-cluster 3 --replicas 2`` as a user runs it,
then, while jobs run, SIGKILL of one NATS member and then of one replica of each service, one after another.

Each fault is a round of tests/faults/rounds.py (background jobs running, the fault, a probe job submitted
during it, every invariant of tests/faults/invariants.py waited for: every job ends, no accepted command lost,
no job in two places, the ledger equals the usage sent, the audit chain verifies, no consumer redelivering).
On top of the matrix's figures each row has the cluster's own view of the loss and the recovery: for the NATS
member, when a stream first showed it lost and when every stream was back at R3 with all three members current
(``lost_seen_s``, ``restored_s``); for a replica, when teto up's supervisor had it running again
(``replaced_s``). ``teto status`` (``GET /v1/status``) is asked too, every half second from the kill: it must
answer while the member is lost and name it among its problems (``status_lost_s``), then no more
(``status_restored_s``); and list a killed replica again, as a new process, with every singleton of its service
held once. Figures go to ``$TETO_CLUSTER_REPORT`` (default /tmp/teto-cluster-report.json) for
docs/reliability.md. About 4 minutes on 2 shared cores, most of it starting 16 processes.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.invariants import durable_consumers
from tests.faults.rounds import round_of, stack_place, write_report
from tests.support.clusterstack import EXECUTORS, MEMBERS, REPLICAS, ClusterStack, behind
from tests.support.faultstack import SERVICES
from tests.support.services import eventually

pytestmark = pytest.mark.faults


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterStack]:
    with stack_place("cluster") as root:
        stack = ClusterStack(root)
        try:
            stack.start()
            yield stack
        finally:
            stack.close()


@pytest.fixture(scope="module")
def matrix() -> Iterator[list[dict[str, Any]]]:
    rows: list[dict[str, Any]] = []
    yield rows
    write_report(rows, Path(os.environ.get("TETO_CLUSTER_REPORT", "/tmp/teto-cluster-report.json")),
                 "clustered rehearsal")


async def test_the_topology_is_three_members_and_two_of_each_service(cluster: ClusterStack):
    names = [row["name"] for row in cluster.processes()]
    assert sorted(n for n in names if n.startswith("nats-")) == [f"nats-node-{i}" for i in range(1, MEMBERS + 1)]
    for service in SERVICES:
        assert sorted(n for n in names if n.rsplit("-", 1)[0] == service) == \
            [f"{service}-{i}" for i in range(1, REPLICAS + 1)], names
    assert len(cluster.executor_ids()) == EXECUTORS
    assert cluster.info["stream_replicas"] == MEMBERS and len(cluster.nats_url.split(",")) == MEMBERS
    nc = await cluster.bus()
    try:
        views = await cluster.views(nc.jetstream(timeout=10))
    finally:
        await nc.close()
    assert views and not behind(views, {f"node-{i}" for i in range(1, MEMBERS + 1)}, MEMBERS), views
    # Durable consumers are shared by the replicas: one of each, itself replicated on every member.
    durables = await durable_consumers(cluster)
    assert durables and all(c.members == MEMBERS for c in durables), durables
    assert len({(c.stream, c.durable) for c in durables}) == len(durables)
    # Each gateway replica answers alone, with the same view (stateless: either one serves the API).
    seen = [sorted(e["executor_id"] for e in (await cluster.get_from(url, "/v1/executors")).json())
            for url in cluster.gateway_urls]
    assert seen[0] and all(s == seen[0] for s in seen), seen
    # teto status through each gateway: OK, with the three members online (each by its name and URL).
    for url in cluster.gateway_urls:
        status = await eventually(lambda url=url: _ok_status(cluster, url), 60, f"teto status OK through {url}",
                                  every=0.5)
        members = {m["name"]: m for m in status["nats"]["members"]}
        assert sorted(members) == [f"node-{i}" for i in range(1, MEMBERS + 1)], members
        assert all(m["online"] and m["url"] in cluster.nats_url for m in members.values()), members


async def _ok_status(cluster: ClusterStack, url: str) -> dict[str, Any] | None:
    r = await cluster.get_from(url, "/v1/status")
    return r.json() if r.status_code == 200 and r.json()["ok"] else None


async def test_baseline_a_probe_job_on_the_healthy_cluster(cluster: ClusterStack, matrix):
    t0 = time.monotonic()
    job = await cluster.submit(cluster.spec("baseline", steps=20))
    done = await cluster.wait_done(job, timeout=120)
    matrix.append({"fault": "none (baseline)", "passed": done["state"] == "succeeded",
                   "baseline_s": time.monotonic() - t0})
    assert done["state"] == "succeeded", done


async def test_sigkill_of_the_nats_member_leading_the_command_stream(cluster: ClusterStack, matrix):
    member = await cluster.stream_leader("TETO_CMD")  # every submit goes through its leader
    watch: dict[str, asyncio.Task] = {}

    async def inject():
        observer = await cluster.observer(avoid=member)
        killed_at = cluster.kill(f"nats-{member}")
        watch["task"] = asyncio.create_task(cluster.watch(observer, member, killed_at))
        watch["status"] = asyncio.create_task(cluster.status_sees(member, killed_at))
        return None

    row = await round_of(cluster, matrix, f"SIGKILL NATS {member}", inject, timeout=180)
    seen = await watch["task"]
    # teto status (GET /v1/status) showed the member's loss while it lasted, then the streams whole again; every
    # answer came back (each part it asks has its own timeout: a dead member is a problem, not a failure).
    status = await watch["status"]
    row.update(status_lost_s=status.lost_s, status_restored_s=status.restored_s, status_ok_s=status.ok_s,
               status_loss_problems=status.loss_problems, status_slowest_s=status.slowest_s,
               status_unanswered=status.unanswered, lost_seen_s=seen.lost_s, restored_s=seen.restored_s,
               worst=seen.worst)
    assert status.lost_s is not None and status.restored_s is not None, status
    assert status.named, f"teto status never named {member} among its problems: {status}"
    assert seen.lost_s is not None and seen.restored_s is not None, seen
    assert seen.showed_member, f"the loss of {member} never showed: {seen}"


@pytest.mark.parametrize("service", SERVICES)
async def test_sigkill_of_one_replica_of_each_service(cluster: ClusterStack, matrix, service):
    before = cluster.leader_lines(service)
    name = max(before, key=lambda n: (before[n], n.endswith("-1")))  # the one holding singletons, if any
    replaced: dict[str, Any] = {}
    other = next(n for n in before if n != name)

    async def inject():
        killed_at = cluster.kill(name)
        replaced["task"] = asyncio.create_task(cluster.replaced(name))
        replaced["t0"] = killed_at
        return None

    wall = time.time()
    row = await round_of(cluster, matrix, f"SIGKILL {name}", inject, timeout=180)
    row["replaced_s"] = await replaced["task"] - replaced["t0"]
    # teto status (GET /v1/status) lists both replicas again, the killed one as a new process, and no problem
    # of this service (every singleton held by exactly one replica).
    status = await _status_recovered(cluster, service, name, wall)
    row["status_replicas"] = [r["instance"] for r in status["services"][service]["replicas"]]
    if before[name]:
        # Its singleton loops (outbox relay, lease scanner, ...) were taken over: a replica took the locks again.
        await eventually(lambda: sum(cluster.leader_lines(service).values()) > sum(before.values()), 30,
                         f"{service}'s singleton loops taken over")
        row["took_over"] = other if cluster.leader_lines(service)[other] > before[other] else name
    if service == "gateway":
        # Stateless: a job accepted through either replica is read through the other alone.
        url = cluster.gateway_urls[int(other.rsplit("-", 1)[1]) - 1]
        r = await cluster.get_from(url, f"/v1/jobs/{cluster.accepted[0].job_id}")
        assert r.status_code == 200 and r.json()["state"] == "succeeded", r.text


async def _status_recovered(cluster: ClusterStack, service: str, name: str, killed_wall: float,
                            timeout: float = 90) -> dict[str, Any]:
    """``GET /v1/status`` until ``service`` shows its replicas again with ``name`` started after the kill and no
    problem of its own; the status then."""
    from datetime import datetime

    last: dict[str, Any] = {}

    async def recovered() -> dict[str, Any] | None:
        st = last["status"] = await cluster.status()
        if st is None:
            return None
        view = st["services"].get(service) or {}
        replicas = {r["instance"]: r for r in view.get("replicas", [])}
        fresh = name in replicas and datetime.fromisoformat(replicas[name]["started_at"]).timestamp() > killed_wall
        ok = fresh and len(replicas) == REPLICAS and not any(p.startswith(f"{service}:") for p in st["problems"])
        return st if ok else None

    return await eventually(recovered, timeout, lambda: f"teto status to show {name} back among {service}'s "
                            f"replicas (last status: {last.get('status')})", every=0.5)
