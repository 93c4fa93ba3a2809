"""The pilot job's shape (libs/slurm/pilot.py): sbatch's arguments, the batch script, the settings file, the
ids an agent takes from Slurm's environment, and Slurm's time syntax."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from libs.slurm.pilot import (JOB_NAME, PilotError, PilotRequest, batch_script, pilot_ids, sbatch_args,
                              settings_file, time_limit_seconds)

DIR = Path("/shared/pilots")


def test_a_pilot_holds_one_node_and_its_gpus_and_is_told_the_lead_time_before_its_limit():
    args = sbatch_args(PilotRequest(partition="gpu", gpus_per_node=4, time_limit="8:00:00", signal_lead_seconds=300,
                                    account="lab", qos="long", cpus_per_task=16), DIR)
    assert args[0] == "sbatch" and args[-1] == str(DIR / "pilot.sbatch")
    assert {"--parsable", f"--job-name={JOB_NAME}", "--partition=gpu", "--nodes=1", "--ntasks=1", "--gres=gpu:4",
            "--time=8:00:00", "--signal=B:USR1@300", "--account=lab", "--qos=long", "--cpus-per-task=16",
            "--export=NONE", f"--output={DIR}/pilot-%j.out", f"--chdir={DIR}"} == set(args[1:-1])


def test_what_is_not_asked_is_not_passed():
    args = sbatch_args(PilotRequest(partition="cpu"), DIR)
    assert not [a for a in args if a.startswith(("--gres", "--time", "--account", "--qos", "--cpus", "--exclude"))]


def test_a_replacement_is_kept_off_the_nodes_it_replaces_and_site_options_pass_as_they_are():
    args = sbatch_args(PilotRequest(partition="gpu", exclude=("n7", "n2"), extra=("--constraint=a100",)), DIR)
    assert "--exclude=n2,n7" in args and "--constraint=a100" in args


@pytest.mark.parametrize("request_, why", [
    (PilotRequest(partition=""), "partition"),
    (PilotRequest(partition="gpu;rm"), "partition"),
    (PilotRequest(partition="gpu", gpus_per_node=-1), "gpus-per-node"),
    (PilotRequest(partition="gpu", time_limit="1", signal_lead_seconds=60), "not longer than the signal lead"),
    (PilotRequest(partition="gpu", time_limit="tomorrow"), "Slurm's syntax"),
    (PilotRequest(partition="gpu", signal_lead_seconds=5), "signal lead"),
    (PilotRequest(partition="gpu", extra=("-w n1",)), "long option"),
], ids=["empty", "shell", "gpus", "lead-over-limit", "bad-time", "lead-too-short", "short-option"])
def test_a_request_slurm_would_misread_is_refused(request_, why):
    with pytest.raises(PilotError, match=why):
        sbatch_args(request_, DIR)


def test_a_request_survives_its_file():
    req = PilotRequest(partition="gpu", gpus_per_node=2, time_limit="1-00:00", account="a", exclude=("n1",),
                       extra=("--mem=0",), group="hpc")
    assert PilotRequest.from_dict(req.as_dict()) == req


def test_the_batch_script_becomes_the_agent_after_reading_its_settings(tmp_path):
    script = batch_script("/opt/venv/bin/python", Path("/my pilots"))
    assert "set -a; . '/my pilots/pilot.env'; set +a" in script
    assert script.rstrip().endswith("exec /opt/venv/bin/python -m agents.executor.main")


def test_settings_are_quoted_so_the_shell_reads_back_exactly_what_was_written(tmp_path):
    values = {"TETO_NATS_URL": "nats://h:4222", "TETO_SECRET": "a b'c\"$(rm -rf /)`x`", "TETO_EMPTY": ""}
    (tmp_path / "pilot.env").write_text(settings_file(values))
    out = subprocess.run(["bash", "-c", f"set -a; . {shlex.quote(str(tmp_path / 'pilot.env'))}; set +a; env -0"],
                         capture_output=True, env={"PATH": os.environ["PATH"]}, check=True).stdout
    env = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    assert {k: env[k] for k in values} == values


def test_a_setting_name_the_shell_would_run_is_refused():
    with pytest.raises(PilotError):
        settings_file({"X;rm -rf /": "1"})


@pytest.mark.parametrize("env, ids", [
    ({"TETO_SLURM_PILOT": "1", "SLURM_JOB_ID": "42", "SLURMD_NODENAME": "gpu-07", "SLURM_CLUSTER_NAME": "hpc"},
     ("slurm-hpc-42", "gpu-07-42")),
    ({"TETO_SLURM_PILOT": "1", "SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1.rack"}, ("slurm-slurm-42", "n1-rack-42")),
    ({"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1"}, None),  # an agent started by hand in an allocation
    ({"TETO_SLURM_PILOT": "1", "SLURMD_NODENAME": "n1"}, None),
    ({"TETO_SLURM_PILOT": "1", "SLURM_JOB_ID": "42"}, None),
    ({}, None),
], ids=["pilot", "dotted-node", "not-a-pilot", "no-job", "no-node", "nothing"])
def test_a_pilot_is_the_job_and_its_node_is_where_it_runs(env, ids):
    assert pilot_ids(env) == ids


@pytest.mark.parametrize("text, seconds", [
    ("90", 5400), ("5:30", 330), ("2:00:00", 7200), ("1-0", 86400), ("1-2:30", 95400), ("2-00:00:10", 172810),
    ("UNLIMITED", None), ("INFINITE", None), ("", None), ("NOT_SET", None),
])
def test_slurm_time_syntax(text, seconds):
    assert time_limit_seconds(text) == seconds


@pytest.mark.parametrize("text", ["1:2:3:4", "abc", "-5", "1-", "5m"])
def test_what_is_not_slurm_time_is_refused(text):
    with pytest.raises(PilotError):
        time_limit_seconds(text)
