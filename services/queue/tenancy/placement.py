"""The placement: the queue's one planner, run by every placement pass (``scheduler.py``). On a snapshot, as a
pure function: which queued jobs take which free executors, which running jobs are preempted to give an
organisation its nominal share back, and why every job left waiting waits. Its types are in
``placement_types``, the admission of one job against the pass's state in ``placement_pass``, step 4 in
``reclaim``; this module holds the order of the pass.

The pass (numbered as in ``plan``):
1. Devices held per (organisation, node group) from the running jobs; capacity per group from ready nodes.
2. Each organisation's queue in priority order, then age (then id, so the order is total).
3. Repeatedly take the head job of the organisation that comes first: jobs within their organisation's nominal
   share before borrowing ones, then the lowest weighted dominant share (``fairshare``). The job is admitted
   when its organisation's budget can reserve its remaining ceiling, its quota fits in one node group, and that
   group has enough free nodes (a gang: all its workers in one group, all or nothing). Otherwise it waits with
   the reason and its organisation's next job is considered (a small job may pass a big one that cannot start).
   A worker fits a node with at least its GPUs (0 asks for none: any node, CPU-only included); of the free
   nodes that fit, the smallest are taken (then by id), so big nodes stay free for big jobs.
4. A job that waits for capacity within its own nominal share, in a cohort that allows it, reclaims borrowed
   capacity: running jobs of borrowing members are chosen, lowest priority and newest first, only as many as
   make the job fit, and only when enough does (a preemption that would not let it start is not made).
5. Jobs waiting for a free node learn how many jobs are ahead of them.
"""

from __future__ import annotations

import heapq

from . import quota
from .fairshare import dominant_share, explain_order, order_key
from .model import Pending
from .placement_pass import PassState
from .placement_types import Admit, Plan, Snapshot, Wait, WaitCode
from .reclaim import reclaim


def _job_order(job: Pending) -> tuple:
    return (-job.priority, job.created_at, job.job_id)


def plan(snap: Snapshot) -> Plan:
    # 1. Usage, capacity and free nodes.
    state = PassState(snap)
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
    usage = quota.copy(state.usage)
    preempted, undone = reclaim(state, decided, waiting, admitted)
    state.usage = usage
    for a in undone:  # borrowers of this pass that give their nodes back to a reclaim: never started
        quota.add(state.usage, a.org, a.group, -a.devices)
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
