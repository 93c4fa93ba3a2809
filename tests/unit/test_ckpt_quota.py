"""Checkpoint quotas and the bounds of checkpoint verification (issue 26 item 3): the quota's arithmetic, the
refusal reasons, a verification that never hashes a file over the quota and stops between chunks, and the
refusal when written (checkpoints.save, the background writer, the SDK, the agent's acceptance of a report)."""

from __future__ import annotations

import hashlib
import json
import os
import types

import pytest
from pydantic import ValidationError

from agents.executor import checkpoints, ckpt_quota, sdk, sdk_context, sdk_link
from agents.executor.ckpt_async import BackgroundWriter
from agents.executor.ckpt_quota import CheckpointRefused, VerificationStopped
from agents.executor.reports import Reports
from libs.contracts.agents import RunJob
from libs.contracts.jobs import CHECKPOINT_QUOTA_DEFAULT, CHECKPOINT_QUOTA_MAX, JobSpec
from libs.contracts.telemetry import CheckpointReport, CheckpointSkipped, Phase
from libs.contracts.tenancy import OrgSpec
from services.queue.tenancy.model import Organisation, checkpoint_quota

GIB = 2**30
SPEC = {"workload": {"kind": "command", "command": ["true"]}}


def _sparse(path, size: int, *, sidecar_bytes: int | None = None, step: int = 7) -> None:
    """A sparse file of ``size`` bytes (no blocks written) and a sidecar claiming ``sidecar_bytes``: the attack."""
    with open(path, "wb") as f:
        f.truncate(size)
    meta = {"step": step, "sha256": "0" * 64, "bytes": size if sidecar_bytes is None else sidecar_bytes}
    checkpoints.sidecar_path(path).write_text(json.dumps(meta))


# -- the quota's arithmetic -------------------------------------------------------------------------------------

def test_the_job_spec_has_a_default_quota_and_bounds_it():
    assert JobSpec.model_validate(SPEC).checkpoint_quota_bytes == CHECKPOINT_QUOTA_DEFAULT == 64 * GIB
    for bad in (0, -1, CHECKPOINT_QUOTA_MAX + 1, 1.5, "big"):
        with pytest.raises(ValidationError):
            JobSpec.model_validate({**SPEC, "checkpoint_quota_bytes": bad})
    assert JobSpec.model_validate({**SPEC, "checkpoint_quota_bytes": CHECKPOINT_QUOTA_MAX}).checkpoint_quota_bytes


def test_the_organisation_quota_is_optional_and_bounded():
    assert OrgSpec().checkpoint_quota_bytes is None
    assert OrgSpec(checkpoint_quota_bytes=GIB).checkpoint_quota_bytes == GIB
    for bad in (0, CHECKPOINT_QUOTA_MAX + 1):
        with pytest.raises(ValidationError):
            OrgSpec(checkpoint_quota_bytes=bad)


@pytest.mark.parametrize(("job", "org", "expected"), [
    (10 * GIB, None, 10 * GIB),  # no organisation known: the job's own
    (10 * GIB, Organisation("o"), 10 * GIB),  # an organisation without a cap
    (10 * GIB, Organisation("o", checkpoint_quota_bytes=GIB), GIB),  # the organisation caps it
    (GIB, Organisation("o", checkpoint_quota_bytes=10 * GIB), GIB),  # never raised above the job's own
], ids=["no-org", "org-uncapped", "org-caps", "job-smaller"])
def test_the_grant_carries_the_smaller_of_job_and_organisation(job, org, expected):
    assert checkpoint_quota(job, org) == expected


def test_the_agent_applies_the_granted_quota_else_the_job_s_own():
    assert ckpt_quota.quota_of(5, None) == 5
    assert ckpt_quota.quota_of(5, 3) == 3
    grant = RunJob(job_id="j", epoch=1, executor_id="e", spec=JobSpec.model_validate(SPEC), attempt=1,
                   lease_seconds=6, heartbeat_seconds=1)
    assert grant.checkpoint_quota_bytes is None  # a queue from before organisation quotas


