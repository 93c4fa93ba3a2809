"""Settings of the audit service (``TETO_*`` environment variables)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from libs.runtime.settings import CommonSettings, batch_linger_field


class AuditSettings(CommonSettings):
    audit_writer_role: str | None = Field(
        None, pattern=r"^[a-z_][a-z0-9_]{0,62}$",
        description="Role the service writes as (INSERT/SELECT only); default <database>_audit_writer, which "
        "the migration creates when it may",
    )
    batch_size: int = Field(
        1000, ge=1, le=2000, description="Messages per audit transaction at most (one chain lock, one COPY each; "
        "a fetch takes what is waiting, so a quiet stream still gets batches of one)")
    batch_linger_seconds: float = batch_linger_field("the audit's consumers (commands, outcomes, refused messages)")
    audit_key_file: Path | None = Field(
        None, description="Secret key file (at least 32 bytes) for the rows' and anchors' HMACs; only the audit "
        "service may read it (`teto up` makes <data-dir>/audit.key). Unset: no macs, and verify checks the chain "
        "and the anchors only, which a database superuser who recomputes hashes after the last anchor passes",
    )
    anchor_seconds: float = Field(
        10.0, gt=0, le=3600, description="How often the chain head is anchored (published to the anchor stream) "
        "when it moved; also once at shutdown",
    )
    verify_queue_group: str = Field("audit", pattern=r"^[a-z][a-z0-9_-]*$",
                                    description="Queue group answering teto.rpc.audit.verify")
