"""The audit log (audit:read): every command and outcome in order, filterable by actor, job, kind and time, paged
by sequence number, and the result of the chain verification the audit service runs (it alone holds the key
verification needs: services/gateway/audit_verify.py), the same as GET /v1/audit and GET /v1/audit/verify.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from libs.contracts.bounds import MAX_SAFE_INT

from ...audit_verify import AuditVerifierUnavailable, ask_verify
from ...auth import Permission, Principal
from ...routes import reads_of
from .. import fleet
from ..web import render, signed_in
from ..nav import NavItem

NAV = NavItem("/audit", "audit.nav", Permission.AUDIT_READ, order=50)
PAGE_SIZE = 100
VERIFY_TIMEOUT_SECONDS = 20.0  # the page says "unavailable" rather than hanging on a silent verifier


async def verification(reads: Any) -> dict[str, Any]:
    """``{result}`` from the audit service, or ``{unavailable: why}``."""
    runtime = getattr(reads, "runtime", None)
    if runtime is None:
        return {"unavailable": "no bus"}
    try:
        return {"result": await ask_verify(runtime.nc, runtime.subjects, timeout=VERIFY_TIMEOUT_SECONDS)}
    except AuditVerifierUnavailable as exc:
        return {"unavailable": str(exc)}


def register(router: APIRouter) -> None:

    @router.get("/audit")
    async def audit(request: Request, actor: str | None = Query(None, max_length=200),
                    job_id: str | None = Query(None, max_length=200), kind: str | None = Query(None, max_length=200),
                    since: str | None = Query(None, max_length=200), until: str | None = Query(None, max_length=200),
                    after_seq: int = Query(0, ge=0, le=MAX_SAFE_INT),
                    principal: Principal = Depends(signed_in(Permission.AUDIT_READ))) -> Response:
        reads = reads_of(request)
        f = fleet.audit_filters({"actor": actor, "job_id": job_id, "kind": kind, "since": since, "until": until})
        rows = await reads.audit({"actor": f["actor"], "job_id": f["job_id"], "kind": f["kind"],
                                  "since": f.get("since_time"), "until": f.get("until_time"),
                                  "after_seq": after_seq, "limit": PAGE_SIZE})
        following = rows[-1]["seq"] if len(rows) == PAGE_SIZE else None
        query = {k: f[k] for k in fleet.AUDIT_FILTERS if f[k]}
        names = await reads.job_names(sorted({r["job_id"] for r in rows if r.get("job_id")}))
        return render(request, principal, "audit.html", "audit", filters=f, query=query, entries=rows, names=names,
                      next_after_seq=following, first_page=after_seq == 0, verify=await verification(reads))