@pytest.mark.parametrize(("env", "expected"), [
    ({}, None), ({"TETO_CHECKPOINT_QUOTA_BYTES": "100"}, 100), ({"TETO_CHECKPOINT_QUOTA_BYTES": "0"}, None),
    ({"TETO_CHECKPOINT_QUOTA_BYTES": "-3"}, None), ({"TETO_CHECKPOINT_QUOTA_BYTES": "lots"}, None)])
def test_the_training_process_reads_its_quota_from_the_environment(env, expected):
    assert ckpt_quota.quota_from_env(env) == expected
    assert sdk_context.from_environ(env).checkpoint_quota == expected


# -- refusal reasons --------------------------------------------------------------------------------------------

def test_a_checkpoint_of_exactly_the_quota_fits_one_byte_more_does_not():
    assert ckpt_quota.over_quota(100, 100) is None
    assert ckpt_quota.over_quota(5, None) is None
    assert ckpt_quota.over_quota(101, 100) == ("over the checkpoint quota: the checkpoint has 101 bytes, the job's "
                                               "quota is 100 bytes")
    assert "claims 101 bytes" in ckpt_quota.over_quota(101, 100, claimed=True)


@pytest.mark.parametrize(("reported", "measured", "refused"), [
    (50, 50, False), (50, 150, True),  # the file on disk counts, whatever the report says
    (150, 50, True),  # a report claiming more than the quota refuses itself
    (150, None, True), (50, None, False), (None, None, False), (True, None, False),  # a bool is no size
], ids=["fits", "disk-over", "claim-over", "claim-over-unreadable", "claim-fits-unreadable", "no-size", "bool"])
def test_a_reported_checkpoint_is_refused_by_its_size_on_disk_or_its_claim(reported, measured, refused):
    reason = ckpt_quota.report_refusal(reported, measured, 100)
    assert (reason is not None) is refused
    if refused:
        assert reason.startswith("over the checkpoint quota")


def test_a_checkpoint_refused_when_written_carries_its_numbers():
    exc = CheckpointRefused(4, 200, 100)
    assert (exc.step, exc.size, exc.quota) == (4, 200, 100) and isinstance(exc, ValueError)
    assert "200 bytes" in str(exc) and "100 bytes" in str(exc)


# -- verification bounds ----------------------------------------------------------------------------------------

def test_the_bounded_hash_is_the_sha256(tmp_path):
    data = os.urandom(3 * ckpt_quota.CHUNK + 17)
    (tmp_path / "f").write_bytes(data)
    assert ckpt_quota.sha256_bounded(tmp_path / "f", limit=len(data)) == (hashlib.sha256(data).hexdigest(), len(data))


def test_a_stopped_run_stops_the_hash_within_one_chunk(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * (10 * ckpt_quota.CHUNK))
    looks = []

    def stopped() -> bool:
        looks.append(1)
        return len(looks) > 3  # the stop arrives after three chunks

    with pytest.raises(VerificationStopped) as caught:
        ckpt_quota.sha256_bounded(tmp_path / "f", stopped=stopped)
    assert caught.value.hashed == 3 * ckpt_quota.CHUNK


def test_a_file_growing_past_the_quota_while_hashed_is_refused(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * (ckpt_quota.CHUNK + 1))
    with pytest.raises(ValueError, match="over the checkpoint quota"):
        ckpt_quota.sha256_bounded(tmp_path / "f", limit=ckpt_quota.CHUNK)


def test_a_huge_sparse_checkpoint_whose_sidecar_admits_its_size_is_refused_unread(tmp_path):
    path = checkpoints.checkpoint_path(tmp_path, 7)
    _sparse(path, 24 * GIB)

    def never() -> bool:
        raise AssertionError("hashing started")

    ckpt, reason = checkpoints.validate(path, quota=GIB, stopped=never)
    assert ckpt is None and reason == (f"over the checkpoint quota: the checkpoint claims {24 * GIB} bytes, the "
                                       f"job's quota is {GIB} bytes")


