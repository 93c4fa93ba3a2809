"""Which consumers linger for their batches (libs/runtime/edge.py, ``Consumer.linger_seconds``): those nobody
waits on (the audit's three, the budget's job events and step reports, health's job events), by
``TETO_BATCH_LINGER_SECONDS`` (0.1 s by default, 0 turns it off); never the queue's, whose commands and reports
someone waits on, nor the ones that carry usage or heartbeats (ceilings and signals are judged on them)."""

from __future__ import annotations

import pytest

from libs.contracts.subjects import Subjects
from libs.runtime.clock import Clock
from services.audit.handlers import consumers as audit_consumers
from services.audit.settings import AuditSettings
from services.budget.handlers import consumers as budget_consumers
from services.budget.settings import BudgetSettings
from services.health.handlers import consumers as health_consumers
from services.health.settings import HealthSettings

pytestmark = pytest.mark.unit


def _lingering(declared) -> dict[str, float]:
    return {c.durable: c.linger_seconds for c in declared if c.linger_seconds}


@pytest.mark.parametrize("env", [{}, {"TETO_BATCH_LINGER_SECONDS": "0.25"}, {"TETO_BATCH_LINGER_SECONDS": "0"}])
def test_the_consumers_nobody_waits_on_linger_as_configured(env):
    subjects = Subjects("teto")
    audit = AuditSettings.from_env(env=env)
    budget = BudgetSettings.from_env(env=env)
    health = HealthSettings.from_env(env=env)
    linger = float(env.get("TETO_BATCH_LINGER_SECONDS", "0.1"))
    expected = {"audit": {"audit-commands", "audit-outcomes", "audit-rejected"},
                "budget": {"budget-job-events", "budget-progress"}, "health": {"health-job-events"}}
    found = {
        "audit": _lingering(audit_consumers(subjects, audit, Clock())),
        "budget": _lingering(budget_consumers(subjects, budget)),
        "health": _lingering(health_consumers(subjects, health)),
    }
    for service, durables in expected.items():
        assert found[service] == ({d: linger for d in durables} if linger else {}), service


def test_the_queue_never_lingers():
    from services.queue.handlers import consumers

    declared = consumers(Subjects("teto"))
    assert declared and not _lingering(declared)
