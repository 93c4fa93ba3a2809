"""The gateway's body limit (services/gateway/domain/payload.py): any body it accepts makes messages that fit
the bus. Checked with the real contract classes and the queue's own ``submit`` rule (which builds the
``submitted`` event), for bodies of exactly the limit shaped every way a spec can grow."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libs.contracts.agents import RunJob
from libs.contracts.commands import SubmitJob
from libs.contracts.jobs import JobEvent, JobSpec
from services.gateway.domain.payload import HEADER_ALLOWANCE, body_limit, growth_bytes, messages_of_submit
from services.queue.domain import lifecycle
from services.queue.domain.facts import Submitted

pytestmark = pytest.mark.unit

MIB = 1 << 20
NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
WIDE = "\U0001F600"


def _compact(value: dict) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _fill(template: dict, size: int, put) -> bytes:
    """The template with its free-form part grown until the body is exactly ``size`` bytes."""
    lo, hi = 0, size
    while lo < hi:  # the largest filler that fits
        mid = (lo + hi + 1) // 2
        if len(_compact(put(template, mid))) <= size:
            lo = mid
        else:
            hi = mid - 1
    body = _compact(put(template, lo))
    return body + b" " * (size - len(body))  # whitespace pads it to the byte: JSON allows it


def _chunks(text: str, size: int = 131072) -> list[str]:
    """argv elements are bounded (the kernel's MAX_ARG_STRLEN): long content spreads over several."""
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def _long_arguments(t: dict, n: int) -> dict:
    return {**t, "workload": {"kind": "command", "command": ["python", *_chunks("x" * n)]}}


def _many_arguments(t: dict, n: int) -> dict:
    count = min(n // 3, 99_000)  # as many short elements as the contract allows
    each = "x" * max(0, n // max(count, 1) - 3)
    return {**t, "workload": {"kind": "command", "command": ["python", *[each] * count]}}


def _many_env(t: dict, n: int) -> dict:
    count = min(n // 8, 10_000)
    each = "x" * max(0, n // max(count, 1) - 12)
    return {**t, "workload": {"kind": "command", "command": ["p"], "env": {f"V{i}": each for i in range(count)}}}


def _wide_chars(t: dict, n: int) -> dict:
    return {**t, "workload": {"kind": "command", "command": ["p", *_chunks(WIDE * (n // 4), 30000)]}}


def _escaped(t: dict, n: int) -> dict:
    return {**t, "workload": {"kind": "command", "command": ["p", *_chunks("\x01\"\\" * (n // 12), 30000)]}}


SHAPES = [_long_arguments, _many_arguments, _many_env, _wide_chars, _escaped]
WIDEST = {"name": WIDE * 200, "workers": 256, "gpus_per_worker": 64, "gpu_ceiling_seconds": 2.2250738585072014e-308,
          "max_attempts": 100, "checkpoint_every_steps": 10_000_000, "estimated_step_seconds": 1e-300,
          "ready_timeout_seconds": 1e-300}


def _messages_fit(body: bytes, max_payload: int) -> int:
    spec = JobSpec.model_validate(json.loads(body))
    actor, job_id = WIDE * 200, "J" * 128
    submit = SubmitJob(actor=actor, job_id=job_id, command_id="C" * 128, spec=spec)
    # The queue's own rule makes the submitted event; the store numbers it (services/queue/store.py).
    transition = lifecycle.submit(Submitted(job_id=job_id, name=spec.name, owner=actor, spec=spec), NOW)
    (draft,) = transition.events
    event = JobEvent(job_id=job_id, seq=2**31 - 1, event=draft.event, state=draft.state, detail=draft.detail)
    grant = RunJob(job_id=job_id, epoch=2**31 - 1, executor_id="E" * 128, spec=spec, attempt=2**31 - 1,
                   lease_seconds=180, heartbeat_seconds=30, rank=255, world_size=256, rendezvous="h" * 255)
    largest = max(len(m.encode()) for m in (submit, event, grant))
    assert largest + HEADER_ALLOWANCE <= max_payload, (largest, max_payload)
    return largest


@pytest.mark.parametrize("max_payload", [MIB, 64 * 1024], ids=["1MiB", "64KiB"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("fixed", [{}, WIDEST], ids=["defaults", "widest-fields"])
def test_the_largest_body_accepted_makes_messages_that_fit_the_bus(max_payload, shape, fixed):
    limit = body_limit(max_payload, 64 * MIB)
    body = _fill(fixed, limit, shape)
    assert len(body) == limit
    _messages_fit(body, max_payload)


def test_the_limit_is_tight_the_margin_is_the_envelope_not_a_guess():
    body = _fill(WIDEST, body_limit(MIB, 64 * MIB), _long_arguments)
    largest = _messages_fit(body, MIB)
    assert MIB - largest < HEADER_ALLOWANCE + growth_bytes() // 2, largest


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(argv=st.lists(st.text(min_size=1).filter(lambda s: "\x00" not in s and s.strip()), min_size=1, max_size=8),
       env=st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True),
                           st.text().filter(lambda s: "\x00" not in s), max_size=8),
       name=st.text(max_size=200).filter(lambda s: not any(ord(c) < 32 or 127 <= ord(c) <= 159 for c in s)))
def test_any_valid_spec_grows_by_no_more_than_the_allowance(argv, env, name):
    spec = {"name": name, "workload": {"kind": "command", "command": argv, "env": env}}
    body = json.dumps(spec, ensure_ascii=False, separators=(",", ":")).encode()
    parsed = JobSpec.model_validate(json.loads(body))
    messages = messages_of_submit(parsed, actor=WIDE * 200, job_id="J" * 128, command_id="C" * 128)
    assert max(len(m.encode()) for m in messages) <= len(body) + growth_bytes()


def test_the_configured_limit_wins_when_it_is_smaller():
    assert body_limit(MIB, 4096) == 4096
    assert body_limit(MIB, MIB) == MIB - HEADER_ALLOWANCE - growth_bytes()
