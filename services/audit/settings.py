"""Settings of the audit service (``TETO_*`` environment variables)."""

from __future__ import annotations

from pydantic import Field

from libs.runtime.settings import CommonSettings


class AuditSettings(CommonSettings):
    audit_writer_role: str | None = Field(
        None, pattern=r"^[a-z_][a-z0-9_]{0,62}$",
        description="Role the service writes as (INSERT/SELECT only); default <database>_audit_writer, which "
        "the migration creates when it may",
    )
    batch_size: int = Field(200, ge=1, le=2000, description="Messages per audit transaction at most")
