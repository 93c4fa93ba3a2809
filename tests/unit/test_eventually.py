"""The one wait helper (tests/support/services.py ``eventually`` / ``eventually_blocking``): the first truthy value
is returned, a timeout names what was awaited and the last value, errors count as "not yet" only when named."""

from __future__ import annotations

import itertools

import pytest

from tests.support.services import eventually, eventually_blocking

pytestmark = pytest.mark.unit


def counting(truthy_from: int, fail_before: int = 0, error: type[Exception] = OSError):
    """A check returning 0, 1, 2, ... (truthy from ``truthy_from``), raising ``error`` on its first calls."""
    calls = itertools.count()

    def check() -> int:
        n = next(calls)
        if n < fail_before:
            raise error(f"call {n}")
        return n if n >= truthy_from else 0
    return check


async def test_the_first_truthy_value_is_returned_plain_or_awaited():
    assert await eventually(counting(3), every=0) == 3

    async def later() -> str:
        return "ready"
    assert await eventually(later) == "ready"
    assert eventually_blocking(counting(2), every=0) == 2


async def test_a_timeout_names_what_was_awaited_and_the_last_value():
    with pytest.raises(AssertionError, match=r"timed out after 0.05s waiting for the lease; last value: \[\]"):
        await eventually(lambda: [], timeout=0.05, what="the lease", every=0.01)
    with pytest.raises(AssertionError, match="waiting for the pid file; last value: ''"):
        eventually_blocking(lambda: "", timeout=0.05, what="the pid file", every=0.01)


async def test_a_message_given_as_a_function_is_made_when_the_wait_fails():
    log = ["starting"]
    wait = eventually(lambda: False, timeout=0.05, what=lambda: f"the gateway; its log: {log[-1]}", every=0.01)
    log.append("port in use")
    with pytest.raises(AssertionError, match="the gateway; its log: port in use"):
        await wait
    with pytest.raises(AssertionError, match="the gateway; its log: port in use"):
        eventually_blocking(lambda: False, timeout=0.05, what=lambda: f"the gateway; its log: {log[-1]}", every=0)


async def test_only_the_errors_named_count_as_not_yet():
    assert await eventually(counting(0, fail_before=3), ignoring=(OSError,), every=0) == 3
    assert eventually_blocking(counting(0, fail_before=3), ignoring=(OSError,), every=0) == 3
    with pytest.raises(OSError, match="call 0"):
        await eventually(counting(0, fail_before=3), every=0)
    with pytest.raises(KeyError):
        eventually_blocking(counting(0, fail_before=3, error=KeyError), ignoring=(OSError,), every=0)
    with pytest.raises(AssertionError, match=r"last value: ConnectionRefusedError\('call"):
        await eventually(counting(99, fail_before=10**9, error=ConnectionRefusedError), timeout=0.05,
                         ignoring=(OSError,), every=0.01)
