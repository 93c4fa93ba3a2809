"""The database privilege rules as SQL (libs/runtime/dbroles.py): pure functions of names, no server."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from libs.runtime import dbroles
from libs.runtime.dbroles import Roles

ROLES = Roles("teto")


def test_each_service_has_a_login_named_after_the_database():
    assert ROLES.logins == ["teto_queue", "teto_budget", "teto_health", "teto_audit", "teto_gateway"]
    assert Roles("t_ab12").login("audit") == "t_ab12_audit"
    with pytest.raises(ValueError):
        ROLES.login("executor")


@pytest.mark.parametrize("schema, owner", [("queue", "teto_queue"), ("budget", "teto_budget"),
                                           ("health", "teto_health"), ("audit", "teto_audit_owner"),
                                           ("gateway", None)], ids=str)
def test_who_owns_each_schema(schema, owner):
    """The audit log's owner is no service's login; the gateway owns nothing (its bookkeeping is the admin's)."""
    assert ROLES.owner(schema) == owner


def test_a_login_gets_no_power_and_a_scram_verifier():
    (sql,) = dbroles.role_sql("teto_queue", exists=False, verifier="SCRAM-SHA-256$4096:x$y:z")
    assert sql.startswith('CREATE ROLE "teto_queue" LOGIN')
    for attr in ("NOSUPERUSER", "NOCREATEDB", "NOCREATEROLE", "NOREPLICATION", "NOBYPASSRLS"):
        assert attr in sql
    assert "PASSWORD 'SCRAM-SHA-256$4096:x$y:z'" in sql


def test_an_owner_role_cannot_log_in_and_has_no_password():
    (sql,) = dbroles.role_sql("teto_audit_owner", exists=True, verifier=None)
    assert sql.startswith('ALTER ROLE "teto_audit_owner" WITH NOLOGIN') and "PASSWORD NULL" in sql


def test_only_the_audit_login_joins_the_writer_and_nobody_the_owner():
    sql = dbroles.membership_sql(ROLES)
    grants = [s for s in sql if s.startswith("GRANT")]
    assert grants == ['GRANT "teto_audit_writer" TO "teto_audit_owner"', 'GRANT "teto_audit_writer" TO "teto_audit"']
    for login in ROLES.logins:
        assert f'REVOKE "teto_audit_owner" FROM "{login}"' in sql
    assert 'REVOKE "teto_budget" FROM "teto_queue"' in sql and 'REVOKE "teto_audit_writer" FROM "teto_queue"' in sql
    assert 'REVOKE "teto_audit_writer" FROM "teto_audit"' not in sql


def test_public_loses_connect_temporary_and_create():
    sql = dbroles.database_sql(ROLES)
    assert 'REVOKE ALL ON DATABASE "teto" FROM PUBLIC' in sql
    assert "REVOKE CREATE ON SCHEMA public FROM PUBLIC" in sql
    assert sql[-1] == ('GRANT CONNECT ON DATABASE "teto" TO "teto_queue", "teto_budget", "teto_health", '
                       '"teto_audit", "teto_gateway"')


def test_a_new_schema_is_created_for_its_owner_and_an_old_one_handed_over():
    created = dbroles.schema_sql("queue", "teto_queue", exists=False)
    assert created == ['CREATE SCHEMA "queue" AUTHORIZATION "teto_queue"']
    assert dbroles.schema_sql("gateway", None, exists=False) == ['CREATE SCHEMA "gateway"']
    assert dbroles.schema_sql("gateway", None, exists=True) == []
    alter, reown = dbroles.schema_sql("audit", "teto_audit_owner", exists=True)
    assert alter == 'ALTER SCHEMA "audit" OWNER TO "teto_audit_owner"'
    assert "nspname = 'audit'" in reown and "ALTER ROUTINE" in reown and "ALTER %s %s OWNER TO %I" in reown


def test_the_audit_login_may_only_append_and_read():
    sql = dbroles.audit_grants_sql(ROLES)
    assert 'GRANT SELECT, INSERT ON audit.log TO "teto_audit_writer"' in sql
    granted = " ".join(s for s in sql if s.startswith("GRANT"))
    for verb in ("UPDATE", "DELETE", "TRUNCATE", "TRIGGER", "ALL "):
        assert verb not in granted


def test_the_gateway_reads_public_views_and_writes_only_its_identity_tables():
    sql = dbroles.gateway_grants_sql(ROLES, {"queue": ["jobs_public"], "audit": ["log_public"]})
    selects = [s for s in sql if s.startswith("GRANT SELECT ON")]
    assert selects == ['GRANT SELECT ON "queue"."jobs_public" TO "teto_gateway"',
                       'GRANT SELECT ON "audit"."log_public" TO "teto_gateway"',
                       'GRANT SELECT ON gateway.schema_migrations TO "teto_gateway"']
    writes = [s for s in sql if s.startswith("GRANT") and ("INSERT" in s or "UPDATE" in s or "DELETE" in s)]
    assert writes == ['GRANT SELECT, INSERT, UPDATE ON gateway."tokens" TO "teto_gateway"',
                      'GRANT SELECT, INSERT, UPDATE ON gateway."sessions" TO "teto_gateway"',
                      'GRANT SELECT, INSERT, DELETE ON gateway."role_bindings" TO "teto_gateway"',
                      'GRANT SELECT, INSERT, DELETE ON gateway."oidc_logins" TO "teto_gateway"']
    with pytest.raises(ValueError):
        dbroles.gateway_grants_sql(ROLES, {"queue": ["jobs"]})


def test_identifiers_and_literals_are_quoted():
    assert dbroles.ident('a"b') == '"a""b"' and dbroles.literal("it's") == "'it''s'"


def test_the_scram_verifier_is_the_one_postgresql_computes():
    """RFC 7677's construction, checked against an independent computation with a fixed salt."""
    salt = b"0123456789abcdef"
    verifier = dbroles.scram_verifier("pencil", salt=salt, iterations=4096)
    head, keys = verifier.split("$", 1)[1].split("$")
    iterations, salt_b64 = head.split(":")
    stored, server = (base64.b64decode(k) for k in keys.split(":"))
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", salt, 4096)
    assert iterations == "4096" and base64.b64decode(salt_b64) == salt
    assert stored == hashlib.sha256(hmac.new(salted, b"Client Key", "sha256").digest()).digest()
    assert server == hmac.new(salted, b"Server Key", "sha256").digest()
    assert dbroles.scram_verifier("pencil") != dbroles.scram_verifier("pencil")  # a fresh salt each time


def test_login_urls_keep_host_port_and_database_and_hide_when_printed():
    admin = "postgresql://teto:s3cret@127.0.0.1:5433/teto?sslmode=require"
    url = dbroles.login_url(admin, "teto_queue", "pw-1_x")
    assert url == "postgresql://teto_queue:pw-1_x@127.0.0.1:5433/teto?sslmode=require"
    assert dbroles.redact_url(url) == "postgresql://teto_queue:***@127.0.0.1:5433/teto?sslmode=require"
    assert dbroles.redact_url("postgresql://teto@h/db") == "postgresql://teto@h/db"
    assert len(dbroles.new_password()) >= 40


def test_a_setting_can_come_from_a_file_named_by_its_file_variable(tmp_path):
    """A container mounts only its own secret: TETO_<FIELD>_FILE names it; TETO_<FIELD> still wins."""
    from libs.runtime.settings import CommonSettings, SettingsError

    secret = tmp_path / "database.url"
    secret.write_text("postgresql://teto_queue:pw@db:5432/teto\n")
    assert CommonSettings.from_env(env={"TETO_DATABASE_URL_FILE": str(secret)}).database_url == \
        "postgresql://teto_queue:pw@db:5432/teto"
    both = {"TETO_DATABASE_URL_FILE": str(secret), "TETO_DATABASE_URL": "postgresql://other@h/db"}
    assert CommonSettings.from_env(env=both).database_url == "postgresql://other@h/db"
    with pytest.raises(SettingsError, match="TETO_DATABASE_URL_FILE"):
        CommonSettings.from_env(env={"TETO_DATABASE_URL_FILE": str(tmp_path / "missing")})
