"""An interrupted job's label says how its run really ended (services/queue/domain/endings.py): the run that
died of a PermissionError while a ceiling stop was pending was a failure, not "GPU ceiling reached"."""

from __future__ import annotations

import pytest

from libs.contracts.telemetry import RunOutcome
from services.queue.domain.endings import interruption_reason, spends_attempt
from services.queue.domain.facts import Finished, LeaseExpired


@pytest.mark.parametrize(("fact", "label", "spent"), [
    (Finished(3, RunOutcome.STOPPED, stop_reason="gpu_ceiling"), "gpu_ceiling", False),
    (Finished(3, RunOutcome.STOPPED), "gpu_ceiling", False),  # stopped as the pending ceiling stop asked
    (Finished(3, RunOutcome.FAILED, exit_code=1, error="PermissionError: step-00000100.pt"), "run_failed", True),
    (Finished(3, RunOutcome.ABANDONED), "run_abandoned", False),
    (Finished(3, RunOutcome.HANDED_BACK), "run_never_started", False),
    (LeaseExpired(3), "run_lost", False),
], ids=["stopped-at-ceiling", "stopped", "failed", "abandoned", "handed-back", "lease-expired"])
def test_the_label_is_how_the_run_ended_and_only_a_failure_spends_an_attempt(fact, label, spent):
    assert interruption_reason(fact) == label
    assert spends_attempt(fact) is spent


@pytest.mark.parametrize("outcome", list(RunOutcome), ids=str)
def test_every_outcome_has_a_label(outcome):
    assert interruption_reason(Finished(1, outcome))
