"""Who a signed-in person is in Teto, and why: the identity provider's claims mapped to roles and an
organisation by the installation's configured mapping, each grant naming the claim or binding it came from. Pure.

A mapping is a list of rules ``{"claim": "groups", "value": "teto-operators", "role": "operator"}`` (a rule may
also name an ``org``), an organisation claim (``org_claim``) and the claim that names the person (``actor_claim``,
``preferred_username`` by default, the provider's ``sub`` when absent). A claim is found by a dotted path
(``realm_access.roles`` in Keycloak) and may be a string or a list of strings. An ``actor_prefix`` keeps the
people of two providers apart (``hospital:alice`` is not ``gov:alice``, nor an API token's ``alice``). Role bindings stored by an admin
add roles to one person (by the provider's subject or the actor name) whatever their claims say. A person whose
claims and bindings give no role is not signed in at all: an identity provider that knows everyone in a hospital
must not make each of them a Teto viewer by default.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


FLEET_WIDE = "*"  # a rule's org that binds no organisation (like an operator's or admin's token)


class Source(StrEnum):
    CLAIM = "claim"  # a claim of the ID token matched a rule of the mapping
    BINDING = "binding"  # a role binding an admin stored for this person
    TOKEN = "token"  # an API token's own role and organisation
    DEFAULT = "default"  # no organisation claim: the mapping's default organisation


@dataclass(frozen=True)
class Grant:
    """One role or organisation a principal holds, with where it came from."""

    kind: str  # "role" or "org"
    value: str
    source: Source
    because: str  # what a person reads: "claim groups contains 'teto-operators'"

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "value": self.value, "source": self.source.value, "because": self.because}


@dataclass(frozen=True)
class RoleRule:
    claim: str  # a dotted path into the claims
    value: str  # the claim (or one of its values) must equal this
    role: str
    org: str | None = None  # the organisation this rule also grants (else the org claim's, else the default);
    # "*": fleet-wide


@dataclass(frozen=True)
class ClaimMapping:
    rules: tuple[RoleRule, ...]
    org_claim: str | None = None
    actor_claim: str = "preferred_username"
    default_org: str | None = "default"
    actor_prefix: str = ""  # "hospital:" keeps two providers' "alice" apart (and apart from API tokens' actors)


@dataclass(frozen=True)
class Binding:
    id: str
    subject: str  # the provider's sub, or the actor name
    role: str
    org: str | None
    created_by: str


@dataclass(frozen=True)
class Identity:
    actor: str
    subject: str
    roles: tuple[str, ...]
    org: str | None
    grants: tuple[Grant, ...] = field(default_factory=tuple)


class NoRole(Exception):
    """The claims and bindings give this person no role: sign-in refused, with what was looked at."""

    def __init__(self, actor: str, looked_at: str) -> None:
        super().__init__(f"{actor}: no role is granted by the claims ({looked_at}) or by a role binding")
        self.actor = actor
        self.looked_at = looked_at


def claim_values(claims: Mapping[str, Any], path: str) -> list[str]:
    """The string values of a claim found by a dotted path; [] when absent or of another type."""
    node: Any = claims
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return []
        node = node[part]
    if isinstance(node, str):
        return [node]
    if isinstance(node, list | tuple):
        return [v for v in node if isinstance(v, str)]
    return []


def actor_of(claims: Mapping[str, Any], mapping: ClaimMapping) -> str:
    named = claim_values(claims, mapping.actor_claim)
    name = (named[0] if named else str(claims.get("sub", ""))).strip()
    return mapping.actor_prefix + name if name else ""


def map_claims(claims: Mapping[str, Any], mapping: ClaimMapping, bindings: Iterable[Binding] = ()) -> Identity:
    """The identity the claims and bindings give, each role and the organisation explained; NoRole if none."""
    actor = actor_of(claims, mapping)
    subject = str(claims.get("sub", ""))
    roles: list[str] = []
    grants: list[Grant] = []
    rule_org: str | None = None
    for rule in mapping.rules:
        if rule.value in claim_values(claims, rule.claim):
            if rule.role not in roles:
                roles.append(rule.role)
                grants.append(Grant("role", rule.role, Source.CLAIM, f"claim {rule.claim} contains {rule.value!r}"))
            if rule.org is not None and rule_org is None:
                rule_org = rule.org
                grants.append(Grant("org", rule.org, Source.CLAIM, f"claim {rule.claim} contains {rule.value!r}"))
    bound_org: str | None = None
    for binding in bindings:
        if binding.subject not in (subject, actor):
            continue
        if binding.role not in roles:
            roles.append(binding.role)
            grants.append(Grant("role", binding.role, Source.BINDING,
                                f"role binding {binding.id} by {binding.created_by}"))
        if binding.org is not None and bound_org is None:
            bound_org = binding.org
    org = rule_org
    if org is None:
        claimed = claim_values(claims, mapping.org_claim) if mapping.org_claim else []
        if claimed:
            org = claimed[0]
            grants.append(Grant("org", org, Source.CLAIM, f"claim {mapping.org_claim} is {org!r}"))
        elif bound_org is not None:
            org = bound_org
            grants.append(Grant("org", org, Source.BINDING, "the organisation of a role binding"))
        elif mapping.default_org is not None:
            org = mapping.default_org
            grants.append(Grant("org", org, Source.DEFAULT, "no organisation claim: the mapping's default"))
    if org == FLEET_WIDE:
        org = None  # a rule for fleet-wide people (operators of the whole fleet): no organisation bound
    if not roles:
        looked = ", ".join(sorted({r.claim for r in mapping.rules})) or "no rules"
        raise NoRole(actor or mapping.actor_prefix + subject, looked)
    return Identity(actor=actor or mapping.actor_prefix + subject, subject=subject, roles=tuple(roles), org=org, grants=tuple(grants))


def token_grants(token_id: str, role: str, org: str | None) -> tuple[Grant, ...]:
    """An API token's role and organisation, explained."""
    out = [Grant("role", role, Source.TOKEN, f"API token {token_id}")]
    out.append(Grant("org", org if org is not None else "*", Source.TOKEN,
                     f"API token {token_id}" + ("" if org is not None else " (fleet-wide)")))
    return tuple(out)
