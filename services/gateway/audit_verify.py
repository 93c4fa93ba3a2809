"""Asking the audit service to verify its log (``teto.rpc.audit.verify``).

Verification needs the audit key (the rows' and anchors' macs), which only the audit service holds, so the gateway
no longer recomputes the chain itself: it asks, and says so plainly when nobody answers.
"""

from __future__ import annotations

from typing import Any

from nats.aio.client import Client
from nats.errors import NoRespondersError, TimeoutError as NatsTimeout

from libs.contracts.audit import AuditVerifyReply, AuditVerifyRequest
from libs.contracts.subjects import Subjects

# Verify reads the whole log and every anchor: a large log takes a while.
VERIFY_TIMEOUT_SECONDS = 120.0


class AuditVerifierUnavailable(Exception):
    """The audit service did not answer the verify request."""


async def ask_verify(nc: Client, subjects: Subjects, timeout: float = VERIFY_TIMEOUT_SECONDS) -> dict[str, Any]:
    try:
        msg = await nc.request(subjects.rpc_audit_verify, AuditVerifyRequest().encode(), timeout=timeout)
    except NoRespondersError:
        raise AuditVerifierUnavailable("no audit service is answering verify requests (it holds the audit key "
                                       "verification needs): is it running?") from None
    except (NatsTimeout, TimeoutError):
        raise AuditVerifierUnavailable(f"the audit service did not answer the verify request within "
                                       f"{timeout:.0f}s") from None
    return AuditVerifyReply.decode(msg.data).model_dump(mode="json", by_alias=True, exclude={"schema_", "id", "time"})
