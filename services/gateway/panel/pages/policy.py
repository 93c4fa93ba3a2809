"""Gang policy (policy:admin): the ready timeout, back-off base and maximum, back-off limit, sequential admission
and node-failure strategy in force, who changed them last and when, and a form to change them.

The values are GET /v1/policies/gang's; the form is checked as the admin types against the contract's own
bounds (fleet.policy_bounds, embedded as data for static/policy.js), then sent as typed to ``PUT /policy``, which
reads each number in the page's locale (numparse.py: ``1.000`` is 1000 in pt-BR, ``1.5`` is refused there) and then
sets the policy exactly as ``PUT /v1/policies/gang`` (routes/policies.py ``set_gang_policy``), whose refusal (422
with the fields, or 409) is shown as the server words it: the server stays the judge. The fields are filled with
the values as the page's locale writes them.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from libs.contracts.policies import GangPolicy

from ...auth import Permission, Principal, require
from ...routes import reads_of
from ...routes.policies import set_gang_policy
from .. import fleet, i18n, numparse
from ..web import locale_of, render, signed_in
from ..nav import NavItem

NAV = NavItem("/policy", "policy.nav", Permission.POLICY_ADMIN, order=40)
NUMBERS = ("ready_timeout_seconds", "backoff_base_seconds", "backoff_max_seconds", "backoff_limit")


def register(router: APIRouter) -> None:

    @router.get("/policy")
    async def policy(request: Request, saved: bool = False,
                     principal: Principal = Depends(signed_in(Permission.POLICY_ADMIN))) -> Response:
        current = await reads_of(request).gang_policy()
        return render(request, principal, "policy.html", "policy", messages=("policy.", "numbers."), policy=current,
                      bounds=fleet.policy_bounds(), numbers=NUMBERS, saved=saved,
                      plain=lambda value: numparse.written(value, locale_of(request)))

    @router.put("/policy")
    async def set_policy_as_typed(request: Request,
                                  principal: Principal = Depends(require(Permission.POLICY_ADMIN))) -> Response:
        """The policy form: ``{"numbers": {name: "<as typed>"}, "sequential_admission": .., "node_failure_strategy":
        ..}``. A number the page's locale cannot read is refused (422, ``error: unreadable_number``, ``fields``:
        each field's reason in the page's words); else the API's PUT."""
        try:
            asked = await request.json()
            typed = asked.get("numbers") or {}
        except (ValueError, AttributeError):
            asked, typed = {}, {}
        locale = locale_of(request)
        values, refused = read_numbers(typed if isinstance(typed, dict) else {}, locale)
        if refused:
            return JSONResponse({"error": "unreadable_number", "reason": " ".join(refused.values()),
                                 "fields": refused}, status_code=422)
        try:
            body = GangPolicy(**values, **{k: asked[k] for k in ("sequential_admission", "node_failure_strategy")
                                           if k in asked})
        except ValidationError as exc:
            errors = [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()]
            return JSONResponse({"error": "invalid", "reason": "invalid policy", "errors": errors}, status_code=422)
        return await set_gang_policy(request, principal, body)


def read_numbers(typed: dict, locale: str) -> tuple[dict[str, float | None], dict[str, str]]:
    """The form's numbers read in ``locale``: (values, empty -> None) and, per field it cannot read, the reason."""
    values: dict[str, float | None] = {}
    refused: dict[str, str] = {}
    group, point = numparse.separators(locale)
    for name in NUMBERS:
        text = typed.get(name)
        text = text.strip() if isinstance(text, str) else ""
        if not text:
            values[name] = None
            continue
        reading = numparse.parse_number(text, locale)
        if reading.ok:
            values[name] = int(reading.value) if reading.value.is_integer() else reading.value
        else:
            refused[name] = i18n.translate(locale, f"numbers.{reading.problem}", text=text, group=group, point=point,
                                           other=numparse.written(reading.other, locale),
                                           mine=numparse.written(reading.mine, locale))
    return values, refused
