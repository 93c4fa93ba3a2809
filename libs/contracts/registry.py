"""Every message type and the subject it travels on, for the generated JSON Schema and docs/events.md."""

from __future__ import annotations

from dataclasses import dataclass

from .agents import RunJob, StopJob
from .audit import AuditAnchor, AuditVerifyReply, AuditVerifyRequest
from .budget import BudgetEvent, BudgetStatusReply, BudgetStatusRequest, OrgBudgetReply, OrgBudgetRequest
from .commands import (CancelJob, ClearGroupAlert, CommandOutcome, DrainNode, RequeueJob, RunHealthCheck,
                       SetCohort, SetGangPolicy, SetOrganisation, SetProject, SubmitJob, UndrainNode)
from .dead import DeadLetter
from .envelope import Envelope, RejectedMessage
from .jobs import JobEvent
from .logs import LogChunk
from .leases import LeaseEvent, LeaseRenewReply, LeaseRenewRequest
from .status import ReplicaStatus, StatusRequest
from .nodes import CheckReport, NodeEvent, NodeRegistered, RebootNode, RunChecks, SignalChanged
from .telemetry import (CheckpointReport, CheckpointSkipped, CheckpointStoreNote, Heartbeat, RunFinished, RunStarted, StepReport,
                        WorkerReady)
from .usage import UsageReport


@dataclass(frozen=True)
class Entry:
    model: type[Envelope]
    subject: str  # pattern, with <placeholders>
    stream: str | None  # stream base name, None for core request/reply
    publisher: str
    description: str


