"""`teto up`'s audit key: made once, 0600, handed to the audit service alone; a non-root start says who else
can read it; the service refuses a key file it cannot use."""

from __future__ import annotations

import logging

import pytest

from services.audit.keyfile import AuditKeyError, load_key
from teto.stack import audit_key
from teto.stack.up import SERVICE_ORDER, part_env

pytestmark = pytest.mark.unit


def test_the_key_is_made_once_private_and_given_to_the_audit_service_only(tmp_path):
    own = {name: {} for name in [*SERVICE_ORDER, "executor"]}
    own["audit"].update(audit_key.audit_key_env(tmp_path))
    path = tmp_path / audit_key.KEY_FILE
    first = path.read_bytes()
    assert path.stat().st_mode & 0o777 == 0o600 and len(load_key(path)) >= 32
    audit_key.audit_key_env(tmp_path)
    assert path.read_bytes() == first  # a restart keeps the key (the old macs must still verify)
    shared = {"TETO_NATS_URL": "nats://x"}
    assert part_env(shared, own, "audit")["TETO_AUDIT_KEY_FILE"] == str(path)
    for part in [p for p in own if p != "audit"]:
        assert "TETO_AUDIT_KEY_FILE" not in part_env(shared, own, part)


def test_a_non_root_start_says_the_key_is_readable_by_the_stack_itself(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(audit_key.os, "geteuid", lambda: 1000)
    with caplog.at_level(logging.WARNING, logger="teto.up"):
        audit_key.audit_key_env(tmp_path)
    assert "not root" in caplog.text and "audit key" in caplog.text


@pytest.mark.parametrize("content", [b"", b"short\n"], ids=["empty", "too short"])
def test_an_unusable_key_file_is_refused(tmp_path, content):
    path = tmp_path / "k"
    path.write_bytes(content)
    with pytest.raises(AuditKeyError, match="at least 32"):
        load_key(path)
    with pytest.raises(AuditKeyError, match="missing|No such"):
        load_key(tmp_path / "missing")
