"""Gang policy (policy:admin): the ready timeout, back-off base and maximum, back-off limit, sequential admission
and node-failure strategy in force, who changed them last and when, and a form to change them.

The values are GET /v1/policies/gang's; the form is checked as the admin types against the contract's own
bounds (fleet.policy_bounds, embedded as data for static/policy.js), then sent as PUT /v1/policies/gang, whose
refusal (422 with the fields, or 409) is shown as the server words it: the server stays the judge.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from ...auth import Permission, Principal
from ...routes import reads_of
from .. import fleet
from ..web import render, signed_in
from . import NavItem

NAV = NavItem("/policy", "policy.nav", Permission.POLICY_ADMIN, order=40)
NUMBERS = ("ready_timeout_seconds", "backoff_base_seconds", "backoff_max_seconds", "backoff_limit")


def register(router: APIRouter) -> None:

    @router.get("/policy")
    async def policy(request: Request, saved: bool = False,
                     principal: Principal = Depends(signed_in(Permission.POLICY_ADMIN))) -> Response:
        current = await reads_of(request).gang_policy()
        return render(request, principal, "policy.html", "policy", messages=("policy.",), policy=current,
                      bounds=fleet.policy_bounds(), numbers=NUMBERS, saved=saved,
                      plain=fleet.plain)
