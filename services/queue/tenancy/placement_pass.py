"""The state of one placement pass (``PassState``): devices held per organisation and node group, capacity and
free nodes per group, budget accounts as reservations are made; and the admission of one job against it (its
shape, its organisation's budget and quota, the smallest free nodes that fit it, all or nothing for a gang).
``placement.plan`` decides the order jobs are tried in; this module decides each one.
"""

from __future__ import annotations

import bisect

from . import budget
from . import environments
from . import quota
from .fairshare import Share
from .model import Organisation, Pending
from .placement_types import Admit, Node, Snapshot, Wait, WaitCode, smallest


def _gpus(node: Node) -> int:
    return node.gpus


class PassState:
    """The mutable state of one pass: ``placement.plan`` drives it, ``reclaim`` reads and updates it."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.members = quota.cohort_members(snap.orgs)
        self.usage: dict[str, dict[str, int]] = quota.Held(self.members)  # cohorts' pool use counted as it changes
        for run in snap.running:
            quota.add(self.usage, run.org, run.group, run.devices)
        self.capacity: dict[str, int] = {}
        self.ready: dict[str, list[int]] = {}  # group -> gpus of each ready node
        self.free: dict[str, list[Node]] = {}  # group -> free nodes, smallest first
        for node in snap.nodes:
            self.capacity[node.group] = self.capacity.get(node.group, 0) + max(1, node.gpus)
            self.ready.setdefault(node.group, []).append(node.gpus)
            if node.free:
                self.free.setdefault(node.group, []).append(node)
        for nodes in self.free.values():
            nodes.sort(key=smallest)
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
        return any(need is not None and quota.held(self.usage, org.name, g) + need <= org.quota(g).nominal
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
            return Wait(job.job_id, WaitCode.NO_ENVIRONMENT, environments.missing_reason(job.environment))
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
            refused = budget.refusal(account, job.needs_gpu_seconds)
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
               account: budget.BudgetAccount | None, within_nominal: bool) -> Admit | Wait:
        refusals: list[quota.QuotaCheck] = []
        fitted_quota = False
        # Groups where the job stays within nominal first, so nobody borrows what is free in its own share.
        candidates = []
        checked: dict[str, tuple[int, quota.QuotaCheck]] = {}  # usage does not change before the second check
        for group in self.groups:
            need = self.demand(group, job)
            if need is None:
                continue
            result = quota.check(org, group, need, self.usage, self.snap.orgs, self.members)
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
            picked = environments.pick(free, first, job.workers, job.environment)
            chosen = free[picked.start:picked.stop] if isinstance(picked, range) else [free[i] for i in picked]
            if len(chosen) < job.workers:
                continue
            held = sum(max(1, n.gpus) for n in chosen)  # free nodes may be larger than the smallest ready ones
            need, result = checked[group]
            if held != need:  # larger free nodes than the smallest ready ones: the quota is asked again
                result = quota.check(org, group, held, self.usage, self.snap.orgs, self.members)
            if not result.fits or (within_nominal and result.borrowing):
                refusals.append(result)
                continue
            environments.remove(free, picked)
            quota.add(self.usage, org.name, group, held)
            if account is not None:
                reserved = budget.reserve(account, job.job_id, job.needs_gpu_seconds)
                assert isinstance(reserved, budget.BudgetAccount)  # refusal() said it fits
                self.budgets[org.name] = reserved
            return Admit(job.job_id, org.name, group, tuple(n.executor_id for n in chosen), result.borrowing, rank,
                         share.explain(), job.needs_gpu_seconds, held)
        if fitted_quota or not refusals:
            return Wait(job.job_id, WaitCode.BEHIND, "", {"devices": job.devices})
        # A limit reached says more than a group the organisation has no share of.
        refusal = ([r for r in refusals if r.verdict is not quota.QuotaVerdict.NO_QUOTA] or refusals)[0]
        code = WaitCode.NO_QUOTA if refusal.verdict is quota.QuotaVerdict.NO_QUOTA else WaitCode.QUOTA
        return Wait(job.job_id, code, refusal.reason, refusal.numbers)
