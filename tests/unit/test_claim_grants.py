"""Claims to roles and an organisation, each with its reason (services/gateway/domain/grants.py); the token and
session records' rules (domain/tokens.py); who may make which token (routes/tokens.may_issue)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from services.gateway.auth import Principal, Role
from services.gateway.domain import tokens as records
from services.gateway.domain.grants import (Binding, ClaimMapping, Grant, NoRole, RoleRule, Source, claim_values,
                                            map_claims, token_grants)
from services.gateway.routes.tokens import may_issue

pytestmark = pytest.mark.unit

KEYCLOAK = ClaimMapping(rules=(RoleRule("groups", "/teto/operators", "operator"),
                               RoleRule("realm_access.roles", "teto-auditor", "auditor"),
                               RoleRule("groups", "/teto/viewers", "viewer"),
                               RoleRule("groups", "/research/gpu", "submitter", org="research")),
                        org_claim="hospital_unit", default_org="default")


def test_claim_values_by_dotted_path_string_or_list():
    c = {"groups": ["/a", 3, "/b"], "realm_access": {"roles": ["x"]}, "org": "north", "n": 1}
    assert claim_values(c, "groups") == ["/a", "/b"]
    assert claim_values(c, "realm_access.roles") == ["x"]
    assert claim_values(c, "org") == ["north"]
    assert claim_values(c, "n") == [] and claim_values(c, "missing.path") == [] and claim_values(c, "org.x") == []


def test_each_role_and_the_organisation_name_the_claim_they_came_from():
    who = map_claims({"sub": "u-7", "preferred_username": "olga", "groups": ["/teto/operators", "/staff"],
                      "realm_access": {"roles": ["teto-auditor"]}, "hospital_unit": "radiology"}, KEYCLOAK)
    assert (who.actor, who.subject, who.roles, who.org) == ("olga", "u-7", ("operator", "auditor"), "radiology")
    assert who.grants == (
        Grant("role", "operator", Source.CLAIM, "claim groups contains '/teto/operators'"),
        Grant("role", "auditor", Source.CLAIM, "claim realm_access.roles contains 'teto-auditor'"),
        Grant("org", "radiology", Source.CLAIM, "claim hospital_unit is 'radiology'"))


def test_a_rule_that_names_an_organisation_wins_over_the_org_claim():
    who = map_claims({"sub": "u", "groups": ["/research/gpu"], "hospital_unit": "radiology"}, KEYCLOAK)
    assert (who.roles, who.org) == (("submitter",), "research")
    assert who.grants[-1] == Grant("org", "research", Source.CLAIM, "claim groups contains '/research/gpu'")


def test_a_rule_may_make_a_person_fleet_wide():
    mapping = ClaimMapping(rules=(RoleRule("groups", "/platform", "operator", org="*"),), org_claim="unit")
    who = map_claims({"sub": "u", "groups": ["/platform"], "unit": "radiology"}, mapping)
    assert who.org is None and who.grants[-1] == Grant("org", "*", Source.CLAIM, "claim groups contains '/platform'")


def test_without_an_org_claim_the_default_organisation_and_it_says_so():
    who = map_claims({"sub": "u", "groups": ["/teto/viewers"]}, KEYCLOAK)
    assert who.org == "default" and who.grants[-1].source is Source.DEFAULT
    assert who.actor == "u"  # no preferred_username: the provider's subject


def test_no_role_from_claims_or_bindings_refuses_the_sign_in():
    with pytest.raises(NoRole) as caught:
        map_claims({"sub": "u-9", "preferred_username": "nurse", "groups": ["/staff"]}, KEYCLOAK)
    assert caught.value.actor == "nurse" and "groups" in str(caught.value)


def test_a_role_binding_adds_a_role_by_subject_or_actor_and_says_who_made_it():
    bindings = [Binding("b-1", "u-9", "operator", None, "root"), Binding("b-2", "nurse", "viewer", "icu", "root"),
                Binding("b-3", "someone-else", "admin", None, "root")]
    who = map_claims({"sub": "u-9", "preferred_username": "nurse", "groups": ["/staff"]}, KEYCLOAK, bindings)
    assert who.roles == ("operator", "viewer") and who.org == "icu"
    assert Grant("role", "operator", Source.BINDING, "role binding b-1 by root") in who.grants
    assert who.grants[-1] == Grant("org", "icu", Source.BINDING, "the organisation of a role binding")


def test_a_role_given_twice_is_listed_once_with_its_first_reason():
    mapping = ClaimMapping(rules=(RoleRule("groups", "a", "viewer"), RoleRule("groups", "b", "viewer")))
    who = map_claims({"sub": "u", "groups": ["a", "b"]}, mapping)
    assert who.roles == ("viewer",) and [g.because for g in who.grants if g.kind == "role"] == ["claim groups contains 'a'"]


def test_an_actor_prefix_keeps_two_providers_people_apart_and_bindings_follow_it():
    gov = ClaimMapping(rules=(RoleRule("groups", "g", "viewer"),), actor_prefix="gov:")
    assert map_claims({"sub": "s", "preferred_username": "alice", "groups": ["g"]}, gov).actor == "gov:alice"
    assert map_claims({"sub": "s-2", "groups": ["g"]}, gov).actor == "gov:s-2"
    bound = map_claims({"sub": "s", "preferred_username": "alice"}, gov, [Binding("b", "gov:alice", "viewer", None, "r")])
    assert bound.roles == ("viewer",)
    with pytest.raises(NoRole) as caught:
        map_claims({"sub": "s", "preferred_username": "alice"}, gov, [Binding("b", "alice", "admin", None, "r")])
    assert caught.value.actor == "gov:alice"  # an API token's alice's binding is not hers


def test_a_token_explains_itself():
    assert token_grants("t1", "operator", None) == (Grant("role", "operator", Source.TOKEN, "API token t1"),
                                                    Grant("org", "*", Source.TOKEN, "API token t1 (fleet-wide)"))


T0 = datetime(2026, 12, 5, 12, tzinfo=UTC)


@pytest.mark.parametrize(("revoked", "expires", "state"), [
    (None, None, records.State.ACTIVE), (None, T0 + timedelta(seconds=1), records.State.ACTIVE),
    (None, T0, records.State.EXPIRED), (T0, None, records.State.REVOKED), (T0, T0, records.State.REVOKED)],
    ids=["no expiry", "before expiry", "at expiry", "revoked", "revoked and expired"])
def test_a_record_state(revoked, expires, state):
    assert records.state_of(revoked_at=revoked, expires_at=expires, now=T0) is state


def test_last_use_is_written_at_most_once_a_minute():
    assert records.touch_due(None, T0)
    assert not records.touch_due(T0 - timedelta(seconds=59), T0)
    assert records.touch_due(T0 - timedelta(seconds=60), T0)


def test_a_tokens_file_record_becomes_a_row_and_a_broken_one_is_skipped():
    good = {"id": "a1", "actor": "alice", "role": "submitter", "sha256": "A" * 64, "created_at": "2026-10-02T10:00:00",
            "revoked": True, "org": "north"}
    row = records.from_file(good, now=T0)
    assert (row.id, row.sha256, row.org, row.revoked_at) == ("a1", "a" * 64, "north", T0)
    assert row.created_at == datetime(2026, 10, 2, 10, tzinfo=UTC)
    assert records.from_file({**good, "created_at": "yesterday", "revoked": False}, now=T0).created_at == T0
    for broken in ({**good, "id": ""}, {**good, "sha256": "short"}, {**good, "sha256": None}, {"actor": "x"},
                   {**good, "actor": "bad\x00actor"}):
        assert records.from_file(broken, now=T0) is None


def person(*roles: Role, org: str | None = "north") -> Principal:
    return Principal(token_id="s-1", actor="olga", role=roles[0], roles=roles, org=org, kind="session")


@pytest.mark.parametrize(("who", "actor", "role", "org", "allowed"), [
    (person(Role.ADMIN, org=None), "anyone", Role.ADMIN, None, True),
    (person(Role.OPERATOR), "olga", Role.VIEWER, "north", True),
    (person(Role.OPERATOR), "olga", Role.SUBMITTER, "north", True),
    (person(Role.OPERATOR), "olga", Role.OPERATOR, "north", True),
    (person(Role.OPERATOR), "olga", Role.AUDITOR, "north", False),  # audit:read she does not hold
    (person(Role.OPERATOR), "olga", Role.ADMIN, "north", False),
    (person(Role.OPERATOR), "bob", Role.VIEWER, "north", False),  # someone else's
    (person(Role.OPERATOR), "olga", Role.VIEWER, "south", False),  # another organisation
    (person(Role.OPERATOR, Role.AUDITOR), "olga", Role.AUDITOR, "north", True),
    (person(Role.VIEWER), "olga", Role.SUBMITTER, "north", False),
], ids=lambda v: getattr(v, "value", None) if isinstance(v, Role) else None)
def test_who_may_make_which_token(who, actor, role, org, allowed):
    assert (may_issue(who, actor=actor, role=role, org=org) is None) is allowed


def test_providers_are_read_from_json_and_a_bad_entry_is_named():
    from services.gateway.oidc import ProviderConfigError, load_providers

    one = {"name": "hospital", "issuer": "https://sso/realms/h", "client_id": "teto-panel",
           "roles": [{"claim": "groups", "value": "/teto/operators", "role": "operator"}], "org_claim": "unit"}
    found = load_providers(json.dumps([one, {**one, "name": "gov", "issuer": "https://gov"}]), None)
    assert list(found) == ["hospital", "gov"]
    assert found["hospital"].mapping() == ClaimMapping(rules=(RoleRule("groups", "/teto/operators", "operator"),),
                                                       org_claim="unit")
    assert load_providers(None, None) == {}
    for bad, says in [("not json", "not JSON"), (json.dumps([one, one]), "two OpenID Connect providers"),
                      (json.dumps([{**one, "name": "Bad Name"}]), "name"),
                      (json.dumps([{**one, "roles": [{"claim": "g", "value": "v", "role": "root"}]}]), "role")]:
        with pytest.raises(ProviderConfigError, match=says):
            load_providers(bad, None)


def test_a_gateway_with_a_bad_provider_setting_refuses_to_start():
    from libs.runtime.settings import SettingsError
    from services.gateway.api import create_app
    from services.gateway.settings import GatewaySettings

    with pytest.raises(SettingsError, match="TETO_OIDC_PROVIDERS"):
        create_app(GatewaySettings.from_env(env={}, oidc_providers="[{}]"))


@pytest.mark.parametrize(("limited", "asked", "goes_to"), [
    (None, "default", "default"), (None, "radiology-ai", "radiology-ai"), ("ct", "default", "ct"), ("ct", "ct", "ct"),
    ("ct", "mri", None)], ids=["unlimited", "unlimited, named", "limited, unnamed", "limited, same", "another"])
def test_a_token_limited_to_a_project_submits_into_it_only(limited, asked, goes_to):
    from services.gateway.auth import AuthError
    from services.gateway.orgs import acting_project

    who = Principal(token_id="t", actor="ci", role=Role.SUBMITTER, org="north", project=limited)
    if goes_to is None:
        with pytest.raises(AuthError) as caught:
            acting_project(who, asked)
        assert caught.value.status == 403 and "'ct'" in caught.value.reason
    else:
        assert acting_project(who, asked) == goes_to
