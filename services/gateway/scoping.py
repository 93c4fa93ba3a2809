"""Who may see and do what with a job, beyond the role's permissions: pure rules, no I/O.

- Tenant scoping: a principal without ``read:all`` (viewer, submitter) sees only the jobs it owns. A job that
  is not theirs is *not found* (404), never *forbidden*, so job ids are not confirmed to exist. Lists that
  name a job elsewhere (executors, nodes) keep the fleet's shape but hide another owner's job id, epoch and
  step: a tenant may see that a node is busy, not with whose job.
- Usage reports follow the same rule (``usage_owner``): without ``read:all`` only one's own jobs' GPU-seconds
  and counts, and a total that is their sum, not the ledger's.
- Idempotency keys are scoped to the actor: the command and job id are a hash of (actor, key), so the same key
  sent by two actors names two jobs, and nobody can reach another's job through its key.
- ``command`` workloads run the user's own code on the nodes: they need ``finetune:command`` and, when the
  installation sets an allow-list, an argv that starts with one of its prefixes.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .auth import Permission, Principal

# Columns of the executor and node views that say which job runs there (hidden from other tenants).
JOB_COLUMNS = ("job_id", "epoch", "step")
_KEY_ID_PREFIX = "k-"


def sees_all(principal: Principal) -> bool:
    return principal.can(Permission.READ_ALL)


def may_see(principal: Principal, owner: str | None) -> bool:
    """Whether the principal may see (and so learn the existence of) a job owned by ``owner``."""
    return sees_all(principal) or (owner is not None and owner == principal.actor)


def owner_filter(principal: Principal, asked: str | None) -> tuple[str | None, bool]:
    """The owner a job list is restricted to, and whether the list is empty by rule (a scoped principal
    asking for someone else's jobs gets an empty list, as if that owner had none)."""
    if sees_all(principal):
        return asked, False
    if asked is not None and asked != principal.actor:
        return principal.actor, True
    return principal.actor, False


def usage_owner(principal: Principal) -> str | None:
    """The one owner a usage report is restricted to (None: every owner). Usage is scoped like jobs: GPU-seconds
    and job counts are facts about jobs, so a principal without ``read:all`` sees its own and nobody else's,
    grouped however it asks (``group_by=user`` then has one row, its own)."""
    return None if sees_all(principal) else principal.actor


def hide_other_jobs(rows: Iterable[Mapping[str, Any]], owners: Mapping[str, str | None],
                    principal: Principal) -> list[dict[str, Any]]:
    """Executor or node rows with another owner's job id (and its epoch and step) blanked out."""
    out = []
    for row in rows:
        row = dict(row)
        job_id = row.get("job_id")
        if job_id is not None and not may_see(principal, owners.get(job_id)):
            row.update({c: None for c in JOB_COLUMNS if c in row})
        left = row.get("left_job")  # the job that left the executor (domain/departures.py): the same rule
        if left and not may_see(principal, owners.get(left.get("job_id"))):
            row["left_job"] = {k: None for k in left}
        out.append(row)
    return out


def job_id_for_key(actor: str, key: str) -> str:
    """The command and job id of a submit with ``Idempotency-Key: key`` by ``actor``: deterministic (a retry
    by the same actor acts once and gets its own job back), distinct per actor (SHA-256 of both, the actor
    length-prefixed so no (actor, key) pair reads as another), and a valid id (``[A-Za-z0-9_-]``, 66 chars)."""
    name = actor.encode()
    digest = hashlib.sha256(b"teto-idempotency/1\0%d:" % len(name) + name + key.encode()).hexdigest()
    return _KEY_ID_PREFIX + digest


# -- command allow-list ------------------------------------------------------------------------------------


class AllowListError(ValueError):
    """An allow-list setting that cannot be read (refused at start-up, naming the variable)."""


def parse_allow_list(text: str) -> tuple[tuple[str, ...], ...]:
    """Argv prefixes from a JSON list (each item a string = one argv element, or a list of strings) or, when
    the text is not JSON, one prefix per line in shell syntax (``python3 -m mytrainer``; ``#`` comments)."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            items = json.loads(stripped)
        except ValueError as exc:
            raise AllowListError(f"not valid JSON: {exc}") from None
        prefixes = []
        for item in items:
            if isinstance(item, str):
                item = [item]
            if not (isinstance(item, list) and item and all(isinstance(a, str) for a in item)):
                raise AllowListError(f"each prefix must be a string or a non-empty list of strings, not {item!r}")
            prefixes.append(tuple(item))
        return tuple(prefixes)
    prefixes = []
    for line in stripped.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise AllowListError(f"line {line!r}: {exc}") from None
        if words:
            prefixes.append(tuple(words))
    return tuple(prefixes)


def load_allow_list(value: str | None, file: Path | None) -> tuple[tuple[str, ...], ...] | None:
    """The installation's allow-list (None: every command allowed). Both settings add up."""
    if value is None and file is None:
        return None
    prefixes = parse_allow_list(value) if value is not None else ()
    if file is not None:
        try:
            prefixes += parse_allow_list(file.read_text())
        except OSError as exc:
            raise AllowListError(f"cannot read {str(file)!r}: {exc.strerror}") from None
    return prefixes


def command_refusal(argv: Sequence[str], allowed: Sequence[Sequence[str]] | None) -> str | None:
    """Why this argv may not run here (None: it may). A prefix matches whole argv elements, so ``["python3",
    "-m", "trainer"]`` allows ``python3 -m trainer --lr 1`` and not ``python3 -m trainer_evil`` or ``python3 -c``."""
    if allowed is None:
        return None
    for prefix in allowed:
        if len(argv) >= len(prefix) and tuple(argv[:len(prefix)]) == tuple(prefix):
            return None
    shown = [shlex.join(p) for p in allowed][:10]
    return (f"command {shlex.join(argv[:4])[:200]!r} does not start with a prefix this installation allows "
            f"(TETO_COMMAND_ALLOW): {shown}")