CATALOGUE: tuple[Entry, ...] = (
    Entry(SubmitJob, "teto.cmd.submit", "CMD", "gateway", "Submit a job"),
    Entry(CancelJob, "teto.cmd.cancel", "CMD", "gateway", "Cancel a job"),
    Entry(RequeueJob, "teto.cmd.requeue", "CMD", "gateway", "Requeue an interrupted job with a new total ceiling"),
    Entry(SetGangPolicy, "teto.cmd.set_policy", "CMD", "gateway", "Replace the gang admission policy"),
    Entry(SetOrganisation, "teto.cmd.set_org", "CMD", "gateway", "Create or replace an organisation and its quotas"),
    Entry(SetProject, "teto.cmd.set_project", "CMD", "gateway", "Create or replace a project of an organisation"),
    Entry(SetCohort, "teto.cmd.set_cohort", "CMD", "gateway", "Create or replace a cohort's preemption policy"),
    Entry(RunHealthCheck, "teto.cmd.run_health_check", "CMD", "gateway", "Run deep checks on a group or nodes"),
    Entry(DrainNode, "teto.cmd.drain_node", "CMD", "gateway", "Take a node out of scheduling"),
    Entry(UndrainNode, "teto.cmd.undrain_node", "CMD", "gateway", "Return a drained node (re-checked first)"),
    Entry(ClearGroupAlert, "teto.cmd.clear_group_alert", "CMD", "gateway",
          "Clear a group's systemic-failure alert (replacing resumes)"),
    Entry(CommandOutcome, "teto.outcome.<kind>.<command_id>", "OUTCOME", "owning service", "Command accepted/refused"),
    Entry(JobEvent, "teto.job.<job_id>.<event>", "JOB", "queue", "Job-state change, ordered per job by seq"),
    Entry(SignalChanged, "teto.job.<job_id>.signal", "JOB", "health", "Job signal changed (ok/no_signal/stuck)"),
    Entry(LeaseEvent, "teto.lease.<job_id>.<event>", "LEASE", "queue", "Lease granted/renewed/expired/released"),
    Entry(LeaseRenewRequest, "teto.rpc.lease.renew.<executor_id>", None, "executor", "Renew a lease (request)"),
    Entry(LeaseRenewReply, "(reply inbox)", None, "queue", "Renewal acknowledged or lease lost"),
    Entry(RunJob, "teto.agent.<executor_id>.run", "AGENT", "queue", "Lease grant: run this job"),
    Entry(StopJob, "teto.agent.<executor_id>.stop", "AGENT", "queue", "Stop the training process of a job"),
    Entry(Heartbeat, "teto.hb.<executor_id>", "HB", "executor", "Liveness, phase, step, GPU usage sample"),
    Entry(UsageReport, "teto.usage.<executor_id>", "USAGE", "executor", "GPU usage records, each charged once"),
    Entry(NodeRegistered, "teto.node.<node_id>.registered", "NODE", "executor", "Agent started on a node"),
    Entry(NodeEvent, "teto.node.<node_id>.<event>", "NODE", "health", "Node lifecycle change, ordered per node"),
    Entry(RunChecks, "teto.agent.<executor_id>.check", "AGENT", "health", "Run deep checks on this node"),
    Entry(RebootNode, "teto.agent.<executor_id>.reboot", "AGENT", "health", "Reboot (restart the agent)"),
    Entry(CheckReport, "teto.check.<run_id>.<status>.<executor_id>", "NODE", "executor", "Check progress/result per test"),
    Entry(RunStarted, "teto.progress.<job_id>.<executor_id>", "PROGRESS", "executor", "Training process started"),
    Entry(StepReport, "teto.progress.<job_id>.<executor_id>", "PROGRESS", "executor", "Step, loss, step duration"),
    Entry(CheckpointReport, "teto.progress.<job_id>.<executor_id>", "PROGRESS", "executor", "Checkpoint written (atomic)"),
    Entry(CheckpointSkipped, "teto.progress.<job_id>.<executor_id>", "PROGRESS", "executor", "Corrupt checkpoint skipped"),
    Entry(CheckpointStoreNote, "teto.progress.<job_id>.<executor_id>", "PROGRESS", "executor",
          "Checkpoint uploading to the store, or a resume waiting for it"),
    Entry(RunFinished, "teto.progress.<job_id>.<executor_id>", "PROGRESS", "executor", "Training process ended"),
    Entry(WorkerReady, "teto.progress.<job_id>.<executor_id>", "PROGRESS", "executor", "Gang worker's process group formed"),
    Entry(LogChunk, "teto.logs.<job_id>.<attempt>.<rank>.<executor_id>", "LOGS", "executor",
          "A chunk of a run's stdout or stderr (the final one: exit status and last lines)"),
    Entry(BudgetEvent, "teto.budget.<job_id>.<event>", "BUDGET", "budget", "Ceiling warning / exhausted"),
    Entry(BudgetStatusRequest, "teto.rpc.budget.status", None, "queue, gateway", "Ask consumed GPU-seconds"),
    Entry(BudgetStatusReply, "(reply inbox)", None, "budget", "Ceiling and consumed GPU-seconds"),
    Entry(OrgBudgetRequest, "teto.rpc.budget.orgs", None, "queue",
          "Organisations' GPU-seconds this period and jobs' consumption (budget reservation)"),
    Entry(OrgBudgetReply, "(reply inbox)", None, "budget", "GPU-seconds per organisation since a time, per job"),
    Entry(RejectedMessage, "teto.rejected.<service>", "REJECTED", "any consumer", "A malformed message refused"),
    Entry(DeadLetter, "teto.dead.<service>", "DEAD", "any consumer", "A message given up on, with the reason"),
    Entry(AuditAnchor, "teto.audit.anchor", "AUDIT_ANCHOR", "audit", "The audit chain head, kept where no "
          "database writer reaches (no delete, no purge)"),
    Entry(AuditVerifyRequest, "teto.rpc.audit.verify", None, "gateway", "Verify the audit log (chain, macs, anchors)"),
    Entry(AuditVerifyReply, "(reply inbox)", None, "audit",
          "The verdict: what was checked, the first bad row or anchor"),
    Entry(StatusRequest, "teto.rpc.status", None, "gateway", "Ask every replica of every service for its status"),
    Entry(ReplicaStatus, "(reply inbox)", None, "every service replica",
          "A replica's singletons held and consumer lag (one reply per replica)"),
)
