"""Commands (``teto.cmd.<kind>``) and their outcomes (``teto.outcome.<kind>.<command_id>``).

Every command carries ``command_id`` (the idempotency key: a command seen twice acts once), ``actor`` and
``issued_at``. The stream keeps them durably and the audit service stores every one; the owner of the fact
answers with an outcome: accepted, or refused with a reason a person can read and the numbers behind it.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from .bounds import Actor, Id, JsonObject, Label, Reason, Time
from .envelope import Envelope, new_id, utcnow
from .jobs import JobSpec
from .policies import GangPolicy
from .nodes import CheckTest
from .tenancy import DEFAULT_ORG, CohortSpec, OrgSpec, ProjectSpec


class Command(Envelope):
    KIND: ClassVar[str] = ""

    command_id: Id = Field(default_factory=new_id, description="The idempotency key: seen twice, acts once")
    actor: Actor = Field(description="Who issued it (a token's actor); no control characters")
    issued_at: Time = Field(default_factory=utcnow)


class SubmitJob(Command):
    SCHEMA = "teto.cmd.submit/1"
    KIND = "submit"

    job_id: Id = Field(default_factory=new_id)
    spec: JobSpec
    org: Id = Field(DEFAULT_ORG, description="The organisation the job belongs to (the token's)")


class CancelJob(Command):
    SCHEMA = "teto.cmd.cancel/1"
    KIND = "cancel"

    job_id: Id
    reason: Reason = Field("cancelled by operator", max_length=1000)


class RequeueJob(Command):
    SCHEMA = "teto.cmd.requeue/1"
    KIND = "requeue"

    job_id: Id
    gpu_ceiling_seconds: float = Field(gt=0, le=10**9, description="The new TOTAL ceiling, not an increment")


class RunHealthCheck(Command):
    """An on-demand check run of a group or of nodes (``fleet:manage``); answered by the health service."""

    SCHEMA = "teto.cmd.run_health_check/1"
    KIND = "run_health_check"

    run_id: Id = Field(default_factory=new_id)
    group: Id | None = None
    nodes: list[Id] = Field(default_factory=list, max_length=1000)
    tests: list[CheckTest] = Field(default_factory=list, description="Empty: the whole suite")
    force: bool = Field(False, description="Busy nodes: checkpoint and requeue their job first (no attempt spent)")


class DrainNode(Command):
    SCHEMA = "teto.cmd.drain_node/1"
    KIND = "drain_node"

    node_id: Id
    reason: Reason = Field("drained by operator", max_length=1000)


class UndrainNode(Command):
    SCHEMA = "teto.cmd.undrain_node/1"
    KIND = "undrain_node"

    node_id: Id


class ClearGroupAlert(Command):
    """Clear a group's systemic-failure alert (``fleet:manage``): replacing resumes with a fresh budget, held
    nodes return to scheduling, and nodes the breaker kept failed are checked again. Answered by health."""

    SCHEMA = "teto.cmd.clear_group_alert/1"
    KIND = "clear_group_alert"

    group: Id
    reason: Reason = Field("cleared by operator", max_length=1000)


class SetGangPolicy(Command):
    """Replace the gang policy (``PUT /v1/policies/gang``); the queue applies it from its next admission."""

    SCHEMA = "teto.cmd.set_policy/1"
    KIND = "set_policy"

    policy: GangPolicy


class SetOrganisation(Command):
    """Create or replace an organisation (``policy:admin``); the queue applies it from its next admission."""

    SCHEMA = "teto.cmd.set_org/1"
    KIND = "set_org"

    name: Id
    spec: OrgSpec


class SetProject(Command):
    """Create or replace a project of an organisation (``policy:admin``)."""

    SCHEMA = "teto.cmd.set_project/1"
    KIND = "set_project"

    org: Id
    name: Id
    spec: ProjectSpec = Field(default_factory=ProjectSpec)


class SetCohort(Command):
    """Create or replace a cohort's preemption policy (``policy:admin``)."""

    SCHEMA = "teto.cmd.set_cohort/1"
    KIND = "set_cohort"

    name: Id
    spec: CohortSpec


COMMANDS: dict[str, type[Command]] = {c.KIND: c for c in (SubmitJob, CancelJob, RequeueJob, RunHealthCheck,
                                                          DrainNode, UndrainNode, SetGangPolicy,
                                                          ClearGroupAlert, SetOrganisation, SetProject, SetCohort)}


class CommandOutcome(Envelope):
    SCHEMA = "teto.outcome/1"

    command_id: Id
    kind: Id
    accepted: bool
    reason: Reason | None = Field(None, description="Why it was refused (absent when accepted)")
    detail: JsonObject = Field(default_factory=dict, description="Numbers behind a refusal, ids made")
    job_id: Id | None = None
    by: Label = Field(description="The service that decided")
