"""The submit bench's open loop (bench/bench_submit.paced) makes and connects every client before its schedule
starts: made inside it, 32 clients (an SSL context each) and their first connections took the bench's own event
loop about 0.7 s, charged to the first submits due: the whole p99 tail the loop reported (1,167 ms; 17 ms once
the clients were ready)."""

from __future__ import annotations

import asyncio

import pytest

from bench.bench_submit import paced
from tests.unit.test_bench_throughput_client import _Gateway, gateway  # noqa: F401 - the keep-alive stand-in

pytestmark = pytest.mark.unit


def test_every_client_is_connected_before_the_first_submit_is_due(gateway):  # noqa: F811
    latencies, _, statuses = asyncio.run(paced(gateway.url, "t", clients=4, rate=20.0, seconds=1.0))
    assert statuses == {201: 20} and len(latencies) == 20
    first_post = next(i for i, (method, _, _) in enumerate(_Gateway.seen) if method == "POST")
    assert [path for _, path, _ in _Gateway.seen[:first_post]] == ["/healthz"] * 4
    assert {auth for _, _, auth in _Gateway.seen} == {"Bearer t"}
    assert _Gateway.connections == 4  # the submits went over the connections opened before the schedule
