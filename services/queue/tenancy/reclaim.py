"""Step 4 of a placement pass (``placement.plan``): borrowed capacity reclaimed for jobs that wait within their
organisation's nominal share, in a cohort whose policy allows it. Victims are borrowing jobs of the same cohort,
this pass's own borrowing admissions first (they have not started), then running ones, lowest priority and newest
first, only as many as make the job fit, and only when enough does (a preemption that would not let it start is
not made).
"""

from __future__ import annotations

from collections.abc import Mapping

from . import budget
from . import environments
from . import quota
from .model import Organisation, Pending, Preemption, Running
from .placement_pass import PassState
from .placement_types import Admit, Node, Preempt, Wait, WaitCode, smallest


def reclaim(state: PassState, decided: list[Pending], waiting: dict[str, Wait],
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
    spare = {g: sorted(free, key=smallest) for g, free in state.free.items()}
    # Jobs preempted by an earlier pass and still stopping: what they hold is already being given back.
    for run in snap.running:
        if run.stopping:
            gone.add(run.job_id)
            quota.add(state.usage, run.org, run.group, -run.devices)
            spare.setdefault(run.group, []).extend(nodes[e] for e in run.executors if e in nodes)
    for group_spare in spare.values():
        group_spare.sort(key=smallest)
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
            if need is None or quota.held(state.usage, org.name, group) + need > org.quota(group).nominal:
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
                quota.add(state.usage, run.org, group, -run.devices)
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
            quota.add(state.usage, org.name, group, need)  # held for it: later jobs see it taken
            waiting[job.job_id] = Wait(job.job_id, WaitCode.RECLAIMING,
                                       f"reclaiming {need} devices of node group {group} by preemption of borrowed "
                                       f"capacity ({stopped} job(s) preempted for it)",
                                       {"preempted_jobs": stopped, "devices": need}, group)
            break
    return out, undone


def _release(state: PassState, org: str, job_id: str) -> None:
    """A budget reservation made for an admission taken back: released, nothing used."""
    account = state.budgets.get(org)
    if account is not None and job_id in account.reservations:
        state.budgets[org] = budget.settle(account, job_id, 0.0)


def _take(spare: list[Node], job: Pending) -> list[Node] | None:
    """``spare`` without the smallest nodes the job's workers take (its GPUs, its environment); None when there
    are not enough."""
    workers, gpus, env = job.workers, job.gpus_per_worker, job.environment
    fitting = [i for i, n in enumerate(spare) if n.gpus >= gpus and (env is None or env in n.environments)][:workers]
    if len(fitting) < workers:
        return None
    drop = set(fitting)
    return [n for i, n in enumerate(spare) if i not in drop]


def _victims(state: PassState, org: Organisation, job: Pending, need: int, group: str, policy: Preemption, gone: set[str],
             spare: list[Node], nodes: Mapping[str, Node], borrowers: list[Running]) -> list[Running] | None:
    """The fewest borrowed jobs whose end lets ``job`` fit, this pass's ``borrowers`` first (they have not
    started), then running ones, lowest priority and newest first; None if none do. On success ``spare`` loses
    the nodes the job will take and gains the rest of what its victims free."""
    snap = state.snap
    usage = quota.copy(state.usage)
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
        candidates.sort(key=lambda r: not any(environments.offers(nodes[e].environments, job.environment)
                                              for e in r.executors if e in nodes))
    chosen: list[Running] = []

    def enough() -> list[Node] | None:
        if not quota.check(org, group, need, usage, snap.orgs, state.members).fits:
            return None
        return _take(pool, job)

    for run in candidates:
        if enough() is not None:
            break
        if quota.borrowed(snap.orgs[run.org], group, usage) <= 0:
            continue  # that organisation is back within its nominal share: its jobs stay
        chosen.append(run)
        quota.add(usage, run.org, group, -run.devices)
        pool.extend(nodes[e] for e in run.executors if e in nodes)
        pool.sort(key=smallest)
    rest = enough()
    if rest is None:
        return None  # an empty choice that is enough: nodes an earlier reclaim in this pass freed beyond its need
    spare[:] = rest
    return chosen