def test_a_sidecar_lying_low_about_a_huge_file_is_refused_by_its_size_unread(tmp_path):
    path = checkpoints.checkpoint_path(tmp_path, 7)
    _sparse(path, 24 * GIB, sidecar_bytes=10)

    def never() -> bool:
        raise AssertionError("hashing started")

    ckpt, reason = checkpoints.validate(path, quota=GIB, stopped=never)
    assert ckpt is None and reason == f"truncated or altered: {24 * GIB} bytes, sidecar says 10"


def test_a_stop_during_the_search_for_a_resume_point_ends_it(tmp_path):
    checkpoints.save_bytes(tmp_path, 1, b"a" * (4 * ckpt_quota.CHUNK))
    with pytest.raises(VerificationStopped):
        checkpoints.latest_valid(tmp_path, quota=GIB, stopped=lambda: True)
    ckpt, skipped = checkpoints.latest_valid(tmp_path, quota=GIB, stopped=lambda: False)
    assert ckpt is not None and ckpt.step == 1 and skipped == []


def test_an_over_quota_checkpoint_is_skipped_for_an_older_one_that_fits(tmp_path):
    checkpoints.save_bytes(tmp_path, 1, b"a" * 10)
    _sparse(checkpoints.checkpoint_path(tmp_path, 2), 24 * GIB, step=2)
    ckpt, skipped = checkpoints.latest_valid(tmp_path, quota=GIB)
    assert ckpt is not None and ckpt.step == 1
    assert [(p.name, r.startswith("over the checkpoint quota")) for p, r in skipped] == [("step-00000002.pt", True)]


# -- refused when written ---------------------------------------------------------------------------------------

def test_a_save_over_the_quota_leaves_no_file_and_no_sidecar(tmp_path):
    with pytest.raises(CheckpointRefused) as caught:
        checkpoints.save_bytes(tmp_path, 3, b"x" * 101, quota=100)
    assert (caught.value.step, caught.value.size, caught.value.quota) == (3, 101, 100)
    assert list(tmp_path.iterdir()) == []  # neither the file, its sidecar, nor the temp file
    assert checkpoints.save_bytes(tmp_path, 3, b"x" * 100, quota=100).bytes == 100


def test_the_background_writer_refuses_at_once_and_raises_at_the_next_wait(tmp_path):
    writer = BackgroundWriter()
    refused, done = [], []
    writer.submit(tmp_path, 5, b"y" * 101, fmt="bytes", on_done=done.append, quota=100, on_refused=refused.append)
    with pytest.raises(RuntimeError, match="over the checkpoint quota"):
        writer.wait()
    assert done == [] and [(r.step, r.size) for r in refused] == [(5, 101)] and list(tmp_path.iterdir()) == []


