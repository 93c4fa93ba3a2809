"""API tokens, roles and permissions: who may call which endpoint.

A gateway connected to PostgreSQL keeps tokens, sign-in sessions and role bindings in its own schema
(identity.py), shared by every replica. The tokens file ({"tokens": [{"id", "actor", "role", "sha256",
"created_at", "revoked"}]}, only SHA-256 hashes of the secrets) is what a gateway without a database uses, and
what an upgraded installation's tokens are imported from (never lost, revocations kept). The secret is shown
once, when the token is made. Roles map to permissions exactly as DESIGN.md section 10 says; every endpoint
declares the one permission it needs through ``require(...)``, which answers 401 (no or unknown token) or 403
(naming the permission). A principal signed in through OpenID Connect may hold several roles; it may do what
any of them allows, and each role names the claim or binding it came from (``grants``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError

from libs.contracts.bounds import Actor

from .domain.attempts import Scope

_ACTOR = TypeAdapter(Actor)


def check_actor(actor: str) -> str:
    """The actor every command of the token will carry: the contract's rule (1-200 characters, no control
    characters), checked when the token is made, so no token can issue commands the bus would refuse."""
    actor = actor.strip()
    try:
        return _ACTOR.validate_python(actor)
    except ValidationError as exc:
        problem = exc.errors()[0].get("msg", "invalid") if exc.errors() else "invalid"
        raise ValueError(f"actor {actor[:60]!r}: {problem} (1-200 characters, no control characters)") from None


class Permission(StrEnum):
    READ = "read"  # jobs, events, executors (one's own jobs only, without read:all)
    READ_ALL = "read:all"  # every owner's jobs, not only one's own (tenant scoping, scoping.py)
    FINETUNE_SUBMIT = "finetune:submit"  # submit jobs (the built-in fine-tune)
    FINETUNE_COMMAND = "finetune:command"  # submit ``command`` workloads: the user's own code on the nodes
    FINETUNE_MANAGE = "finetune:manage"  # cancel any job, requeue with a new ceiling
    FLEET_MANAGE = "fleet:manage"  # nodes: drain, checks
    POLICY_ADMIN = "policy:admin"  # scheduling policies
    AUDIT_READ = "audit:read"  # the audit log and its verification
    TOKENS_ADMIN = "tokens:admin"  # create and revoke API tokens


class Role(StrEnum):
    VIEWER = "viewer"  # read only, own jobs
    SUBMITTER = "submitter"  # viewer + submit the built-in fine-tune
    OPERATOR = "operator"  # submitter + command workloads, every job, manage jobs and the fleet
    AUDITOR = "auditor"  # viewer + every job + the audit log
    ADMIN = "admin"  # everything, tokens included


_P = Permission
ROLE_PERMISSIONS: dict[Role, frozenset[Permission]] = {
    Role.VIEWER: frozenset({_P.READ}),
    Role.SUBMITTER: frozenset({_P.READ, _P.FINETUNE_SUBMIT}),
    Role.OPERATOR: frozenset({_P.READ, _P.READ_ALL, _P.FINETUNE_SUBMIT, _P.FINETUNE_COMMAND, _P.FINETUNE_MANAGE,
                              _P.FLEET_MANAGE}),
    Role.AUDITOR: frozenset({_P.READ, _P.READ_ALL, _P.AUDIT_READ}),
    Role.ADMIN: frozenset(Permission),
}


def allows(role: Role | str, permission: Permission | str) -> bool:
    try:
        return Permission(permission) in ROLE_PERMISSIONS[Role(role)]
    except ValueError:
        return False


class Failure(StrEnum):
    """Credentials that did not hold: each is counted against the source (and its actor when it names one),
    logged and audited (throttle.py)."""

    UNKNOWN_TOKEN = "unknown_token"  # a bearer token (or a session's) that no token record has
    REVOKED_TOKEN = "revoked_token"  # a revoked or expired token, or an ended session: its actor is known
    CSRF = "csrf"  # a panel session's state-changing request without its CSRF token: the session's actor is known
    SIGN_IN = "sign_in"  # a wrong token typed into the panel's sign-in form
    SIGN_IN_CSRF = "sign_in_csrf"  # the sign-in form posted without its own one-off CSRF token
    OIDC = "oidc"  # an OpenID Connect sign-in refused: bad state, a refused ID token, no role for the claims


_ERRORS = {401: "unauthorized", 403: "forbidden", 429: "too_many_attempts"}


class AuthError(Exception):
    """A request refused for who is asking: ``status`` 401 (not authenticated), 403 (not allowed) or 429 (too
    many failed attempts from its source or for its actor: ``retry_after`` seconds). ``failure`` says which
    credentials failed, when the refusal is one to count (throttle.py)."""

    def __init__(self, status: int, reason: str, *, permission: str | None = None, actor: str | None = None,
                 failure: Failure | None = None, retry_after: float | None = None):
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.permission = permission
        self.actor = actor
        self.failure = failure
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": _ERRORS.get(self.status, "forbidden"), "reason": self.reason}
        if self.permission:
            body["permission"] = self.permission
        if self.retry_after is not None:
            body["retry_after_seconds"] = round(self.retry_after, 1)
        return body


@dataclass(frozen=True)
class Principal:
    """Who a request acts as."""

    token_id: str  # the API token's id, or the sign-in session's
    actor: str
    role: Role  # the first role (a token has exactly one)
    org: str | None = "default"  # the organisation it acts in; None: fleet-wide (an admin's or operator's token)
    roles: tuple[Role, ...] = ()  # every role held, when more than ``role`` (a signed-in person's)
    grants: tuple[Any, ...] = ()  # domain.grants.Grant: each role and the organisation, and where it came from
    kind: str = "token"  # "token", or "session" (signed in through an identity provider)
    project: str | None = None  # the one project a token is limited to (None: any of its organisation's)

    @property
    def all_roles(self) -> tuple[Role, ...]:
        return self.roles or (self.role,)

    def can(self, permission: Permission | str) -> bool:
        return any(allows(role, permission) for role in self.all_roles)

    def permissions(self) -> list[str]:
        return sorted({p.value for role in self.all_roles for p in ROLE_PERMISSIONS[role]})


FLEET_WIDE_ROLES = frozenset({Role.OPERATOR, Role.AUDITOR, Role.ADMIN})


def token_org(role: Role, org: str | None) -> str | None:
    """A token's organisation: the one given, else fleet-wide for operators, auditors and admins and the
    default organisation for viewers and submitters (tokens from before tenancy read the same way)."""
    if org is not None:
        return org
    return None if role in FLEET_WIDE_ROLES else "default"


# -- the tokens file ---------------------------------------------------------------------------------------


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def read_tokens_file(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    data = json.loads(path.read_text() or "{}")
    tokens = data.get("tokens", [])
    if not isinstance(tokens, list):
        raise ValueError(f"{path}: 'tokens' must be a list")
    return tokens


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise writers (gateway replicas, the CLI) on one machine; readers see only whole files."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(path.suffix + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write(path: Path, tokens: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"tokens": tokens}, indent=2) + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)  # atomic: a reader never sees half a file


def create_token(path: Path | str, actor: str, role: Role | str, org: str | None = None) -> str:
    """Add a token and return its secret (used by ``teto up`` and ``teto tokens create``)."""
    return issue_token(path, actor, role, org=org)[1]


def issue_token(path: Path | str, actor: str, role: Role | str, *, now: datetime | None = None,
                org: str | None = None) -> tuple[str, str]:
    """Add a token and return ``(token_id, secret)``; the secret is not stored and cannot be shown again."""
    role = Role(role)
    actor = check_actor(actor)
    path = Path(path)
    secret = "teto_" + secrets.token_urlsafe(32)
    token_id = secrets.token_hex(6)
    record = {"id": token_id, "actor": actor, "role": role.value, "sha256": hash_secret(secret),
              "created_at": (now or datetime.now(UTC)).isoformat(), "revoked": False}
    if org is not None:
        record["org"] = org
    with _locked(path):
        tokens = read_tokens_file(path)
        tokens.append(record)
        _write(path, tokens)
    return token_id, secret


def revoke_token(path: Path | str, token_id: str) -> bool:
    """Mark a token revoked (kept for the record); False when there is no such token."""
    path = Path(path)
    with _locked(path):
        tokens = read_tokens_file(path)
        found = False
        for t in tokens:
            if t.get("id") == token_id:
                t["revoked"] = True
                found = True
        if found:
            _write(path, tokens)
    return found


def list_tokens(path: Path | str) -> list[dict[str, Any]]:
    """Token records without their hashes."""
    return [{k: v for k, v in t.items() if k != "sha256"} for t in read_tokens_file(Path(path))]


class TokenStore:
    """The tokens file as the gateway sees it, re-read whenever the file changes (mtime, size or inode)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int, int] | None = None
        self._tokens: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def _refresh(self) -> None:
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = None
        with self._lock:
            if stamp == self._stamp:
                return
            try:
                self._tokens = read_tokens_file(self.path) if stamp else []
            except (OSError, ValueError):
                return  # keep the last good set; a broken edit must not lock everyone out
            self._stamp = stamp

    def authenticate(self, secret: str) -> Principal | None:
        self._refresh()
        digest = hash_secret(secret)
        found: Principal | None = None
        # Compare against every record in constant time so timing says nothing about which hash is close.
        for t in self._tokens:
            if hmac.compare_digest(str(t.get("sha256", "")), digest) and not t.get("revoked"):
                # ValueError also covers an actor written by hand that the contracts refuse: no access then.
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    role = Role(t["role"])
                    found = Principal(token_id=t["id"], actor=check_actor(t["actor"]), role=role,
                                      org=token_org(role, t.get("org")))
        return found

    def revoked_actor(self, secret: str) -> str | None:
        """The actor of a revoked token with this secret (None: no such revoked token): a failure it names."""
        self._refresh()
        digest = hash_secret(secret)
        actor = None
        for t in self._tokens:
            if hmac.compare_digest(str(t.get("sha256", "")), digest) and t.get("revoked"):
                actor = str(t.get("actor", ""))[:200] or None
        return actor


