"""One admission pass under tenancy, on a snapshot, as a pure function: which queued jobs take which free
executors, which running jobs are preempted to give an organisation its nominal share back, and why every job
left waiting waits.

The pass (numbered as in ``plan``):
1. Devices held per (organisation, node group) from the running jobs; capacity per group from ready nodes.
2. Each organisation's queue in priority order, then age (then id, so the order is total).
3. Repeatedly take the head job of the organisation that comes first: jobs within their organisation's nominal
   share before borrowing ones, then the lowest weighted dominant share (``fairshare``). The job is admitted
   when its organisation's budget can reserve its remaining ceiling, its quota fits in one node group, and that
   group has enough free nodes (a gang: all its workers in one group, all or nothing). Otherwise it waits with
   the reason and its organisation's next job is considered (a small job may pass a big one that cannot start).
4. A job that waits for capacity within its own nominal share, in a cohort that allows it, reclaims borrowed
   capacity: running jobs of borrowing members are chosen, lowest priority and newest first, only as many as
   make the job fit, and only when enough does (a preemption that would not let it start is not made).
5. Jobs waiting for a free node learn how many jobs are ahead of them.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from . import budget as budgets
from . import environments as envs
from . import quota as quotas
from .fairshare import Share, dominant_share, explain_order, order_key
from .model import Cohort, Organisation, Pending, Preemption, Running


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
    budgets: Mapping[str, budgets.BudgetAccount] = field(default_factory=dict)
    broken: Mapping[str, str] = field(default_factory=dict)  # organisations set aside, with why (tenancy/orgs.py)


@dataclass(frozen=True)
class Plan:
    admitted: list[Admit]
    waiting: dict[str, Wait]
    preempted: list[Preempt]
    order: list[str]  # the organisations' fair-share order at the start of the pass, explained
    usage: dict[str, dict[str, int]]  # devices held per org and group once the admitted jobs run
    budgets: dict[str, budgets.BudgetAccount]


def _gpus(node: Node) -> int:
    return node.gpus


def _smallest(node: Node) -> tuple[int, str]:
    return node.gpus, node.executor_id


def _job_order(job: Pending) -> tuple:
    return (-job.priority, job.created_at, job.job_id)


class _Pass:
    """The mutable state of one pass; ``plan`` is its only user."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.members = quotas.cohort_members(snap.orgs)
        self.usage: dict[str, dict[str, int]] = quotas.Held(self.members)  # cohorts' pool use counted as it changes
        for run in snap.running:
            quotas.add(self.usage, run.org, run.group, run.devices)
        self.capacity: dict[str, int] = {}
        self.ready: dict[str, list[int]] = {}  # group -> gpus of each ready node
        self.free: dict[str, list[Node]] = {}  # group -> free nodes, smallest first
        for node in snap.nodes:
            self.capacity[node.group] = self.capacity.get(node.group, 0) + max(1, node.gpus)
            self.ready.setdefault(node.group, []).append(node.gpus)
            if node.free:
                self.free.setdefault(node.group, []).append(node)
        for nodes in self.free.values():
            nodes.sort(key=_smallest)
        for gpus in self.ready.values():
            gpus.sort()
        self.budgets = dict(snap.budgets)
        self.groups = sorted(self.ready)
        self._offering: dict[str | None, dict[str, list[int]]] = {None: self.ready}  # by environment: ready
        self._demand: dict[tuple[str, int, int, str | None], int | None] = {}
        self._fitting: dict[tuple[int, int, str | None], dict[str, int]] = {}
        # A job that cannot be placed waits for the same reason as the previous one of its organisation and
        # shape until something is admitted (usage and free nodes change only then): 15,000 queued jobs cost
        # one quota check per shape, not one each.
        self.admissions = 0
        self._waits: dict[tuple[str, int, int, str | None, bool], tuple[int, Wait]] = {}

    def ready_for(self, environment: str | None) -> dict[str, list[int]]:
        """Group -> GPUs of each ready node offering the environment (sorted; every ready node for None)."""
        if environment not in self._offering:
            offering: dict[str, list[int]] = {}
            for node in self.snap.nodes:
                if environment in node.environments:
                    offering.setdefault(node.group, []).append(node.gpus)
            self._offering[environment] = {g: sorted(gpus) for g, gpus in offering.items()}
        return self._offering[environment]

    def demand(self, group: str, job: Pending) -> int | None:
        """Devices the job would hold in a group: a worker holds its whole node (one job per executor), so the
        smallest ready nodes that fit, counted as the budget counts them; None when too few nodes fit."""
        key = (group, job.workers, job.gpus_per_worker, job.environment)
        if key not in self._demand:
            ready = self.ready_for(job.environment).get(group, ())
            fitting = [max(1, g) for g in ready if g >= job.gpus_per_worker][:job.workers]
            self._demand[key] = sum(fitting) if len(fitting) == job.workers else None
        return self._demand[key]

    def within_nominal(self, org: Organisation, job: Pending) -> bool:
        if not org.metered:
            return True
        return any(need is not None and quotas.held(self.usage, org.name, g) + need <= org.quota(g).nominal
                   for g in self.groups for need in (self.demand(g, job),))

    def shape_wait(self, job: Pending) -> Wait | None:
        """Waits no capacity can end: no node has the GPUs, or no group has enough such nodes."""
        key = (job.workers, job.gpus_per_worker, job.environment)
        if key not in self._fitting:
            ready = self.ready_for(job.environment)
            self._fitting[key] = {g: sum(1 for gpus in ready.get(g, ()) if gpus >= job.gpus_per_worker)
                                  for g in self.groups}
        fitting = self._fitting[key]
        if job.environment is not None and not self.ready_for(job.environment):
            return Wait(job.job_id, WaitCode.NO_ENVIRONMENT, envs.missing_reason(job.environment))
        if not any(fitting.values()):
            offering = "" if job.environment is None else f" offering the Python environment {job.environment}"
            return Wait(job.job_id, WaitCode.NO_READY_NODE,
                        f"no ready node{offering} has {job.gpus_per_worker} GPUs",
                        {"gpus_per_worker": job.gpus_per_worker})
        if max(fitting.values()) < job.workers:
            most = max(fitting.values())
            return Wait(job.job_id, WaitCode.GANG_CANNOT_FIT,
                        f"gang cannot fit: {job.workers} workers of {job.gpus_per_worker} GPUs, at most {most} "
                        "such ready nodes in one node group", {"workers": job.workers, "fitting_nodes": most})
        return None

    def try_admit(self, org: Organisation, job: Pending, rank: int, share: Share, *,
                  within_nominal: bool = False) -> Admit | Wait:
        """Admit the job now, or say why it waits. ``within_nominal``: only where its organisation would stay
        within its nominal share (the first phase of a pass)."""
        shape = self.shape_wait(job)
        if shape is not None:
            return shape
        account = self.budgets.get(org.name)
        if account is not None:
            refused = budgets.refusal(account, job.needs_gpu_seconds)
            if refused is not None:
                return Wait(job.job_id, WaitCode.BUDGET, refused.reason, refused.numbers)
        memo_key = (org.name, job.workers, job.gpus_per_worker, job.environment, within_nominal)
        memo = self._waits.get(memo_key)
        if memo is not None and memo[0] == self.admissions:
            return Wait(job.job_id, memo[1].code, memo[1].reason, memo[1].numbers, memo[1].group)
        found = self._place(org, job, rank, share, account, within_nominal)
        if isinstance(found, Wait):
            self._waits[memo_key] = (self.admissions, found)
        else:
            self.admissions += 1
        return found

    def _place(self, org: Organisation, job: Pending, rank: int, share: Share,
               account: budgets.BudgetAccount | None, within_nominal: bool) -> Admit | Wait:
        refusals: list[quotas.QuotaCheck] = []
        fitted_quota = False
        # Groups where the job stays within nominal first, so nobody borrows what is free in its own share.
        candidates = []
        checked: dict[str, tuple[int, quotas.QuotaCheck]] = {}  # usage does not change before the second check
        for group in self.groups:
            need = self.demand(group, job)
            if need is None:
                continue
            result = quotas.check(org, group, need, self.usage, self.snap.orgs, self.members)
            checked[group] = (need, result)
            if result.fits and not (within_nominal and result.borrowing):
                candidates.append((result.borrowing, group))
            else:
                refusals.append(result)
        for _, group in sorted(candidates):
            fitted_quota = True
            # Free nodes are sorted by GPUs, then id: those with enough GPUs are a tail, its first ones the
            # smallest that fit (found by bisection; a scan of every free node per admission was most of a pass),
            # those offering its environment where it names one.
            free = self.free.get(group, [])
            first = bisect.bisect_left(free, job.gpus_per_worker, key=_gpus)
            picked = envs.pick(free, first, job.workers, job.environment)
            chosen = free[picked.start:picked.stop] if isinstance(picked, range) else [free[i] for i in picked]
            if len(chosen) < job.workers:
                continue
            held = sum(max(1, n.gpus) for n in chosen)  # free nodes may be larger than the smallest ready ones
            need, result = checked[group]
            if held != need:  # larger free nodes than the smallest ready ones: the quota is asked again
                result = quotas.check(org, group, held, self.usage, self.snap.orgs, self.members)
            if not result.fits or (within_nominal and result.borrowing):
                refusals.append(result)
                continue
            envs.remove(free, picked)
            quotas.add(self.usage, org.name, group, held)
            if account is not None:
                reserved = budgets.reserve(account, job.job_id, job.needs_gpu_seconds)
                assert isinstance(reserved, budgets.BudgetAccount)  # refusal() said it fits
                self.budgets[org.name] = reserved
            return Admit(job.job_id, org.name, group, tuple(n.executor_id for n in chosen), result.borrowing, rank,
                         share.explain(), job.needs_gpu_seconds, held)
        if fitted_quota or not refusals:
            return Wait(job.job_id, WaitCode.BEHIND, "", {"devices": job.devices})
        # A limit reached says more than a group the organisation has no share of.
        refusal = ([r for r in refusals if r.verdict is not quotas.QuotaVerdict.NO_QUOTA] or refusals)[0]
        code = WaitCode.NO_QUOTA if refusal.verdict is quotas.QuotaVerdict.NO_QUOTA else WaitCode.QUOTA
        return Wait(job.job_id, code, refusal.reason, refusal.numbers)


