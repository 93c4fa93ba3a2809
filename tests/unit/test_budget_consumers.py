"""The budget's consumer declarations: the usage reports are read ahead (a batch decoded while the one before
waits for its commit), the others keep the plain fetch-ahead (services/budget/handlers.py)."""

from __future__ import annotations

import pytest

from libs.contracts.subjects import Subjects
from services.budget.handlers import consumers
from services.budget.settings import BudgetSettings

pytestmark = pytest.mark.unit


def test_only_the_usage_reports_are_read_ahead():
    declared = {c.durable: c.read_ahead for c in consumers(Subjects("teto"), BudgetSettings.from_env(env={}))}
    assert declared.pop("budget-usage-reports") is True
    assert declared and not any(declared.values()), declared
