"""Quotas in a cohort, as arithmetic on devices held per (organisation, node group).

Per group, each metered organisation has a nominal share, a borrowing limit and a lending limit. Its
*guaranteed* part (nominal minus what it lends) is its own; the *lendable* parts of every member form the
cohort's pool. Usage above an organisation's guaranteed part draws on the pool, so borrowing is possible
exactly while others leave their lendable share idle. An organisation holds at most nominal + borrowing limit.
An unmetered organisation (no quotas, the default organisation of an installation without tenancy) is bounded
only by the fleet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from .model import Organisation

Usage = Mapping[str, Mapping[str, int]]  # org -> group -> devices held


class QuotaVerdict(StrEnum):
    FITS = "fits"  # within the quota (possibly borrowing)
    NO_QUOTA = "no_quota"  # the organisation has no share of this group and cannot borrow one
    AT_LIMIT = "at_limit"  # it would hold more than nominal + borrowing limit
    COHORT_FULL = "cohort_full"  # the cohort's pool is used up (by borrowers: reclaimable)


@dataclass(frozen=True)
class QuotaCheck:
    verdict: QuotaVerdict
    borrowing: int = 0  # devices above nominal the organisation would hold
    reason: str = ""
    numbers: dict[str, float] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return self.verdict is QuotaVerdict.FITS


def held(usage: Usage, org: str, group: str) -> int:
    return usage.get(org, {}).get(group, 0)


Members = Mapping[str, list[Organisation]]  # cohort -> its metered organisations (``cohort_members``)


class Cohorts(dict[str, list[Organisation]]):
    """Every cohort's metered members (``cohort_members``), with what a quota check reads of them per node group
    kept once worked out: the pool (the lendable parts summed) and each member's guaranteed part. Organisations
    do not change during a placement pass, which checks quotas hundreds of times; usage does, and is read anew."""

    def __init__(self, members: Mapping[str, list[Organisation]]) -> None:
        super().__init__(members)
        self._pools: dict[tuple[str, str], int] = {}
        self._guaranteed: dict[tuple[str, str], list[tuple[str, int]]] = {}
        self._member: dict[str, tuple[str, Organisation]] = {o.name: (c, o) for c, ms in members.items() for o in ms}

    def pool(self, cohort: str, group: str) -> int:
        key = (cohort, group)
        if key not in self._pools:
            self._pools[key] = sum(o.quota(group).lendable for o in self.get(cohort, ()))
        return self._pools[key]

    def pool_used(self, cohort: str, group: str, usage: Usage) -> int:
        if isinstance(usage, Held) and usage.cohorts is self:  # counted as the usage changed
            return usage.pool_used(cohort, group)
        return self.count_pool_used(cohort, group, usage)

    def cohort_of(self, org: str) -> tuple[str, Organisation] | None:
        """The cohort a metered member is in, with the member; None for any other organisation."""
        return self._member.get(org)

    def count_pool_used(self, cohort: str, group: str, usage: Usage) -> int:
        """What the members hold above their guaranteed parts, summed member by member."""
        key = (cohort, group)
        guaranteed = self._guaranteed.get(key)
        if guaranteed is None:
            guaranteed = self._guaranteed[key] = [(o.name, o.quota(group).guaranteed) for o in self.get(cohort, ())]
        used = 0
        for name, part in guaranteed:
            over = usage.get(name, {}).get(group, 0) - part
            if over > 0:
                used += over
        return used


def members(orgs: Mapping[str, Organisation], cohort: str | None) -> list[Organisation]:
    return [] if cohort is None else [o for o in orgs.values() if o.cohort == cohort and o.metered]


def cohort_members(orgs: Mapping[str, Organisation]) -> Cohorts:
    """Every cohort's metered members at once (``members`` of each): a placement pass reads them per quota check,
    hundreds of times, from organisations that do not change during the pass."""
    out: dict[str, list[Organisation]] = {}
    for org in orgs.values():
        if org.cohort is not None and org.metered:
            out.setdefault(org.cohort, []).append(org)
    return Cohorts(out)


def _of(orgs: Mapping[str, Organisation], cohort: str, by_cohort: Members | None) -> list[Organisation]:
    return members(orgs, cohort) if by_cohort is None else by_cohort.get(cohort, [])


def pool(orgs: Mapping[str, Organisation], cohort: str, group: str, by_cohort: Members | None = None) -> int:
    """Devices of a group the cohort's members lend: the most that may be held above guarantees."""
    if isinstance(by_cohort, Cohorts):
        return by_cohort.pool(cohort, group)
    return sum(o.quota(group).lendable for o in _of(orgs, cohort, by_cohort))