def plan(snap: Snapshot) -> Plan:
    # 1. Usage, capacity and free nodes.
    state = _Pass(snap)
    shares = [dominant_share(o, state.usage, state.capacity) for o in snap.orgs.values()]
    order_text = explain_order(shares)
    # 2. Each organisation's queue: priority, then age.
    queues: dict[str, list[Pending]] = {}
    waiting: dict[str, Wait] = {}
    for job in snap.pending:
        if job.org in snap.broken:
            waiting[job.job_id] = Wait(job.job_id, WaitCode.ORGANISATION_INVALID,
                                       f"organisation {job.org}'s settings are refused ({snap.broken[job.org]}): "
                                       "an admin sets them again")
            continue
        if job.org not in snap.orgs:
            waiting[job.job_id] = Wait(job.job_id, WaitCode.NO_ORGANISATION, f"organisation {job.org} does not exist")
            continue
        queues.setdefault(job.org, []).append(job)
    for q in queues.values():
        q.sort(key=_job_order, reverse=True)  # popped from the end
    # 3. Head of the organisation that comes first, one job at a time: first every job that stays within its
    # organisation's nominal share (the others are deferred), then the deferred ones, which would borrow.
    admitted: list[Admit] = []
    decided: list[Pending] = []
    deferred: dict[str, list[Pending]] = {}
    for borrowing in (False, True):
        source = queues if not borrowing else {n: q[::-1] for n, q in deferred.items()}
        # An organisation's place changes only when it admits (its own usage): a heap of the others' keys holds.
        shares = {n: dominant_share(snap.orgs[n], state.usage, state.capacity) for n in source}
        heap = [(order_key(shares[n], borrowing), n) for n in source]
        heapq.heapify(heap)
        while heap:
            _, name = heapq.heappop(heap)
            org = snap.orgs[name]
            job = source[name].pop()
            if not borrowing and not state.within_nominal(org, job):
                deferred.setdefault(name, []).append(job)
            else:
                result = state.try_admit(org, job, len(decided) + 1, shares[name], within_nominal=not borrowing)
                if isinstance(result, Admit):
                    decided.append(job)
                    admitted.append(result)
                    shares[name] = dominant_share(org, state.usage, state.capacity)
                elif borrowing:
                    decided.append(job)
                    waiting[job.job_id] = result
                else:  # not within its nominal share now: it may still borrow in the second phase
                    deferred.setdefault(name, []).append(job)
            if source[name]:
                heapq.heappush(heap, (order_key(shares[name], borrowing), name))
    # 4. Reclaim borrowed capacity for jobs waiting within their nominal share (on a copy of the usage: what
    # it holds back for them is not yet held).
    usage = quotas.copy(state.usage)
    preempted, undone = _reclaim(state, decided, waiting, admitted)
    state.usage = usage
    for a in undone:  # borrowers of this pass that give their nodes back to a reclaim: never started
        quotas.add(state.usage, a.org, a.group, -a.devices)
    admitted = [a for a in admitted if a not in undone]
    # 5. How many jobs are ahead of each one waiting for a node.
    for ahead, job in enumerate(decided):
        wait = waiting.get(job.job_id)
        if wait is not None and wait.code is WaitCode.BEHIND:
            waiting[job.job_id] = Wait(job.job_id, WaitCode.BEHIND,
                                       f"behind {ahead} jobs of higher priority or fair share: no free node of "
                                       f"{job.gpus_per_worker} GPUs for {job.workers} worker(s) now",
                                       {"ahead": ahead, **wait.numbers})
    return Plan(admitted, waiting, preempted, order_text, state.usage, state.budgets)


