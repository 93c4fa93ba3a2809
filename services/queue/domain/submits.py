"""The rules of deciding a fetched batch of submits together (pure: no database, no clock reads).

A batch is decided in one transaction, but each submit keeps its own answer: a refusal is about that submit
alone, a command id seen before is answered with its stored outcome, and a command id that comes twice in one
batch (a redelivery fetched beside its original) is decided once, the second answered like a redelivery.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from libs.contracts.jobs import JobSpec, RunLimits
from libs.contracts.policies import GangPolicy

from .gang_admission import spec_refusal
from .facts import Refusal

C = TypeVar("C")


@dataclass(frozen=True)
class Target:
    """What the database says about where a submit puts its job."""

    org_exists: bool
    project_exists: bool
    run_limits: RunLimits | None = None  # the organisation's most per run, and its default (OrgSpec.run_limits)


def first_of_each(ids: Sequence[str]) -> list[int]:
    """The positions of each id's first occurrence, in order; later occurrences are repeats."""
    seen: set[str] = set()
    firsts: list[int] = []
    for i, command_id in enumerate(ids):
        if command_id not in seen:
            seen.add(command_id)
            firsts.append(i)
    return firsts


def needs_policy(specs: Iterable[JobSpec]) -> bool:
    """Only a spec that asks for its own ready timeout is checked against the gang policy."""
    return any(spec.ready_timeout_seconds is not None for spec in specs)


def target_refusal(org: str, project: str, target: Target) -> Refusal | None:
    """A job's organisation and project must exist (the default ones always do)."""
    if not target.org_exists:
        return Refusal(f"organisation {org} does not exist", {})
    if not target.project_exists:
        return Refusal(f"project {project} does not exist in organisation {org}", {})
    return None


LIMIT_FIELDS = ("memory_mb", "pids", "disk_mb")


def limits_refusal(spec: JobSpec, org: str, target: Target) -> Refusal | None:
    """A job may not ask for more memory, processes or disk per run than its organisation allows."""
    most = target.run_limits
    if most is None:
        return None
    for name in LIMIT_FIELDS:
        asked, allowed = getattr(spec.limits, name), getattr(most, name)
        if asked is not None and allowed is not None and asked > allowed:
            return Refusal(f"limits.{name} {asked} is more than organisation {org} allows per run ({allowed})",
                           {"limit": name, "asked": asked, "allowed": allowed})
    return None


def with_org_limits(spec: JobSpec, target: Target | None) -> JobSpec:
    """The spec a job is stored and granted with: each limit it leaves unset is its organisation's (at submit:
    a later change of the organisation's limits applies to jobs submitted after it)."""
    most = target.run_limits if target is not None else None
    if most is None:
        return spec
    merged = {name: getattr(spec.limits, name) if getattr(spec.limits, name) is not None else getattr(most, name)
              for name in LIMIT_FIELDS}
    return spec if merged == spec.limits.model_dump() else spec.model_copy(update={"limits": RunLimits(**merged)})


def environments_named(specs: Iterable[JobSpec]) -> list[str]:
    """The Python environments some spec names (only those are looked up among the executors'). Pure."""
    return sorted({spec.environment for spec in specs if spec.environment is not None})


def environment_refusal(spec: JobSpec, offered: Collection[str]) -> Refusal | None:
    """A job naming a Python environment no executor offers would wait forever: refused, with the name (issue 27).
    Pure."""
    if spec.environment is None or spec.environment in offered:
        return None
    return Refusal(f"no node offers the Python environment {spec.environment} (prepare it on the nodes with teto "
                   "env create and list it in their TETO_ENVIRONMENTS)", {"environment": spec.environment})


def submit_refusal(spec: JobSpec, org: str, policy: GangPolicy | None,
                   targets: Mapping[tuple[str, str], Target], offered: Collection[str] = ()) -> Refusal | None:
    """Why this submit is refused, or None: the gang policy first (a gang may ask for a shorter ready timeout
    than the policy's, never a longer one), then its organisation and project, its limits, then its Python
    environment (``offered``: those of ``environments_named`` some executor offers). ``policy`` may be None only
    when the spec asks for no ready timeout (``needs_policy``)."""
    if spec.ready_timeout_seconds is not None:
        if policy is None:
            raise ValueError("a spec with its own ready timeout needs the gang policy")
        found = spec_refusal(spec, policy)
        if found is not None:
            return Refusal(*found)
    target = targets[(org, spec.project)]
    return (target_refusal(org, spec.project, target) or limits_refusal(spec, org, target)
            or environment_refusal(spec, offered))