@pytest.fixture
def sdk_in_teto(tmp_path, monkeypatch):
    """The SDK as a training process sees it under Teto: a report pipe, a checkpoint directory, a quota."""
    read_fd, write_fd = os.pipe()
    monkeypatch.setenv("TETO_REPORT_FD", str(write_fd))
    monkeypatch.setenv("TETO_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setenv("TETO_CHECKPOINT_QUOTA_BYTES", "100")
    monkeypatch.setitem(sdk_link.state, "fd", None)

    def records() -> list[dict]:
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as f:
            return [json.loads(line) for line in f.read().splitlines()]

    yield records


def test_the_sdk_refuses_an_over_quota_checkpoint_and_tells_the_agent(sdk_in_teto, tmp_path):
    with pytest.raises(sdk.CheckpointRefused):
        sdk.save_checkpoint(b"z" * 101, 9)
    assert sdk.save_checkpoint(b"z" * 100, 10) == checkpoints.checkpoint_path(tmp_path / "ckpt", 10)
    kinds = [(r["type"], r.get("step"), r.get("bytes")) for r in sdk_in_teto() if r["type"] != "phase"]
    assert kinds == [("checkpoint_refused", 9, 101), ("checkpoint", 10, 100)]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-00000010.json", "step-00000010.pt"]


def _run(quota: int | None = 100) -> types.SimpleNamespace:
    spec = types.SimpleNamespace(checkpoint_quota_bytes=1000)
    grant = types.SimpleNamespace(rank=0, job_id="j1", world_size=1, spec=spec, checkpoint_quota_bytes=quota)
    return types.SimpleNamespace(grant=grant, phase=Phase.TRAINING, step=None, pending_step=None,
                                 last_step_sent_at=None, step_seconds_sum=0.0, step_seconds_n=0,
                                 confirmed_file=None, uploader=None)


def _reports() -> tuple[Reports, list[tuple[type, dict]]]:
    sent: list[tuple[type, dict]] = []
    return Reports(lambda run, cls, **fields: sent.append((cls, fields)), 60.0), sent


def test_the_agent_refuses_a_reported_checkpoint_over_the_granted_quota(tmp_path):
    reports, sent = _reports()
    small, big = tmp_path / "small.pt", tmp_path / "big.pt"
    small.write_bytes(b"s" * 100)
    _sparse(big, 24 * GIB, sidecar_bytes=10)
    reports.on_report(_run(), {"type": "checkpoint", "step": 1, "path": str(small), "bytes": 100})
    reports.on_report(_run(), {"type": "checkpoint", "step": 2, "path": str(big), "bytes": 10})  # it lies
    assert [cls for cls, _ in sent] == [CheckpointReport, CheckpointSkipped]
    assert sent[1][1] == {"path": str(big), "reason": f"over the checkpoint quota: the checkpoint has {24 * GIB} "
                                                      "bytes, the job's quota is 100 bytes"}


def test_the_agent_falls_back_to_the_job_s_own_quota_and_shows_the_sdk_s_refusal(tmp_path):
    reports, sent = _reports()
    (tmp_path / "c.pt").write_bytes(b"c" * 500)
    reports.on_report(_run(None), {"type": "checkpoint", "step": 1, "path": str(tmp_path / "c.pt"), "bytes": 500})
    reports.on_report(_run(), {"type": "checkpoint_refused", "step": 2, "path": "/x/step-00000002.pt", "bytes": 101})
    assert [cls for cls, _ in sent] == [CheckpointReport, CheckpointSkipped]  # 500 fits the job's own 1000
    assert sent[1][1]["reason"].endswith("the checkpoint has 101 bytes, the job's quota is 100 bytes")


# -- the command line -------------------------------------------------------------------------------------------

def test_the_cli_sets_the_quota_in_gib_on_a_job_and_an_organisation():
    import argparse

    from teto.cli import build_parser
    from teto.cli_client import build_spec
    from teto.cli_common import CliError
    from teto.cli_orgs import org_spec

    job = build_parser().parse_args(["submit", "--checkpoint-quota-gib", "1.5"])
    assert build_spec(job)["checkpoint_quota_bytes"] == 3 * 2**29
    assert "checkpoint_quota_bytes" not in build_spec(build_parser().parse_args(["submit"]))
    org = build_parser().parse_args(["orgs", "set", "north", "--checkpoint-quota-gib", "2"])
    assert org_spec(org)["checkpoint_quota_bytes"] == 2 * GIB
    assert org_spec(build_parser().parse_args(["orgs", "set", "north"]))["checkpoint_quota_bytes"] is None
    with pytest.raises(CliError, match="must be more than 0"):
        org_spec(argparse.Namespace(**{**vars(org), "checkpoint_quota_gib": 0.0}))