def _reclaim(state: _Pass, decided: list[Pending], waiting: dict[str, Wait],
             admitted: list[Admit]) -> tuple[list[Preempt], list[Admit]]:
    """Preemptions for jobs waiting within their nominal share, and this pass's borrowing admissions taken back
    for them (a borrower admitted a moment ago gives its nodes back before any running job is stopped: it has
    lost nothing; otherwise a borrower could take the last free node a reclaim needed together with a victim's)."""
    snap = state.snap
    out: list[Preempt] = []
    undone: list[Admit] = []
    gone: set[str] = set()
    priority = {p.job_id: p.priority for p in snap.pending}
    fresh = {a.job_id: a for a in admitted if a.borrowing > 0}
    borrowers = [Running(a.job_id, a.org, a.group, a.devices, priority.get(a.job_id, 0), None, a.workers)
                 for a in fresh.values()]
    nodes = {n.executor_id: n for n in snap.nodes}
    # Nodes a reclaiming job may count on: the free ones, then those its victims free; each is counted once.
    spare = {g: sorted(free, key=_smallest) for g, free in state.free.items()}
    # Jobs preempted by an earlier pass and still stopping: what they hold is already being given back.
    for run in snap.running:
        if run.stopping:
            gone.add(run.job_id)
            quotas.add(state.usage, run.org, run.group, -run.devices)
            spare.setdefault(run.group, []).extend(nodes[e] for e in run.executors if e in nodes)
    for group_spare in spare.values():
        group_spare.sort(key=_smallest)
    # A search for victims that found none finds none again for a job of the same organisation, group, shape (and
    # priority, where it limits the victims) until a reclaim succeeds: usage, ``gone`` and ``spare`` change only
    # then. 10,000 waiting jobs cost one search per such key, not one each (each is a walk of the running jobs).
    failed: set[tuple] = set()
    for job in decided:
        wait = waiting.get(job.job_id)
        if wait is None or wait.code not in (WaitCode.QUOTA, WaitCode.BEHIND):
            continue
        org = snap.orgs[job.org]
        cohort = snap.cohorts.get(org.cohort) if org.cohort else None
        policy = cohort.preemption if cohort else Preemption.NEVER
        if not org.metered or policy is Preemption.NEVER:
            continue
        for group in state.groups:
            need = state.demand(group, job)
            if need is None or quotas.held(state.usage, org.name, group) + need > org.quota(group).nominal:
                continue  # reclaiming gives back a nominal share, never more
            key = (org.name, group, need, job.workers, job.gpus_per_worker, job.environment,
                   job.priority if policy is Preemption.BY_PRIORITY else None)
            if key in failed:
                continue
            victims = _victims(state, org, job, need, group, policy, gone, spare.setdefault(group, []), nodes,
                               borrowers)
            if victims is None:
                failed.add(key)
                continue
            failed.clear()
            for run in victims:
                gone.add(run.job_id)
                quotas.add(state.usage, run.org, group, -run.devices)
                if run.job_id in fresh:
                    undone.append(fresh[run.job_id])
                    _release(state, run.org, run.job_id)
                    waiting[run.job_id] = Wait(run.job_id, WaitCode.QUOTA,
                                               f"cohort {org.cohort}: node group {group} is reclaimed by organisation "
                                               f"{org.name} within its nominal share", {"devices": run.devices},
                                               group)
                    continue
                out.append(Preempt(run.job_id, run.org, job.job_id, org.name,
                                   f"preempted: organisation {run.org} borrowed {run.devices} devices of node group "
                                   f"{group}; organisation {org.name} reclaims its nominal share for job "
                                   f"{job.job_id}"))
            stopped = sum(1 for run in victims if run.job_id not in fresh)
            quotas.add(state.usage, org.name, group, need)  # held for it: later jobs see it taken
            waiting[job.job_id] = Wait(job.job_id, WaitCode.RECLAIMING,
                                       f"reclaiming {need} devices of node group {group} by preemption of borrowed "
                                       f"capacity ({stopped} job(s) preempted for it)",
                                       {"preempted_jobs": stopped, "devices": need}, group)
            break
    return out, undone


