"""The edge reads a message's delivery count from its ack subject (libs/runtime/acksubject.py) without
nats-py's whole ``metadata``; it must give what ``metadata.num_delivered`` gives for every subject form, and 1
for a message that is not JetStream's; the stream sequence (the audit's name for a message without a command id)
likewise."""

from __future__ import annotations

import pytest
from nats.aio.msg import Msg

from libs.runtime.acksubject import stream_seq
from libs.runtime.acksubject import deliveries as _deliveries

V1 = "$JS.ACK.BENCH_HB.health-heartbeats.{d}.1204.1187.1764590000000000000.42"
V2 = "$JS.ACK._.ACCHASH.BENCH_HB.health-heartbeats.{d}.1204.1187.1764590000000000000.42.rand"
V2_DOMAIN = "$JS.ACK.hub.ACCHASH.BENCH_HB.health-heartbeats.{d}.1204.1187.1764590000000000000.42"


def msg(reply: str) -> Msg:
    return Msg(_client=None, subject="teto.hb.x", reply=reply, data=b"{}")  # type: ignore[arg-type]


@pytest.mark.parametrize("form", [V1, V2, V2_DOMAIN])
@pytest.mark.parametrize("delivered", [1, 2, 7, 120])
def test_the_count_is_the_one_nats_py_reads(form, delivered):
    m = msg(form.format(d=delivered))
    assert _deliveries(m) == m.metadata.num_delivered == delivered


@pytest.mark.parametrize("reply", ["", "_INBOX.abc.def", "$JS.ACK.too.short", "$JS.ACK.a.b.c.d.e.f.g.h",
                                   "$JS.NAK.BENCH_HB.c.3.1.1.1.1", "$JS.ACK.S.c.many.1.1.1.1"])
def test_a_message_that_is_not_jetstreams_counts_as_delivered_once(reply):
    assert _deliveries(msg(reply)) == 1


@pytest.mark.parametrize("form", [V1, V2, V2_DOMAIN])
def test_the_stream_sequence_is_read_from_the_ack_subject_as_metadata_reads_it(form):
    m = msg(form.format(d=3))
    assert stream_seq(m) == m.metadata.sequence.stream == 1204


def test_a_message_not_delivered_by_jetstream_has_no_stream_sequence():
    assert stream_seq(msg("_INBOX.x")) is None and stream_seq(msg(None)) is None
