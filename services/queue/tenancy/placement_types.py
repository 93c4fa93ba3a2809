"""What the placement (``placement.plan``) reads and decides: the snapshot it works on (schedulable nodes, queued
and running jobs, organisations, cohorts, budget accounts) and its plan (jobs admitted on which executors, jobs
preempted for whom, and why each job left waiting waits). Types only, and the one order free nodes are taken in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from .budget import BudgetAccount
from .model import Cohort, Organisation, Pending, Running


@dataclass(frozen=True)
class Node:
    """A schedulable executor (ready, not cordoned), busy or free."""

    executor_id: str
    group: str
    gpus: int
    free: bool = True
    environments: frozenset[str] = frozenset()  # the Python environments its executor offers (environments.py)


class WaitCode(StrEnum):
    NO_ORGANISATION = "no_organisation"  # the job's organisation does not exist (any more)
    ORGANISATION_INVALID = "organisation_invalid"  # its organisation's stored settings are refused (tenancy/orgs.py)
    NO_QUOTA = "no_quota"  # its organisation has no share of any group that could run it
    QUOTA = "quota"  # at nominal + borrowing limit, or the cohort's shared devices are in use
    BUDGET = "budget"  # the organisation's period budget cannot reserve its remaining ceiling
    NO_READY_NODE = "no_ready_node"  # no ready node has the GPUs one worker needs
    NO_ENVIRONMENT = "no_environment"  # no ready node offers the Python environment the job names
    GANG_CANNOT_FIT = "gang_cannot_fit"  # no node group has as many ready nodes as the gang has workers
    BEHIND = "behind"  # quota and budget allow it; the nodes it fits are taken by jobs ahead of it
    RECLAIMING = "reclaiming"  # borrowed capacity is being preempted for it
    GANG_SEQUENTIAL = "gang_sequential"  # gangs are admitted one at a time and another is first


@dataclass(frozen=True)
class Wait:
    job_id: str
    code: WaitCode
    reason: str
    numbers: dict[str, float] = field(default_factory=dict)
    group: str | None = None  # reclaiming: the node group it will run in


@dataclass(frozen=True)
class Admit:
    job_id: str
    org: str
    group: str
    workers: tuple[str, ...]  # executor ids, rank order
    borrowing: int  # devices its organisation holds above nominal once it runs (0: within nominal)
    rank: int  # its place in this pass's order, from 1
    why: str  # its organisation's share when it was chosen
    reserved_gpu_seconds: float = 0.0
    devices: int = 0  # what it holds against its organisation's quota (its nodes' devices)


@dataclass(frozen=True)
class Preempt:
    job_id: str
    org: str
    for_job: str
    for_org: str
    reason: str


@dataclass(frozen=True)
class Snapshot:
    orgs: Mapping[str, Organisation]
    nodes: Sequence[Node]
    pending: Sequence[Pending]
    running: Sequence[Running] = ()
    cohorts: Mapping[str, Cohort] = field(default_factory=dict)
    budgets: Mapping[str, BudgetAccount] = field(default_factory=dict)
    broken: Mapping[str, str] = field(default_factory=dict)  # organisations set aside, with why (tenancy/orgs.py)


@dataclass(frozen=True)
class Plan:
    admitted: list[Admit]
    waiting: dict[str, Wait]
    preempted: list[Preempt]
    order: list[str]  # the organisations' fair-share order at the start of the pass, explained
    usage: dict[str, dict[str, int]]  # devices held per org and group once the admitted jobs run
    budgets: dict[str, BudgetAccount]


def smallest(node: Node) -> tuple[int, str]:
    """The order free nodes are taken in: fewest GPUs first (a CPU job does not hold an eight-GPU node a later
    GPU job needs), then by id, so the choice is total."""
    return node.gpus, node.executor_id
