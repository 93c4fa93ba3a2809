"""Small gang pieces outside the queue's domain: the exit status contract between workload and queue, the
gateway's view of the gang policy and of a job's gang, and the fine-tune's collectives for a single worker."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from libs.contracts.policies import GangPolicy
from libs.contracts.telemetry import EXIT_PEER_LOST
from services.gateway.domain.views import gang_policy_view, job_view
from teto import sdk

pytestmark = pytest.mark.unit


def test_the_sdk_and_the_queue_agree_on_the_peer_lost_exit_status():
    assert sdk.EXIT_PEER_LOST == EXIT_PEER_LOST == 76 and sdk.EXIT_PEER_LOST != sdk.EXIT_AGENT_GONE


def test_policy_view_shows_defaults_until_an_admin_sets_one():
    view = gang_policy_view(None)
    assert view == {**GangPolicy().model_dump(mode="json"), "updated_by": None, "updated_at": None}


def test_policy_view_shows_the_stored_policy_and_who_set_it():
    at = datetime(2026, 11, 29, tzinfo=UTC)
    row = {**GangPolicy(backoff_limit=None, node_failure_strategy="fail_job").model_dump(mode="json"),
           "updated_by": "root", "updated_at": at}
    view = gang_policy_view(row)
    assert view["backoff_limit"] is None and view["node_failure_strategy"] == "fail_job"
    assert view["updated_by"] == "root" and view["updated_at"] == at


def test_job_view_carries_the_gang_and_its_backoff():
    gang = [{"rank": 0, "executor_id": "a", "node_id": "n-a", "ready": True}]
    view = job_view({"id": "j", "state": "backoff", "spec": {}, "gang": gang, "backoff_count": 2,
                     "next_admission_at": "2026-11-29T12:00:00+00:00", "rendezvous": None, "ready_deadline": None})
    assert view["gang"] == gang and view["backoff_count"] == 2 and view["next_admission_at"].startswith("2026")


def test_a_single_worker_joins_no_gang(monkeypatch):
    monkeypatch.setenv("TETO_WORLD_SIZE", "1")
    assert sdk.init_distributed() is None
