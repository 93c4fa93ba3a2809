"""The audit log names a command by the id it carries, for every id the contracts allow (up to 128 characters):
the gateway derives a 66-character id from an Idempotency-Key, and the log must hold it under that id."""

from __future__ import annotations

from datetime import UTC, datetime

from services.audit.domain.entries import from_command
from services.gateway.scoping import job_id_for_key


def test_a_submit_with_an_idempotency_key_is_stored_under_its_derived_id():
    derived = job_id_for_key("alice", "retry-me")
    assert len(derived) > 64
    entry = from_command("teto.cmd.submit", b'{"command_id": "%s", "actor": "alice"}' % derived.encode(),
                         "CMD-7", datetime.now(UTC))
    assert entry.command_id == derived


def test_the_longest_contract_id_is_kept_and_a_longer_one_falls_back_to_the_stream_name():
    longest = "a" * 128
    assert from_command("teto.cmd.cancel", b'{"command_id": "%s"}' % longest.encode(), "CMD-1",
                        datetime.now(UTC)).command_id == longest
    assert from_command("teto.cmd.cancel", b'{"command_id": "%s"}' % (longest + "a").encode(), "CMD-2",
                        datetime.now(UTC)).command_id == "CMD-2"
