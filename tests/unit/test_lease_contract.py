"""The lease contract every part checks at start-up (libs/runtime/settings.py): a configuration in which one
lost renewal would make a healthy executor abandon its job, or in which the executor could still be training
when the queue redelivers, is refused with the reason."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libs.runtime.settings import CommonSettings, SettingsError, check_lease_contract

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("lease", "heartbeat", "margin", "reason"), [
    (180, 30, 30, None),  # the defaults
    (6, 1, 1.5, None),  # the tests' timings
    (5, 2, 1, None),  # exactly two heartbeats plus the margin
    (4.9, 2, 1, "shorter than two heartbeats"),
    (60, 30, 30, "shorter than two heartbeats"),
    (10, 1, 10, "must be shorter than the lease"),
    (10, 1, 12, "must be shorter than the lease"),
], ids=["defaults", "test-timings", "exact-minimum", "just-short", "one-heartbeat-window", "margin-equals-lease",
        "margin-beyond-lease"])
def test_the_lease_contract_is_checked_with_its_reason(lease, heartbeat, margin, reason):
    if reason is None:
        check_lease_contract(lease, heartbeat, margin)
    else:
        with pytest.raises(SettingsError, match=reason):
            check_lease_contract(lease, heartbeat, margin)


@given(lease=st.floats(0.1, 86400), heartbeat=st.floats(0.1, 3600), margin=st.floats(0.01, 86400))
def test_an_accepted_contract_survives_one_lost_renewal_and_stops_before_redelivery(lease, heartbeat, margin):
    try:
        check_lease_contract(lease, heartbeat, margin)
    except SettingsError:
        return
    give_up_after = lease - margin  # the executor stops when no renewal was acknowledged for this long
    assert give_up_after >= 2 * heartbeat * (1 - 1e-9)  # a renewal may be lost and the next one still arrives in time
    assert 0 < give_up_after < lease  # it stops before the queue can redeliver (a full lease without renewal)


def test_settings_from_the_environment_are_refused_with_the_variable_values():
    with pytest.raises(SettingsError, match=r"lease 2s is shorter than two heartbeats \(2s\) plus the stop margin"):
        CommonSettings.from_env(env={"TETO_LEASE_SECONDS": "2", "TETO_HEARTBEAT_SECONDS": "1"})
    # the stop margin defaults to one heartbeat
    assert CommonSettings.from_env(env={"TETO_LEASE_SECONDS": "3", "TETO_HEARTBEAT_SECONDS": "1"}).effective_stop_margin == 1
