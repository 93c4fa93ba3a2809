"""Teto as a Slurm guest, the pure rules (libs/slurm/rules.py, libs/slurm/commands.py's parsing, the status view
of teto/slurm/view.py): pilot phases, whose drain a node's is, drain reasons, the ceiling against the time limit."""

from __future__ import annotations

import pytest

from libs.slurm import commands, rules
from libs.slurm.commands import PilotJob
from libs.slurm.rules import PilotPhase
from teto.slurm import view


@pytest.mark.parametrize("state, phase", sorted(rules.JOB_PHASES.items()), ids=str)
def test_every_slurm_job_state_has_a_pilot_phase(state, phase):
    assert rules.pilot_phase(state) is phase
    assert rules.pilot_phase(f"{state} by 0") is phase  # squeue's "CANCELLED by 0"


@pytest.mark.parametrize("state", [None, "", "SOMETHING_NEW"])
def test_an_unknown_job_state_is_unknown_not_a_guess(state):
    assert rules.pilot_phase(state) is PilotPhase.UNKNOWN


def test_only_running_pilots_run_and_only_ended_ones_are_ended():
    running = {s for s, p in rules.JOB_PHASES.items() if p is PilotPhase.RUNNING}
    assert running == {"RUNNING", "SIGNALING"}
    assert {"COMPLETED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL"} <= {
        s for s, p in rules.JOB_PHASES.items() if p is PilotPhase.ENDED}


@pytest.mark.parametrize("state, drained", [
    ("IDLE+DRAIN", True), ("MIXED+DRAIN", True), ("ALLOCATED+DRAIN", True), ("DRAINED", True), ("DRAINING", True),
    ("IDLE+DRAIN+MAINTENANCE+RESERVED", True), ("idle+drain", True), ("IDLE", False), ("ALLOCATED", False),
    ("DOWN*", False), ("IDLE+NOT_RESPONDING", False), ("", False),
])
def test_a_drain_is_seen_whatever_else_the_node_is_doing(state, drained):
    assert rules.drained(state) is drained


@pytest.mark.parametrize("state, reason, resume", [
    ("IDLE+DRAIN", "teto: matmul failed: wrong result", True),
    ("MIXED+DRAIN", "  teto: drained: disk swap", True),
    ("IDLE+DRAIN", "admin: replacing a DIMM", False),  # an administrator's drain is theirs to undo
    ("IDLE+DRAIN", None, False),
    ("IDLE+DRAIN", "Teto: capital", False),
    ("IDLE", "teto: matmul failed", False),  # not drained (any more): nothing to resume
    ("DOWN", "teto: matmul failed", False),
])
def test_teto_resumes_only_a_node_it_drained(state, reason, resume):
    assert rules.may_resume(state, reason) is resume


@pytest.mark.parametrize("state, pending", [
    ("IDLE+DRAIN+REBOOT_REQUESTED", True), ("MIXED+DRAIN+REBOOT_REQUESTED", True),
    ("DOWN+DRAIN+REBOOT_ISSUED", False), ("IDLE+DRAIN", False), ("IDLE", False),
])
def test_a_reboot_still_waiting_for_an_idle_node_is_pending(state, pending):
    assert rules.reboot_pending(state) is pending


def test_a_slow_figure_is_named_with_its_value_and_the_median_it_missed():
    verdict = {"reason": "copy_gbps 1.2 is below 0.75 x 10.4 (group median of 3)", "comparisons": [
        {"metric": "copy_gbps", "value": 1.2, "reference": 10.4, "source": "group median of 3", "ok": False},
        {"metric": "fill_gbps", "value": 9.0, "reference": 9.1, "source": "group median of 3", "ok": True}]}
    assert rules.drain_reason([("membw", verdict)]) == "teto: membw copy_gbps 1.2 vs median 10.4"


def test_a_baseline_is_named_as_one():
    verdict = {"comparisons": [{"metric": "tflops_bfloat16", "value": 350.123456, "reference": 700, "ok": False,
                                "source": "baseline"}]}
    assert rules.drain_reason([("matmul", verdict)]) == "teto: matmul tflops_bfloat16 350.1 vs baseline 700"


def test_a_test_failed_by_the_node_itself_says_why_on_one_line():
    assert rules.drain_reason([("matmul", {"reason": "result differs\nfrom the float64 reference"}),
                               ("nvml", {})]) == ("teto: matmul failed: result differs from the float64 reference; "
                                                  "nvml failed: failed")


def test_a_reason_fits_slurm():
    long = rules.drain_reason([("matmul", {"reason": "x" * 5000})])
    assert long.startswith("teto: matmul failed: x") and len(long) == rules.REASON_MAX
    assert rules.drain_reason([]) == "teto: failed its health checks"
    assert rules.operator_drain_reason("disk\nswap") == "teto: drained: disk swap"
    assert rules.operator_drain_reason(None) == "teto: drained: drained by an operator"


