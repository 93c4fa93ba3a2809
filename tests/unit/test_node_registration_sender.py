"""A node registration may only name its sender (services/health/domain/registration.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.health.domain.registration import foreign_executor

NOW = datetime(2026, 12, 1, 4, 0, tzinfo=UTC)
GONE = 60.0


@pytest.mark.parametrize(("named", "bound", "heard_ago", "refused"), [
    ("ex-a", None, None, False),  # a new node: its first registration binds it
    ("ex-a", "ex-a", 1.0, False),  # the node's own executor, again (a restart, a reboot)
    ("made-up", "ex-a", 1.0, True),  # the issue: re-bound to a made-up id while its agent heartbeats
    ("made-up", "ex-a", GONE - 0.5, True),
    ("ex-new", "ex-a", GONE, False),  # the bound executor is gone: a reinstalled agent takes the node
    ("ex-new", "ex-a", None, False),  # never heard from
], ids=["new-node", "same-executor", "made-up-while-alive", "made-up-just-before-gone", "after-gone",
        "bound-never-heard"])
def test_a_registration_naming_another_executor_than_the_node_s_live_one_is_refused(named, bound, heard_ago,
                                                                                      refused):
    heard = NOW - timedelta(seconds=heard_ago) if heard_ago is not None else None
    reason = foreign_executor(named, bound, heard, NOW, GONE)
    assert (reason is not None) is refused
    if refused:
        assert f"names executor {named!r}" in reason and f"bound to executor {bound!r}" in reason
        assert "may only name its sender" in reason
