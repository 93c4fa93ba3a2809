"""A gang worker's torch.distributed variables (agents/executor/distenv.py) and that the launch gives them."""

from __future__ import annotations

import pytest

from agents.executor import distenv, launch
from agents.executor.settings import ExecutorSettings
from libs.contracts.agents import RunJob
from tests.support import builders

pytestmark = pytest.mark.unit

TORCHRUN = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
            "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "NODE_RANK", "TORCHELASTIC_RUN_ID",
            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS"}


def _grant(rank: int = 0, world: int = 2, rendezvous: str | None = "10.0.0.5:29517") -> RunJob:
    spec = builders.command_spec("python", "train.py", env={"RANK": "7", "MASTER_PORT": "1"}, workers=world)
    return builders.grant(spec, epoch=3, executor_id="e1", rank=rank, world_size=world, rendezvous=rendezvous)


@pytest.mark.parametrize(("rendezvous", "host", "port"), [
    ("10.0.0.5:29517", "10.0.0.5", "29517"), ("node-a:1", "node-a", "1"), ("[fd00::1]:29500", "fd00::1", "29500")],
    ids=str)
def test_the_rendezvous_splits_into_host_and_port(rendezvous, host, port):
    assert distenv.split_rendezvous(rendezvous) == (host, port)


@pytest.mark.parametrize("rank", [0, 1, 2], ids=lambda r: f"rank {r}")
def test_every_gang_worker_gets_what_torchrun_would_give_it_as_its_own_node(rank):
    env = distenv.torch_env(_grant(rank=rank, world=3))
    assert set(env) == TORCHRUN
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (str(rank), "3", "0", "1")
    assert env["GROUP_RANK"] == env["NODE_RANK"] == env["ROLE_RANK"] == str(rank)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.5", "29517")
    assert env["TORCHELASTIC_RUN_ID"] == "j1-3"  # one per gang attempt


@pytest.mark.parametrize(("world", "rendezvous"), [(1, None), (1, "h:1"), (2, None)], ids=str)
def test_a_single_worker_or_a_gang_without_a_rendezvous_gets_none(world, rendezvous):
    assert distenv.torch_env(_grant(world=world, rendezvous=rendezvous)) == {}


def test_the_launch_gives_them_over_the_users_own_and_says_the_progress_interval(tmp_path):
    settings = ExecutorSettings(executor_id="e1", work_dir=tmp_path / "w", checkpoint_dir=tmp_path / "c",
                                progress_interval_seconds=2.5)
    env = launch.build(_grant(rank=1), settings, [], resume_from=None, base_env={}).env
    assert env["RANK"] == "1" and env["MASTER_PORT"] == "29517"  # Teto's, not the user's 7 and 1
    assert env["TETO_PROGRESS_INTERVAL"] == "2.5"
    single = launch.build(_grant(world=1, rendezvous=None), settings, [], resume_from=None, base_env={}).env
    assert TORCHRUN & set(single) == {"RANK", "MASTER_PORT"}  # only the user's own, as given
    assert (single["RANK"], single["MASTER_PORT"]) == ("7", "1")