def pool_used(orgs: Mapping[str, Organisation], cohort: str, group: str, usage: Usage,
              by_cohort: Members | None = None) -> int:
    if isinstance(by_cohort, Cohorts):
        return by_cohort.pool_used(cohort, group, usage)
    return sum(max(0, held(usage, o.name, group) - o.quota(group).guaranteed) for o in _of(orgs, cohort, by_cohort))


def borrowed(org: Organisation, group: str, usage: Usage) -> int:
    """Devices held above nominal: what reclaiming may take back."""
    if not org.metered:
        return 0
    return max(0, held(usage, org.name, group) - org.quota(group).nominal)


def check(org: Organisation, group: str, demand: int, usage: Usage,
          orgs: Mapping[str, Organisation], by_cohort: Members | None = None) -> QuotaCheck:
    """Whether ``org`` may hold ``demand`` more devices of ``group``, with the numbers of a refusal.
    ``by_cohort``: ``cohort_members(orgs)``, when the caller checks many times against the same organisations."""
    if not org.metered:
        return QuotaCheck(QuotaVerdict.FITS)
    quota = org.quota(group)
    now = held(usage, org.name, group)
    after = now + demand
    ceiling = org.ceiling(group)
    if ceiling == 0:
        return QuotaCheck(QuotaVerdict.NO_QUOTA,
                          reason=f"no quota: organisation {org.name} has no share of node group {group}"
                                 + ("" if org.cohort else " and is in no cohort to borrow from"),
                          numbers={"nominal": 0, "job_devices": demand})
    if ceiling is not None and after > ceiling:
        return QuotaCheck(QuotaVerdict.AT_LIMIT,
                          reason=f"quota: organisation {org.name} holds {now} of its {ceiling} devices in node group "
                                 f"{group} (nominal {quota.nominal} + borrowing {ceiling - quota.nominal}), "
                                 f"job needs {demand}",
                          numbers={"held": now, "ceiling": ceiling, "nominal": quota.nominal, "job_devices": demand})
    borrowing = max(0, after - quota.nominal)
    if org.cohort is None or after <= quota.guaranteed:
        return QuotaCheck(QuotaVerdict.FITS, borrowing=borrowing)
    total = pool(orgs, org.cohort, group, by_cohort)
    used = pool_used(orgs, org.cohort, group, usage, by_cohort)
    extra = max(0, after - quota.guaranteed) - max(0, now - quota.guaranteed)
    if used + extra > total:
        return QuotaCheck(QuotaVerdict.COHORT_FULL,
                          reason=f"cohort {org.cohort}: {used} of the {total} shared devices of node group {group} "
                                 f"are in use, job needs {extra} of them",
                          numbers={"pool": total, "pool_used": used, "job_devices": demand},
                          borrowing=borrowing)
    return QuotaCheck(QuotaVerdict.FITS, borrowing=borrowing)


def add(usage: dict[str, dict[str, int]], org: str, group: str, amount: int) -> None:
    if isinstance(usage, Held):
        usage.add(org, group, amount)
        return
    by_group = usage.setdefault(org, {})
    by_group[group] = by_group.get(group, 0) + amount


def copy(usage: Usage) -> dict[str, dict[str, int]]:
    if isinstance(usage, Held):
        return usage.copy()
    return {org: dict(groups) for org, groups in usage.items()}


class Held(dict[str, dict[str, int]]):
    """Devices held per organisation and node group (a ``Usage``) that counts each cohort's pool use per group as
    it changes: a placement pass checks quotas hundreds of times between admissions, and summing every member's
    use above its guaranteed part on each check was a quarter of the planner. A (cohort, group)'s use is summed
    once, when first asked, and then moved by each ``add`` (the change of that member's use above its guaranteed
    part). Change it only through ``add`` (``quota.add`` does): an inner dict written directly is not counted."""

    def __init__(self, cohorts: Cohorts, usage: Usage | None = None) -> None:
        super().__init__({org: dict(groups) for org, groups in (usage or {}).items()})
        self.cohorts = cohorts
        self._used: dict[tuple[str, str], int] = {}

    def add(self, org: str, group: str, amount: int) -> None:
        by_group = self.setdefault(org, {})
        before = by_group.get(group, 0)
        by_group[group] = before + amount
        member = self.cohorts.cohort_of(org)
        if member is not None and (key := (member[0], group)) in self._used:
            guaranteed = member[1].quota(group).guaranteed
            self._used[key] += max(0, before + amount - guaranteed) - max(0, before - guaranteed)

    def pool_used(self, cohort: str, group: str) -> int:
        key = (cohort, group)
        used = self._used.get(key)
        if used is None:
            used = self._used[key] = self.cohorts.count_pool_used(cohort, group, self)
        return used

    def copy(self) -> Held:
        """An independent copy (its changes and counts its own), counted as far as this one is."""
        out = Held(self.cohorts, self)
        out._used = dict(self._used)
        return out
