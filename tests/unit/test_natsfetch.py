"""libs/runtime/natsfetch.py: every timeout of a pull fetch is nats-py's documented one; nothing else changes."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest
from nats.js.client import JetStreamContext

from libs.runtime import natsfetch


def _fetch(outcome):
    async def fetch(self, batch=1, timeout=5, heartbeat=None):
        if isinstance(outcome, BaseException):
            raise outcome
        return [self, batch, timeout, heartbeat]
    return fetch


def test_a_bare_asyncio_timeout_becomes_the_documented_one():
    fetch = natsfetch.documented(_fetch(asyncio.TimeoutError()))
    with pytest.raises(nats.errors.TimeoutError) as raised:
        asyncio.run(fetch("sub", 10, timeout=0.1))
    assert isinstance(raised.value.__cause__, asyncio.TimeoutError)
    assert not isinstance(raised.value.__cause__, nats.errors.TimeoutError)


def test_the_documented_timeout_passes_through_unchanged():
    original = nats.errors.TimeoutError()
    fetch = natsfetch.documented(_fetch(original))
    with pytest.raises(nats.errors.TimeoutError) as raised:
        asyncio.run(fetch("sub", 10))
    assert raised.value is original


def test_other_errors_and_results_are_untouched():
    closed = nats.errors.ConnectionClosedError()
    with pytest.raises(nats.errors.ConnectionClosedError) as raised:
        asyncio.run(natsfetch.documented(_fetch(closed))("sub"))
    assert raised.value is closed
    assert asyncio.run(natsfetch.documented(_fetch(None))("sub", 7, timeout=2, heartbeat=1)) == ["sub", 7, 2, 1]


def test_callers_that_catch_the_plain_timeout_still_catch_it():
    fetch = natsfetch.documented(_fetch(asyncio.TimeoutError()))

    async def edge_style():
        try:
            await fetch("sub")
        except asyncio.TimeoutError:
            return "caught"

    assert asyncio.run(edge_style()) == "caught"


def test_install_is_idempotent_and_undone_by_uninstall():
    before = JetStreamContext.PullSubscription.fetch
    natsfetch.uninstall()
    plain = JetStreamContext.PullSubscription.fetch
    try:
        assert not natsfetch.installed()
        assert natsfetch.install() is True
        patched = JetStreamContext.PullSubscription.fetch
        assert natsfetch.installed() and patched is not plain
        assert natsfetch.install() is False
        assert JetStreamContext.PullSubscription.fetch is patched
        natsfetch.uninstall()
        assert JetStreamContext.PullSubscription.fetch is plain
    finally:
        JetStreamContext.PullSubscription.fetch = before
