"""Which outbox rows the relay may have in flight together (``outbox_order``) and how a JetStream publish reply
reads (``jsacks.outcome_of``, ``AckPipe.settle``): pure, no bus."""

from __future__ import annotations

import asyncio

from nats.js.errors import APIError, NoStreamResponseError

from libs.runtime.jsacks import AckPipe, outcome_of
from libs.runtime.outbox_order import next_wave, order_key, waves


def test_order_key_is_what_a_subject_is_about():
    assert order_key("teto.job.j1.started") == "teto.job.j1"
    assert order_key("teto.job.j1.finished") == "teto.job.j1"  # a job's events share one key
    assert order_key("teto.lease.j1.granted") == "teto.lease.j1"
    assert order_key("teto.agent.e1.run") == order_key("teto.agent.e1.stop") == "teto.agent.e1"
    assert order_key("teto.node.n1.lost") == "teto.node.n1"
    # a command's outcome is the only message about its command
    assert order_key("teto.outcome.submit.c1") == "teto.outcome.submit.c1"
    assert order_key("teto.outcome.submit.c1") != order_key("teto.outcome.submit.c2")
    # short subjects: one key per subject
    assert order_key("teto.dead.queue") == "teto.dead.queue"
    assert order_key("x") == "x"
    assert order_key("other.outcome.k") == "other.outcome.k"  # three tokens: no command id to split off


def _s(row):
    return row


def test_a_wave_ends_before_a_key_repeats():
    rows = ["t.job.a.queued", "t.outcome.submit.c1", "t.job.b.queued", "t.job.a.granted", "t.agent.e.run"]
    wave, rest = next_wave(rows, _s)
    assert wave == rows[:3] and rest == rows[3:]
    assert waves(rows, _s) == [rows[:3], rows[3:]]


def test_waves_keep_the_id_order_and_every_row():
    rows = ["t.job.a.1", "t.job.a.2", "t.job.a.3", "t.job.b.1", "t.job.c.1", "t.job.b.2"]
    got = waves(rows, _s)
    assert got == [["t.job.a.1"], ["t.job.a.2"], ["t.job.a.3", "t.job.b.1", "t.job.c.1"], ["t.job.b.2"]]
    assert [r for w in got for r in w] == rows
    for w in got:  # no key twice in a wave
        assert len({order_key(r) for r in w}) == len(w)


def test_distinct_keys_are_one_wave_and_nothing_is_none():
    rows = [f"t.job.j{i}.queued" for i in range(500)]
    assert waves(rows, _s) == [rows]
    assert waves([], _s) == []
    assert next_wave([], _s) == ([], [])


def test_a_publish_reply_reads_as_its_ack_or_its_error():
    assert outcome_of(b'{"stream": "JOBS", "seq": 7}', None) == {"stream": "JOBS", "seq": 7}
    assert outcome_of(b'{"stream": "JOBS", "seq": 7, "duplicate": true}', None)["duplicate"] is True
    err = outcome_of(b'{"error": {"code": 400, "err_code": 10054, "description": "message size exceeds"}}', None)
    assert isinstance(err, APIError) and err.err_code == 10054
    assert isinstance(outcome_of(b"", "503"), NoStreamResponseError)
    assert isinstance(outcome_of(b"not json", None), APIError)
    assert isinstance(outcome_of(b"[1]", None), APIError)


class _JS:
    _nc = None


async def test_settle_says_for_each_publish_acked_refused_or_timed_out():
    pipe = AckPipe(_JS())  # settle touches no connection
    loop = asyncio.get_running_loop()
    acked, refused, silent = loop.create_future(), loop.create_future(), loop.create_future()
    acked.set_result({"seq": 1})
    refused.set_exception(NoStreamResponseError())
    got = await pipe.settle([acked, refused, silent], timeout=0.05)
    assert got[0] is None
    assert isinstance(got[1], NoStreamResponseError)
    assert isinstance(got[2], asyncio.TimeoutError)
    assert silent.cancelled()  # given up on: a late acknowledgement finds nothing waiting
    assert await pipe.settle([], timeout=0.05) == []
