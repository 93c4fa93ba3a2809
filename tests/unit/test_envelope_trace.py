"""A decoded message keeps the trace context it arrived with beside its fields (libs/contracts/envelope.py), at no
cost to the messages that carry none: a slot, not a pydantic private attribute initialised on every instance."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

from libs.contracts.envelope import Envelope
from libs.contracts.telemetry import Heartbeat
from libs.contracts.usage import UsageReport
from libs.runtime import tracing

REPORT = (b'{"executor_id":"ex1","node_id":"n1","records":[{"job_id":"j1","epoch":1,"seq":1,"devices":1,'
          b'"wall_seconds":30.0}]}')
PARENT = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


def test_no_message_type_initialises_private_attributes_per_instance():
    # pydantic calls init_private_attributes for every instance of a model that declares any.
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    offenders = [c.__name__ for c in [Envelope, *subclasses(Envelope)] if c.__private_attributes__]
    assert offenders == []


def test_a_message_without_trace_reports_an_empty_one_never_shared():
    a, b = UsageReport.decode(REPORT), UsageReport.decode(REPORT)
    assert a.received_trace == {} and tracing.of(a) == {}
    a.received_trace["x"] = "y"  # a caller scribbling on the empty answer changes nothing
    assert a.received_trace == {} and b.received_trace == {}


def test_the_noted_trace_is_kept_copied_and_not_part_of_the_contract():
    report = UsageReport.decode(REPORT)
    headers = dict(PARENT)
    tracing.arrived(report, headers)
    headers["traceparent"] = "changed"  # the message keeps its own copy
    assert report.received_trace == PARENT and tracing.of(report) == PARENT
    assert report == UsageReport.decode(report.encode())  # equal by fields: how it travelled is not compared
    assert "received_trace" not in report.encode().decode() and "_received_trace" not in report.model_dump()
    for copied in (report.model_copy(), report.model_copy(update={"node_id": "n2"}), copy.copy(report),
                   copy.deepcopy(report)):
        assert copied.received_trace == PARENT
    assert report.model_copy(update={"node_id": "n2"}).node_id == "n2"


def test_a_message_without_traceparent_header_is_left_alone():
    beat = Heartbeat(executor_id="ex1", node_id="n1", group="g", sent_at=datetime.now(UTC), interval_seconds=30,
                     progress_interval_seconds=30)
    tracing.arrived(beat, {"Nats-Msg-Id": "x"})
    assert beat.received_trace == {}