@pytest.mark.parametrize("remaining, devices, left, lead, warned", [
    (3600, 1, 7200, 120, False),  # fits
    (3600, 1, 3000, 120, True),  # an hour of ceiling, 48 minutes of allocation
    (7200, 4, 3000, 120, False),  # four devices spend it four times as fast
    (3600, 1, 3700, 120, True),  # fits the limit, not the signal lead before it
    (3600, 0, 3000, 120, True),  # a CPU-only run counts as one device
    (None, 1, 100, 60, False),  # no ceiling known
    (3600, 1, None, 60, False),  # no time limit
    (10, 1, 30, 60, True),  # already past the lead
])
def test_a_ceiling_that_outlasts_the_allocation_is_said(remaining, devices, left, lead, warned):
    warning = rules.ceiling_warning(remaining, devices, left, lead)
    assert (warning is not None) is warned
    if warned:
        assert "outlasts this pilot's Slurm allocation" in warning and f"{lead:.0f}s before the time limit" in warning


def test_squeue_and_scontrol_output_are_read_as_slurm_writes_them():
    jobs = commands.parse_squeue("12|RUNNING|n1|2:00|1:38|gpu|teto-pilot\n13|PENDING||UNLIMITED|UNLIMITED|gpu|"
                                 "teto-pilot\n\ngarbage\n")
    assert jobs == [PilotJob("12", "RUNNING", "n1", "2:00", "1:38", "gpu"),
                    PilotJob("13", "PENDING", None, "UNLIMITED", "UNLIMITED", "gpu")]
    node = commands.parse_node("NodeName=n2 Arch=x86_64 State=IDLE+DRAIN ThreadsPerCore=1 "
                               "Reason=teto: matmul tflops 1.2 vs median 3 [root@2026-12-05T02:39:06]\n")
    assert node["State"] == "IDLE+DRAIN" and node["Reason"] == "teto: matmul tflops 1.2 vs median 3"
    assert "Reason" not in commands.parse_node("NodeName=n1 State=IDLE")
    assert commands.cluster_name("Configuration data\nClusterName             = hpc\nKillWait = 30 sec\n") == "hpc"
    assert commands.cluster_name("KillWait = 30 sec\n") is None


def test_slurm_commands_take_the_reason_as_one_argument():
    assert commands.drain("n2", "teto: a b 'c'") == ["scontrol", "update", "NodeName=n2", "State=DRAIN",
                                                     "Reason=teto: a b 'c'"]
    assert commands.resume("n2") == ["scontrol", "update", "NodeName=n2", "State=RESUME"]
    assert commands.reboot("n2", "teto: r") == ["scontrol", "reboot", "ASAP", "nextstate=DOWN", "reason=teto: r",
                                                "n2"]
    assert commands.cancel_reboot("n2") == ["scontrol", "update", "NodeName=n2", "State=CANCEL_REBOOT"]
    assert commands.cancel_all_pilots("ops", "gpu") == ["scancel", "--name=teto-pilot", "--user=ops", "--partition=gpu"]
    assert commands.cancel_all_pilots("ops") == ["scancel", "--name=teto-pilot", "--user=ops"]


def test_status_puts_each_pilot_beside_its_teto_node():
    jobs = [PilotJob("12", "RUNNING", "n1", "2:00", "1:38", "gpu"), PilotJob("13", "PENDING", None, "", "", "gpu"),
            PilotJob("14", "RUNNING", "n3", "", "", "gpu")]
    teto = [{"node_id": "n1-12", "state": "ready", "schedulable": True},
            {"node_id": "n3-14", "state": "checking", "schedulable": False}]
    slurm = {"n1": {"State": "ALLOCATED"}, "n3": {"State": "MIXED+DRAIN", "Reason": "teto: x"},
             "n5": {"State": "IDLE+DRAIN", "Reason": "teto: matmul failed: y"},
             "n6": {"State": "IDLE+DRAIN", "Reason": "admin: dimm"}}
    rows = view.rows(jobs, "hpc", teto, slurm)
    assert [(r["job_id"], r["phase"], r["teto_node"], r["teto_state"], r["node_state"]) for r in rows] == [
        ("12", "running", "n1-12", "ready", "ALLOCATED"), ("13", "waiting", None, None, None),
        ("14", "running", "n3-14", "checking", "MIXED+DRAIN")]
    assert view.drained_without_pilot(slurm, [j.node for j in jobs]) == [
        {"slurm_node": "n5", "node_state": "IDLE+DRAIN", "node_reason": "teto: matmul failed: y"}]
