"""``sdk.context()``'s reading of the ``TETO_*`` environment (agents/executor/sdk_context.py): what a training
script is told about its job, its place in a gang and its checkpoints, and what it is told outside Teto."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.executor import sdk, sdk_link
from agents.executor.sdk_context import Context, from_environ


def test_outside_teto_a_process_of_its_own() -> None:
    ctx = from_environ({})
    assert ctx == Context(in_teto=False, job_id=None, epoch=None, attempt=None, rank=0, world_size=1,
                          rendezvous=None, checkpoint_dir=Path("checkpoints"), checkpoint_every=None,
                          resume_from=None, device="cpu", work_dir=None, params={}, checkpoints_kept=0)
    assert ctx.is_writer


def test_every_variable_the_agent_sets() -> None:
    ctx = from_environ({
        "TETO_JOB_ID": "j-1", "TETO_EPOCH": "7", "TETO_ATTEMPT": "2", "TETO_RANK": "1", "TETO_WORLD_SIZE": "4",
        "TETO_RENDEZVOUS": "10.0.0.5:29500", "TETO_CHECKPOINT_DIR": "/ck/j-1", "TETO_CHECKPOINT_EVERY": "50",
        "TETO_RESUME_FROM": "/ck/j-1/step-00000100.pt", "TETO_DEVICE": "cuda", "TETO_WORK_DIR": "/work/j-1",
        "TETO_PARAMS": '{"lr": 0.001, "steps": 300}', "TETO_CHECKPOINTS_KEPT": "5",
    })
    assert ctx == Context(in_teto=True, job_id="j-1", epoch=7, attempt=2, rank=1, world_size=4,
                          rendezvous="10.0.0.5:29500", checkpoint_dir=Path("/ck/j-1"), checkpoint_every=50,
                          resume_from=Path("/ck/j-1/step-00000100.pt"), device="cuda", work_dir=Path("/work/j-1"),
                          params={"lr": 0.001, "steps": 300}, checkpoints_kept=5)
    assert not ctx.is_writer  # only rank 0 writes checkpoints


@pytest.mark.parametrize("name", ["TETO_EPOCH", "TETO_ATTEMPT", "TETO_CHECKPOINT_EVERY"])
@pytest.mark.parametrize("value", ["", "seven", "1.5"])
def test_a_malformed_or_empty_number_reads_as_unset(name: str, value: str) -> None:
    ctx = from_environ({"TETO_JOB_ID": "j", name: value})
    assert (ctx.epoch, ctx.attempt, ctx.checkpoint_every) == (None, None, None)


@pytest.mark.parametrize(("rank", "world", "kept"), [("x", "y", "z"), ("", "", ""), ("0", "0", "-3")])
def test_rank_world_and_kept_fall_back_to_a_single_process_keeping_everything(rank: str, world: str,
                                                                              kept: str) -> None:
    ctx = from_environ({"TETO_RANK": rank, "TETO_WORLD_SIZE": world, "TETO_CHECKPOINTS_KEPT": kept})
    assert (ctx.rank, ctx.world_size, ctx.checkpoints_kept) == (0, 1, 0)


@pytest.mark.parametrize("params", ["not json", "[1, 2]", '"text"', "3", "null"])
def test_parameters_that_are_not_a_json_object_read_as_none(params: str) -> None:
    assert from_environ({"TETO_PARAMS": params}).params == {}


def test_empty_paths_read_as_unset() -> None:
    ctx = from_environ({"TETO_RESUME_FROM": "", "TETO_WORK_DIR": "", "TETO_CHECKPOINT_DIR": "", "TETO_DEVICE": ""})
    assert (ctx.resume_from, ctx.work_dir, ctx.checkpoint_dir, ctx.device) == (None, None, Path("checkpoints"),
                                                                                "cpu")


def test_the_sdk_reads_its_own_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sdk_link.state, "installed", True)  # no SIGTERM handler in the test process
    monkeypatch.setenv("TETO_JOB_ID", "j-env")
    monkeypatch.setenv("TETO_RANK", "3")
    ctx = sdk.context()
    assert (ctx.job_id, ctx.rank, ctx.in_teto) == ("j-env", 3, True)
    assert sdk.Context is Context