def _release(state: _Pass, org: str, job_id: str) -> None:
    """A budget reservation made for an admission taken back: released, nothing used."""
    account = state.budgets.get(org)
    if account is not None and job_id in account.reservations:
        state.budgets[org] = budgets.settle(account, job_id, 0.0)


def _take(spare: list[Node], job: Pending) -> list[Node] | None:
    """``spare`` without the smallest nodes the job's workers take (its GPUs, its environment); None when there
    are not enough."""
    workers, gpus, env = job.workers, job.gpus_per_worker, job.environment
    fitting = [i for i, n in enumerate(spare) if n.gpus >= gpus and (env is None or env in n.environments)][:workers]
    if len(fitting) < workers:
        return None
    drop = set(fitting)
    return [n for i, n in enumerate(spare) if i not in drop]


def _victims(state: _Pass, org: Organisation, job: Pending, need: int, group: str, policy: Preemption, gone: set[str],
             spare: list[Node], nodes: Mapping[str, Node], borrowers: list[Running]) -> list[Running] | None:
    """The fewest borrowed jobs whose end lets ``job`` fit, this pass's ``borrowers`` first (they have not
    started), then running ones, lowest priority and newest first; None if none do. On success ``spare`` loses
    the nodes the job will take and gains the rest of what its victims free."""
    snap = state.snap
    usage = quotas.copy(state.usage)
    pool = list(spare)
    candidates = [r for r in snap.running if r.group == group and r.job_id not in gone and r.org != org.name
                  and r.preemptible
                  and snap.orgs.get(r.org) is not None and snap.orgs[r.org].cohort == org.cohort
                  and (policy is Preemption.RECLAIM_BORROWED or r.priority < job.priority)]
    candidates.sort(key=lambda r: (r.priority, -(r.admitted_at.timestamp() if r.admitted_at else 0.0), r.job_id))
    candidates = [r for r in borrowers if r.group == group and r.job_id not in gone and r.org != org.name
                  and snap.orgs.get(r.org) is not None and snap.orgs[r.org].cohort == org.cohort
                  and (policy is Preemption.RECLAIM_BORROWED or r.priority < job.priority)] + candidates
    if job.environment is not None and _take(pool, job) is None:  # nodes offering its environment are missing:
        # those that free one first (the others free only quota), each kind in the usual order
        candidates.sort(key=lambda r: not any(envs.offers(nodes[e].environments, job.environment)
                                              for e in r.executors if e in nodes))
    chosen: list[Running] = []

    def enough() -> list[Node] | None:
        if not quotas.check(org, group, need, usage, snap.orgs, state.members).fits:
            return None
        return _take(pool, job)

    for run in candidates:
        if enough() is not None:
            break
        if quotas.borrowed(snap.orgs[run.org], group, usage) <= 0:
            continue  # that organisation is back within its nominal share: its jobs stay
        chosen.append(run)
        quotas.add(usage, run.org, group, -run.devices)
        pool.extend(nodes[e] for e in run.executors if e in nodes)
        pool.sort(key=_smallest)
    rest = enough()
    if rest is None:
        return None  # an empty choice that is enough: nodes an earlier reclaim in this pass freed beyond its need
    spare[:] = rest
    return chosen
