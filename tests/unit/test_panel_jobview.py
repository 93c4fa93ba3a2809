"""The follow-up page's figures, from the job as the API shows it: budget with its provisional part, the requeue
minimum, ceiling history with from/to, interruption cost (the API's, else estimated), warnings, gang ranks, who
may requeue or cancel; and the jobs page's cursor and name pattern."""

from __future__ import annotations


import pytest

from services.gateway.panel import jobview

pytestmark = pytest.mark.unit


def job(**kw):
    base = {"id": "j1", "owner": "ana", "state": "running", "spec": {"gpu_ceiling_seconds": 100, "workers": 1,
            "gpus_per_worker": 0}, "last_step": 37, "step_seconds": 0.5, "last_checkpoint": {"step": 30},
            "budget": {"ceiling_seconds": 100, "consumed_seconds": 40, "remaining_seconds": 60,
                       "overshoot_seconds": 0.0}}
    base.update(kw)
    return base


def test_budget_shows_the_ledger_and_a_provisional_part_only_while_running():
    shown = jobview.budget(job(budget={"ceiling_seconds": 100, "consumed_seconds": 40, "provisional_seconds": 5}))
    assert shown["consumed"] == 40 and shown["provisional"] == 5 and shown["remaining"] == 55
    stopped = jobview.budget(job(state="interrupted", budget={"ceiling_seconds": 100, "consumed_seconds": 40,
                                                              "provisional_seconds": 5}))
    assert stopped["provisional"] is None and stopped["remaining"] == 60


def test_overshoot_is_shown_only_when_there_is_one():
    assert jobview.budget(job())["overshoot"] is None
    over = job(budget={"ceiling_seconds": 10, "consumed_seconds": 12.5, "remaining_seconds": 0,
                       "overshoot_seconds": 2.5})
    assert jobview.budget(over)["overshoot"] == 2.5


def test_without_a_budget_block_the_ceiling_comes_from_the_spec():
    shown = jobview.budget(job(budget=None))
    assert shown["ceiling"] == 100 and shown["consumed"] is None and shown["remaining"] is None


def test_the_requeue_minimum_is_consumed_plus_a_minute():
    assert jobview.requeue_minimum(40.25) == 100.25
    assert jobview.requeue_minimum(None) == 60.0


def test_ceiling_history_says_who_changed_what_from_what_to_what():
    history = [{"ceiling_seconds": 10, "actor": "ana", "at": "t0"}, {"ceiling_seconds": 130.5, "actor": "olga",
                                                                      "at": "t1"}]
    rows = jobview.ceiling_history(job(budget={"ceiling_history": history}))
    assert rows == [{"at": "t0", "actor": "ana", "from": None, "to": 10.0},
                    {"at": "t1", "actor": "olga", "from": 10.0, "to": 130.5}]
    assert jobview.ceiling_history(job(budget={}, ceiling_history=history[:1]))[0]["actor"] == "ana"


def test_interruption_cost_is_the_apis_when_given():
    cost = jobview.interruption_cost(job(interruption_cost={"steps": 7, "gpu_seconds": 3.5, "since_step": 30}))
    assert cost == {"steps": 7, "gpu_seconds": 3.5, "since_step": 30, "estimated": False}


def test_interruption_cost_is_estimated_from_steps_since_the_checkpoint_and_step_time():
    # 7 steps since the checkpoint at 30, 0.5 s each, on 2 workers x 4 GPUs.
    gang = job(spec={"workers": 2, "gpus_per_worker": 4})
    assert jobview.interruption_cost(gang) == {"steps": 7, "gpu_seconds": 28.0, "since_step": 30, "estimated": True}
    assert jobview.interruption_cost(job(step_seconds=None))["gpu_seconds"] is None
    assert jobview.interruption_cost(job(last_checkpoint=None))["steps"] == 37
    assert jobview.interruption_cost(job(last_step=None)) is None
    assert jobview.interruption_cost(job(state="succeeded")) is None


def test_the_first_checkpoint_warning_carries_both_numbers():
    warned = job(budget={"warning": {"expected_seconds": 40, "ceiling_seconds": 30, "source": "estimate"}})
    assert jobview.first_checkpoint_warning(warned) == {"expected": 40.0, "ceiling": 30.0, "source": "estimate"}
    assert jobview.first_checkpoint_warning(job()) is None


def test_gang_ranks_carry_executor_node_and_readiness():
    gang = [{"executor_id": "e1", "ready_at": "t", "ended": None}, {"executor_id": "e2", "ready_at": None,
                                                                      "ended": "peer_lost"}]
    ranks = jobview.gang_ranks(job(gang=gang), [{"executor_id": "e1", "node_id": "n1"}])
    assert ranks == [{"rank": 0, "executor_id": "e1", "node_id": "n1", "ready_at": "t", "ended": None},
                     {"rank": 1, "executor_id": "e2", "node_id": None, "ready_at": None, "ended": "peer_lost"}]


@pytest.mark.parametrize("state", ["queued", "admitting", "running", "interrupted", "backoff", "succeeded",
                                   "failed", "cancelled"])
def test_requeue_only_of_an_interrupted_job_and_cancel_per_the_apis_rule(state):
    j = job(state=state)
    assert jobview.may_requeue(j) == (state == "interrupted")
    finished = state in ("succeeded", "failed", "cancelled")
    assert jobview.may_cancel(j, "ana", manage=False, submit=True) == (not finished)  # own job
    assert jobview.may_cancel(j, "bob", manage=False, submit=True) is False  # another's, without manage
    assert jobview.may_cancel(j, "bob", manage=True, submit=True) == (not finished)
    assert jobview.may_cancel(j, "ana", manage=False, submit=False) is False  # a viewer


def test_attempts_keep_the_contract_order():
    counts = {"training_error": 1, "transport_lost": 2}
    assert jobview.attempts(job(attempts=counts)) == [("training_error", 1), ("transport_lost", 2)]


def test_attempts_against_the_limit_and_interruptions_are_shown_apart():
    """Issue 26: "Attempt 4 / 3" compared every run (interruptions included) with max_attempts."""
    counts = {"training_error": 1, "transport_lost": 2, "node_failure": 0, "health_check": 1}
    got = jobview.attempt_groups(job(attempts=counts, attempt_number=5,
                                     spec={"max_attempts": 3, "gpu_ceiling_seconds": 100}))
    assert (got["spent"], got["max"], got["interruptions"]) == (1, 3, 3)
    assert got["counted"] == [("training_error", 1)]
    assert got["free"] == [("transport_lost", 2), ("node_failure", 0), ("health_check", 1)]
    assert jobview.attempt_groups(job(attempts=None))["spent"] == 0 and jobview.attempt_groups(job())["max"] is None
