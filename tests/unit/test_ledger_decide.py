"""The ledger's decision on an account (services/budget/domain/ledger.py ``on_usage``, ``on_ceiling``) builds one
new account per call instead of copying it field by field; its figures and announcements are those of the rule
as written before (a reference kept here), for any account."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from services.budget.domain.ledger import Account, Decision, on_ceiling, on_usage

seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False)
ceilings = st.one_of(st.none(), seconds, st.sampled_from([0.0, 10.0, 40.0]))
accounts = st.builds(Account, ceiling=ceilings, consumed=st.one_of(seconds, st.sampled_from([0.0, 10.0, 40.0])),
                     exhausted_for=ceilings, overshoot=seconds, active=st.booleans())


def reference_decide(account: Account) -> Decision:
    over = account.ceiling is not None and account.consumed >= account.ceiling
    if account.ceiling is not None:
        account = replace(account, overshoot=max(account.overshoot, account.consumed - account.ceiling))
    if over and account.active and account.exhausted_for != account.ceiling:
        return Decision(replace(account, exhausted_for=account.ceiling), True)
    return Decision(account, False)


@given(accounts, st.one_of(seconds, st.floats(min_value=-5, max_value=0)))
def test_usage_is_decided_as_the_rule_says(account, added):
    assert on_usage(account, added) == reference_decide(
        replace(account, consumed=account.consumed + max(0.0, added)))


@given(accounts, seconds)
def test_a_new_ceiling_is_decided_as_the_rule_says(account, ceiling):
    assert on_ceiling(account, ceiling) == reference_decide(replace(account, ceiling=ceiling))
