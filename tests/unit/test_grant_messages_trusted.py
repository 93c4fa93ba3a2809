"""A placement pass's grant messages are made without validating them again (``Envelope.trusted``): they must be
the very messages the validating constructors make, byte for byte on the wire, for a single job and a gang, and
``trusted`` refuses an unknown or a missing field instead of making a half message. Message ids stay version-4
UUIDs' hex (``new_id``, made without the UUID object)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from libs.contracts.agents import RunJob
from libs.contracts.envelope import Envelope, new_id
from libs.contracts.jobs import JobEvent, JobEventKind, JobSpec
from libs.contracts.leases import LeaseEvent
from libs.contracts.subjects import Subjects
from services.queue import store
from services.queue.domain.lifecycle import Granted, Transition, decide
from services.queue.effects import messages_for
from services.queue.settings import QueueSettings
from tests.support import builders

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SETTINGS = QueueSettings.from_env(env={}, nats_url="nats://x", database_url="postgresql://x")


def _granted(workers: int) -> Transition:
    names = tuple(f"ex-{i}" for i in range(workers))
    fact = (Granted(names, 3, T0 + timedelta(seconds=60)) if workers == 1 else
            Granted(names, 3, T0 + timedelta(seconds=60), rendezvous="10.0.0.1:29500",
                    ready_deadline=T0 + timedelta(seconds=120)))
    spec = builders.command_spec(env={"A": "1"}, workers=workers, gpus_per_worker=2, gpu_ceiling_seconds=3600,
                                  priority=3)
    t = decide(builders.job(id="j-1", epoch=2, at=T0, spec=spec, org="acme", priority=3), fact, T0)
    assert isinstance(t, Transition)
    return t


def _same(trusted: Envelope, checked: Envelope) -> None:
    """The same message: type, fields and wire bytes (id and time are each message's own), and valid."""
    assert type(trusted) is type(checked)
    aligned = trusted.model_copy(update={"id": checked.id, "time": checked.time})
    assert aligned == checked and aligned.encode() == checked.encode()
    assert type(trusted).decode(trusted.encode()) == trusted  # what the wire carries passes validation


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_a_grants_messages_made_trusted_are_those_the_constructors_make(workers: int) -> None:
    t = _granted(workers)
    for remaining in (None, 0.0, 1234.5):
        fast = messages_for(t.job, t, SETTINGS, remaining, trusted=True)
        slow = messages_for(t.job, t, SETTINGS, remaining)
        assert [s for s, _ in fast] == [s for s, _ in slow] and len(fast) == workers + 1
        assert {type(m) for _, m in fast} == {RunJob, LeaseEvent}
        for (_, a), (_, b) in zip(fast, slow, strict=True):
            _same(a, b)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_grants_events_staged_trusted_are_those_the_constructor_makes(workers: int) -> None:
    t = _granted(workers)
    subjects = Subjects("teto")
    fast, slow = store.stage(subjects, t, T0, trusted=True), store.stage(subjects, t, T0)
    assert fast.job == slow.job and [e.event for e in fast.events] == [JobEventKind.LEASED]
    for a, b in zip(fast.events, slow.events, strict=True):
        assert isinstance(a, JobEvent)
        _same(a, b)


def test_trusted_takes_defaults_and_refuses_an_unknown_or_missing_field() -> None:
    event = LeaseEvent.trusted(job_id="j-1", epoch=1, executor_id="ex-0", event="granted")
    assert event.schema_ == LeaseEvent.SCHEMA and event.expires_at is None and len(event.id) == 32
    assert event.received_trace == {} and event.time.tzinfo is not None
    assert LeaseEvent.trusted(job_id="j-1", epoch=1, executor_id="ex-0", event="granted").id != event.id
    with pytest.raises(TypeError, match="unknown"):
        LeaseEvent.trusted(job_id="j-1", epoch=1, executor_id="ex-0", event="granted", colour="red")
    with pytest.raises(TypeError, match="missing"):
        LeaseEvent.trusted(job_id="j-1", epoch=1, event="granted")


def test_new_ids_are_version_4_uuids_hex_and_distinct() -> None:
    ids = [new_id() for _ in range(5000)]
    assert len(set(ids)) == len(ids)
    for value in ids:
        parsed = uuid.UUID(hex=value)
        assert parsed.hex == value and parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_trusted_lays_out_every_field_in_order_whatever_order_the_values_come_in() -> None:
    given = dict(reason="r", expires_at=T0, event="granted", executor_id="ex-0", epoch=1, job_id="j-1")
    event = LeaseEvent.trusted(**given)
    assert list(event.__dict__) == list(LeaseEvent.model_fields)
    assert event.model_fields_set == set(given) and event.reason == "r" and event.expires_at == T0
    assert LeaseEvent.trusted(**given).__dict__ is not event.__dict__  # each message its own values


@pytest.mark.parametrize("workers", [1, 2])
def test_encode_is_the_json_dump_of_every_message_byte_for_byte(workers: int) -> None:
    """``encode`` goes to the serializer straight to bytes: the bytes ``model_dump_json(by_alias=True)`` gave,
    for validated and trusted messages, with text outside ASCII, a spec and a missing remaining ceiling."""
    t = _granted(workers)
    spec = JobSpec(workload={"kind": "command", "command": ["echo", "é ✓ \u2028 \"q\""], "env": {"A": "ü"}},
                   name="naïve")
    run = RunJob(job_id="j-1", epoch=1, executor_id="ex-0", spec=spec, attempt=1, lease_seconds=60,
                 heartbeat_seconds=10)
    messages = [m for _, m in messages_for(t.job, t, SETTINGS, None, trusted=True)]
    messages += [e for e in store.stage(Subjects("teto"), t, T0, trusted=True).events]
    messages += [m for _, m in messages_for(t.job, t, SETTINGS, 12.5)] + [run]
    for message in messages:
        assert message.encode() == message.model_dump_json(by_alias=True).encode()
        assert type(message).decode(message.encode()) == message


@pytest.mark.parametrize("workers", [1, 2])
def test_every_grant_carries_the_checkpoint_quota_the_pass_resolved(workers: int) -> None:
    t = _granted(workers)
    for quota in (None, 1, 2**30):
        fast = messages_for(t.job, t, SETTINGS, trusted=True, checkpoint_quota=quota)
        slow = messages_for(t.job, t, SETTINGS, checkpoint_quota=quota)
        runs = [m for _, m in fast if isinstance(m, RunJob)]
        assert len(runs) == workers and {r.checkpoint_quota_bytes for r in runs} == {quota}
        for a, b in zip(fast, slow, strict=True):
            _same(a[1], b[1])
