"""The budget and health services tune the cyclic collector for their batches once ready (libs/runtime/gctune.py):
what they built at start-up is frozen and the youngest generation waits for many more allocations. Without it a
drain of 20,000 usage reports spent a tenth of the budget's time in 3 gen-2 collections of 70-100 ms each."""

from __future__ import annotations

import gc

import pytest

from libs.runtime.gctune import BATCH_GEN0_THRESHOLD
from services.budget.app import serve as budget
from services.budget.settings import BudgetSettings
from services.health.app import serve as health
from services.health.settings import HealthSettings
from tests.integration.helpers_hba import running

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(("serve", "settings"), [(budget, BudgetSettings), (health, HealthSettings)],
                         ids=["budget", "health"])
async def test_the_service_tunes_the_collector_once_ready(env, serve, settings):
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    gc.unfreeze()
    try:
        async with running(serve, env.settings(settings)):
            assert gc.get_threshold() == (BATCH_GEN0_THRESHOLD, 10, 10)
            assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
