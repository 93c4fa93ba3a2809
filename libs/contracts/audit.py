"""The audit log's anchors and its verify RPC.

An anchor is the chain head as the audit service saw it (``teto.audit.anchor``, stream ``AUDIT_ANCHOR``, which
refuses message deletes and purges): a record outside the database that a later rewrite of the table must agree
with. ``mac`` is HMAC-SHA256 over the anchor's fields with the audit key, so an anchor nobody holding the key made
is told apart from a real one. Verification needs that key, so it runs in the audit service and is asked for on
``teto.rpc.audit.verify``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from .bounds import Big, Reason, Time
from .envelope import Envelope

HexDigest = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class AuditAnchor(Envelope):
    SCHEMA = "teto.audit.anchor/1"

    seq: Big = Field(description="Sequence number of the chain head (the newest row) when anchored")
    hash: HexDigest = Field(description="That row's chain hash")
    rows: Big = Field(description="Rows in the log when anchored")
    recorded_at: Time | None = Field(None, description="When the head row was recorded")
    keyed_from: Big | None = Field(None, description="First seq that carries a mac (rows before it are pre-key)")
    mac: HexDigest | None = Field(None, description="HMAC-SHA256 of this anchor's fields with the audit key")


class AuditVerifyRequest(Envelope):
    SCHEMA = "teto.rpc.audit.verify/1"


class AuditVerifyReply(Envelope):
    SCHEMA = "teto.rpc.audit.verify.reply/1"

    ok: bool
    checked: Big = Field(0, description="Rows whose chain hash was recomputed")
    first_bad_seq: Big | None = Field(None, description="First row that fails (chain, mac or anchor)")
    reason: Reason | None = None
    keyed: bool = Field(False, description="The verifier holds the audit key (macs and anchor macs checked)")
    macs_checked: Big = 0
    pre_key_rows: Big = Field(0, description="Rows written before the key existed: protected by anchors only")
    anchors_checked: Big = 0
    unsigned_anchors: Big = Field(0, description="Anchors without a mac (made without a key), compared all the same")
    malformed_anchors: Big = Field(0, description="Messages on the anchor subject that are no anchor (skipped)")
    first_bad_anchor: Big | None = Field(None, description="Stream sequence of the first anchor that fails")
    last_anchor_seq: Big | None = Field(None, description="Row seq of the newest anchor")
    last_anchor_time: Time | None = None
    head_seq: Big | None = Field(None, description="Newest row seq in the table")