def bearer_secret(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def source_of(request: Request) -> str:
    """The client's address, the key failed attempts are counted under."""
    return request.client.host if request.client is not None else "unknown"


def refuse_if_blocked(request: Request, scope: Scope, name: str, actor: str | None = None) -> None:
    """AuthError 429 while ``name`` (a source or an actor) is blocked for failed attempts (domain/attempts.py)."""
    attempts = getattr(request.app.state, "attempts", None)
    if attempts is None:
        return
    left = attempts.blocked_for((scope, name), request.app.state.monotonic())
    if left is not None:
        what = ("too many sign-ins started from this source" if scope is Scope.SIGN_IN_START
                else f"too many failed sign-ins or bad tokens for this {scope.value}")
        raise AuthError(429, f"{what}; try again in {left:.0f} s", actor=actor, retry_after=left)


async def authenticate(request: Request) -> Principal:
    """The request's principal, or AuthError: 429 while its source is blocked (checked first: a blocked
    source's token is not even looked at), 401 for a missing, unknown, revoked or expired token or session, 403
    for a panel session without its CSRF token, 429 when its actor is blocked. Cached on the request."""
    cached = getattr(request.state, "principal", None)
    if cached is not None:
        return cached
    secret = bearer_secret(request)
    session_hook = getattr(request.app.state, "session_secret", None)  # the panel's cookie (panel/__init__.py)
    if secret is not None or (session_hook is not None and request.cookies):
        refuse_if_blocked(request, Scope.SOURCE, source_of(request))
    if secret is None and session_hook is not None:
        secret = await session_hook(request)
    if secret is None:
        raise AuthError(401, "missing bearer token (Authorization: Bearer <token>)")
    identity = request.app.state.identity  # identity.py: the database's tokens and sessions, or the tokens file
    principal = await identity.authenticate(secret)
    if principal is None:
        actor = await identity.revoked_actor(secret)
        if actor is not None:
            refuse_if_blocked(request, Scope.ACTOR, actor, actor)
        raise AuthError(401, "unknown or revoked token", actor=actor,
                        failure=Failure.REVOKED_TOKEN if actor else Failure.UNKNOWN_TOKEN)
    refuse_if_blocked(request, Scope.ACTOR, principal.actor, principal.actor)
    request.state.principal = principal
    return principal


class require:  # noqa: N801 - reads as a declaration on the route: Depends(require(Permission.READ))
    """A FastAPI dependency that admits a principal holding ``permission`` and returns it."""

    def __init__(self, permission: Permission) -> None:
        self.permission = Permission(permission)

    async def __call__(self, request: Request) -> Principal:
        # async: FastAPI runs a plain ``def`` dependency in its thread pool, a thread hop on every request
        # (docs/performance.md, item 2)
        return await self.check(request)

    async def check(self, request: Request) -> Principal:
        principal = await authenticate(request)
        if not principal.can(self.permission):
            roles = "+".join(r.value for r in principal.all_roles)
            raise AuthError(403, f"role {roles!r} lacks permission {self.permission.value!r}",
                            permission=self.permission.value, actor=principal.actor)
        return principal

    def __repr__(self) -> str:
        return f"require({self.permission.value!r})"


def route_permission(route: APIRoute) -> Permission | None:
    """The permission a route declares through ``Depends(require(...))`` (searched through sub-dependencies)."""
    stack = list(route.dependant.dependencies)
    while stack:
        dep = stack.pop()
        if isinstance(dep.call, require):
            return dep.call.permission
        stack.extend(dep.dependencies)
    return None
