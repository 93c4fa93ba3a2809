"""Issue 30, on the real servers: tokens live in the gateway's schema and are shared by every replica with no
shared volume; a tokens file that predates this change is imported and every one of its tokens keeps working (a
revoked one stays revoked); a token revoked through one replica is refused at once by the other; an expired token
is refused; ID tokens that fail a check (another key, another audience, expired, a browser sign-in's token with
its nonce replayed to the CLI's exchange) are refused with the check's name, and audited.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import httpx
import pytest

from services.gateway.auth import hash_secret
from tests.security.identity_stack import bearer, get, identity_stack
from tests.support.oidc import private_jwk

pytestmark = pytest.mark.security

# A data directory from before this change: its tokens file, with secrets the people still hold.
OLD = {"admin": "teto_old-admin-secret", "alice": "teto_old-alice-secret", "gone": "teto_old-revoked-secret",
       "north": "teto_old-north-viewer"}
OLD_FILE = [
    {"id": "a0", "actor": "local-admin", "role": "admin", "sha256": hash_secret(OLD["admin"]),
     "created_at": "2026-10-01T10:00:00+00:00", "revoked": False},
    {"id": "a1", "actor": "alice", "role": "submitter", "sha256": hash_secret(OLD["alice"]),
     "created_at": "2026-10-02T10:00:00+00:00", "revoked": False},
    {"id": "a2", "actor": "mallory", "role": "operator", "sha256": hash_secret(OLD["gone"]),
     "created_at": "2026-10-03T10:00:00+00:00", "revoked": True},
    {"id": "a3", "actor": "nina", "role": "viewer", "org": "north", "sha256": hash_secret(OLD["north"]),
     "created_at": "2026-10-04T10:00:00+00:00", "revoked": False},
]


async def test_tokens_are_shared_by_replicas_and_a_revocation_is_refused_at_once_everywhere(env, tmp_path):
    async with identity_stack(env, tmp_path / "s", old_tokens=OLD_FILE) as s:
        one, two = s.urls
        # The upgrade: every token of the old file works on both replicas, the revoked one does not.
        for url in s.urls:
            me = (await get(url, "/v1/whoami", OLD["alice"])).json()
            assert (me["actor"], me["role"]) == ("alice", "submitter")
            assert me["grants"][0] == {"kind": "role", "value": "submitter", "source": "token", "because": "API token a1"}
            assert (await get(url, "/v1/whoami", OLD["north"])).json()["org"] == "north"
            assert (await get(url, "/v1/whoami", OLD["admin"])).json()["role"] == "admin"
            assert (await get(url, "/v1/whoami", OLD["gone"])).status_code == 401
        rows = {r["id"]: r for r in await s.db.fetch("SELECT * FROM gateway.tokens")}
        assert set(rows) == {"a0", "a1", "a2", "a3"} and all(r["source"] == "file" for r in rows.values())
        assert rows["a2"]["revoked_at"] is not None and rows["a1"]["created_at"].year == 2026

        # Made through one replica (no file, no shared volume), used through the other at once.
        async with httpx.AsyncClient(base_url=one, timeout=30, headers=bearer(OLD["admin"])) as admin:
            made = (await admin.post("/v1/tokens", json={"actor": "ci-bot", "role": "submitter",
                                                         "description": "nightly fine-tune",
                                                         "expires_in_days": 30})).json()
            assert (await get(two, "/v1/whoami", made["secret"])).json()["actor"] == "ci-bot"
            listed = {t["id"]: t for t in (await admin.get("/v1/tokens")).json()}
            assert listed[made["id"]]["description"] == "nightly fine-tune"
            assert listed[made["id"]]["last_used_at"] is not None  # written by the other replica
            assert listed[made["id"]]["expires_at"] is not None and listed[made["id"]]["state"] == "active"
            assert "sha256" not in listed[made["id"]]
            assert made["secret"] not in (s.tokens_file.read_text())

            # Revoked through replica one: the very next request to replica two is refused.
            assert (await get(two, "/v1/jobs", made["secret"])).status_code == 200
            assert (await admin.delete(f"/v1/tokens/{made['id']}")).status_code == 204
            refused = await get(two, "/v1/jobs", made["secret"])
            assert refused.status_code == 401
            await s.audited("token_revoke", made["id"], outcome="accepted")
            await s.audited("authenticate", "revoked_token", outcome="refused")

            # A token past its expiry is refused (expiry set in the database: the gateway compares with its clock).
            short = (await admin.post("/v1/tokens", json={"actor": "temp", "role": "viewer",
                                                          "expires_in_days": 1})).json()
            assert (await get(two, "/v1/whoami", short["secret"])).status_code == 200
            await s.db.execute("UPDATE gateway.tokens SET expires_at = $2 WHERE id = $1", short["id"],
                               datetime.now(UTC))
            assert (await get(one, "/v1/whoami", short["secret"])).status_code == 401

            # A token limited to a project (issue 14's scope) submits into it, and may not name another.
            for path in ("/v1/orgs/north", "/v1/orgs/north/projects/ct"):
                assert (await admin.put(path, json={})).status_code in (200, 201, 202)
            ct = (await admin.post("/v1/tokens", json={"actor": "ct-bot", "role": "submitter", "org": "north",
                                                       "project": "ct"})).json()
            async with httpx.AsyncClient(base_url=two, timeout=60, headers=bearer(ct["secret"])) as bot:
                job = await bot.post("/v1/jobs", json={"workload": {"kind": "finetune"}})
                assert job.status_code in (201, 202), job.text
                job_id = job.json().get("id") or job.json()["job_id"]
                row = await s.db.fetchrow("SELECT org, project FROM queue.jobs_public WHERE id = $1", job_id)
                assert (row["org"], row["project"]) == ("north", "ct")
                other = await bot.post("/v1/jobs", json={"project": "mri", "workload": {"kind": "finetune"}})
                assert other.status_code == 403 and "limited to project 'ct'" in other.json()["reason"]

        # A person's own tokens: Alice makes one for herself, cannot make an operator's, revokes hers.
        async with httpx.AsyncClient(base_url=two, timeout=30, headers=bearer(OLD["alice"])) as alice:
            own = await alice.post("/v1/me/tokens", json={"role": "viewer", "description": "notebook"})
            assert own.status_code == 201 and own.json()["actor"] == "alice"
            higher = await alice.post("/v1/me/tokens", json={"role": "operator"})
            assert higher.status_code == 403 and "finetune:manage" in higher.json()["reason"]
            assert [t["id"] for t in (await alice.get("/v1/me/tokens")).json()] == [own.json()["id"], "a1"]
            assert (await alice.delete("/v1/me/tokens/a0")).status_code == 404  # not hers
            assert (await alice.delete(f"/v1/me/tokens/{own.json()['id']}")).status_code == 204
            assert (await get(one, "/v1/whoami", own.json()["secret"])).status_code == 401

        # A token added to the file later (teto tokens create --tokens-file, teto up) is imported when it changes.
        from services.gateway.auth import issue_token
        _, late = issue_token(s.tokens_file, "late", "viewer")
        assert (await get(one, "/v1/whoami", late)).json()["actor"] == "late"


def claims(s, **over) -> dict:
    now = int(time.time())
    base = {"iss": s.provider.issuer, "sub": "olga", "aud": "teto-cli", "iat": now, "exp": now + 300,
            "preferred_username": "olga", "groups": ["teto-operators"], "org": "radiology"}
    base.update(over)
    return base


ADMIN = OLD["admin"]


async def test_id_tokens_failing_a_check_are_refused_with_its_name_and_audited(env, tmp_path):
    async with identity_stack(env, tmp_path / "s", old_tokens=OLD_FILE[:1]) as s:
        _, other_key = private_jwk("test-key-1")  # another key that claims the provider's kid
        now = int(time.time())
        cases = {
            "signature": s.provider.sign(claims(s), key=other_key),
            "unknown_key": s.provider.sign(claims(s), key=other_key, kid="attacker-key"),
            "audience": s.provider.sign(claims(s, aud="another-client")),
            "expired": s.provider.sign(claims(s, iat=now - 7200, exp=now - 3600)),
            "issuer": s.provider.sign(claims(s, iss="http://127.0.0.1:1/evil")),
            # a browser sign-in's token (it carries that sign-in's nonce) offered to the CLI's exchange
            "unexpected_nonce": s.provider.sign(claims(s, nonce="nonce-of-an-old-sign-in")),
        }
        async with httpx.AsyncClient(base_url=s.urls[0], timeout=30) as client:
            for refusal, token in cases.items():
                r = await client.post("/v1/sessions/oidc", json={"provider": "hospital", "id_token": token})
                assert r.status_code == 401, (refusal, r.text)
                assert f"({refusal})" in r.json()["reason"], (refusal, r.text)
            # The same claims, signed by the provider's key for the CLI's audience with no nonce: a session.
            ok = await client.post("/v1/sessions/oidc", json={"provider": "hospital", "id_token": s.provider.sign(claims(s))})
            assert ok.status_code == 201, ok.text
            assert (ok.json()["actor"], ok.json()["roles"], ok.json()["org"]) == ("olga", ["operator"], "radiology")
            # Claims that map to no role: refused, not made a viewer by default.
            nobody = claims(s, sub="nobody", preferred_username="nobody", groups=["staff"])
            none = await client.post("/v1/sessions/oidc", json={"provider": "hospital",
                                                                "id_token": s.provider.sign(nobody)})
            assert none.status_code == 403 and "no role" in none.json()["reason"]
            # An admin binds a role to that person (audited); the next sign-in holds it and says why.
            async with httpx.AsyncClient(base_url=s.urls[1], timeout=30, headers=bearer(ADMIN)) as admin:
                bound = await admin.post("/v1/role-bindings", json={"provider": "hospital", "subject": "nobody",
                                                                    "role": "submitter"})
                assert bound.status_code == 201, bound.text
            now_bound = await client.post("/v1/sessions/oidc", json={"provider": "hospital",
                                                                     "id_token": s.provider.sign(nobody)})
            assert now_bound.status_code == 201 and now_bound.json()["roles"] == ["submitter"]
            assert {"kind": "role", "value": "submitter", "source": "binding",
                    "because": f"role binding {bound.json()['id']} by local-admin"} in now_bound.json()["grants"]
            # The provider rotates its keys: a token signed with the new key names a kid the gateway's cached set
            # lacks, so the gateway fetches the set again and accepts it; one signed with the old key still works.
            old_key, old_kid = s.provider.key, s.provider.kid
            s.provider.rotate("test-key-2")
            rotated = await client.post("/v1/sessions/oidc", json={"provider": "hospital",
                                                                   "id_token": s.provider.sign(claims(s))})
            assert rotated.status_code == 201, rotated.text
            still = await client.post("/v1/sessions/oidc", json={"provider": "hospital", "id_token": s.provider.sign(
                claims(s), key=old_key, kid=old_kid)})
            assert still.status_code == 201, still.text
            # Olga leaves: an admin sees her sessions and ends every one at once, on every replica (audited).
            async with httpx.AsyncClient(base_url=s.urls[1], timeout=30, headers=bearer(ADMIN)) as admin:
                live = (await admin.get("/v1/sessions", params={"actor": "olga"})).json()
                assert [(x["kind"], x["roles"], x["org"]) for x in live] == [("cli", ["operator"], "radiology")] * 3
                assert not any("secret" in x or "id_token" in x or "sha256" in x for x in live)
                ended = await admin.delete("/v1/sessions", params={"actor": "olga"})
                assert ended.json() == {"actor": "olga", "ended": 3}
                assert (await admin.get("/v1/sessions", params={"actor": "olga"})).json() == []
            for made in (ok, rotated, still):
                for url in s.urls:
                    assert (await get(url, "/v1/whoami", made.json()["secret"])).status_code == 401
        for refusal in cases:
            await s.audited("sign_in", f"({refusal})", outcome="refused")
        await s.audited("sessions_end", '"sessions_of": "olga"', outcome="accepted", actor="local-admin")
        await s.audited("role_bind", '"subject": "nobody"', outcome="accepted", actor="local-admin")
        accepted = (await s.audited("sign_in", '"session_kind": "cli"', outcome="accepted", actor="olga"))[0]
        assert "claim groups contains 'teto-operators'" in accepted["payload_text"]
        rows = await s.db.fetch("SELECT actor, kind, roles FROM gateway.sessions ORDER BY created_at")
        assert [(r["actor"], r["kind"], list(r["roles"])) for r in rows] == [
            ("olga", "cli", ["operator"]), ("nobody", "cli", ["submitter"]), ("olga", "cli", ["operator"]),
            ("olga", "cli", ["operator"])]
