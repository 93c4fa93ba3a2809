"""The batch-consuming services tune the cyclic collector for their batches (libs/runtime/gctune.py): what they
built at start-up is frozen and the youngest generation waits for many more allocations. Without it a drain of
20,000 usage reports spent a tenth of the budget's time in 3 gen-2 collections of 70-100 ms each. They do it
before their consumers start, not after: the tuning's full collection holds the event loop (30 ms in a bare
process, more in a large one) and after the start it stalled the first batches already fetched
(docs/performance.md, the eighth round)."""

from __future__ import annotations

import gc
import importlib

import pytest

from libs.runtime.gctune import BATCH_GEN0_THRESHOLD
from libs.runtime.service import Runtime
from services.budget.app import serve as budget
from services.budget.settings import BudgetSettings
from services.health.app import serve as health
from services.health.settings import HealthSettings
from tests.support.services import running

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


SETTINGS = {"audit": "AuditSettings", "budget": "BudgetSettings", "health": "HealthSettings",
            "queue": "QueueSettings"}


@pytest.mark.parametrize("name", sorted(SETTINGS))
async def test_the_collector_is_tuned_before_any_consumer_starts(env, monkeypatch, name):
    app = importlib.import_module(f"services.{name}.app")
    settings = getattr(importlib.import_module(f"services.{name}.settings"), SETTINGS[name])
    happened: list[str] = []
    real_consume, real_tune = Runtime.consume, app.tune_for_batches

    async def consume(self, consumers):
        happened.append("consume")
        return await real_consume(self, consumers)

    def tune(*args, **kwargs):
        happened.append("tune")
        return real_tune(*args, **kwargs)

    monkeypatch.setattr(Runtime, "consume", consume)
    monkeypatch.setattr(app, "tune_for_batches", tune)
    before = gc.get_threshold()
    try:
        async with running(app.serve, env.settings(settings)):
            pass
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
    assert happened[:2] == ["tune", "consume"], happened
