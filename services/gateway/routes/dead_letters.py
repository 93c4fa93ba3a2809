"""Dead letters (operators, ``fleet:manage``): messages a service gave up on, with the reason, and replay after
a fix. Replays are recorded as gateway outcomes, so the audit log shows who replayed what."""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.encoders import jsonable_encoder

from libs.contracts.commands import CommandOutcome
from libs.contracts.envelope import new_id
from libs.contracts.secrets import redact  # a dead grant or submit quotes sealed secrets: shown redacted

from ..auth import Permission, Principal, require
from ..dead_letters import DeadLetters, refusal, view
from ..errors import ApiError, not_found, unavailable

def _letters(request: Request) -> DeadLetters:
    letters = getattr(request.app.state, "dead_letters", None)
    if letters is None:
        raise unavailable()
    return letters


SERVICE_PATTERN = r"^[a-z][a-z0-9_-]{0,63}$"


async def page_of(letters: DeadLetters, *, service: str | None, after_seq: int, limit: int) -> dict[str, Any]:
    """A page of dead letters as ``GET /v1/dead-letters`` answers it (the panel's page shows the same): each as
    ``view`` shows it with secrets redacted, where the next page starts (None: this was the last), the counts."""
    found = await letters.list(service=service, after_seq=after_seq, limit=limit)
    return {"dead_letters": jsonable_encoder([redact(view(seq, letter, letters.prefix)) for seq, letter in found]),
            "next_after_seq": found[-1][0] if len(found) == limit else None, "counts": await letters.counts()}


def register(app: FastAPI) -> None:

    @app.get("/v1/dead-letters", tags=["operations"],
             summary="Messages a service gave up on (permanent failure, deliveries exhausted, unpublishable)")
    async def list_dead_letters(request: Request,
                                service: str | None = Query(None, pattern=SERVICE_PATTERN),
                                after_seq: int = Query(0, ge=0, le=2**53), limit: int = Query(50, ge=1, le=500),
                                _: Principal = Depends(require(Permission.FLEET_MANAGE))) -> dict[str, Any]:
        return await page_of(_letters(request), service=service, after_seq=after_seq, limit=limit)

    @app.get("/v1/dead-letters/{seq}", tags=["operations"], summary="One dead letter")
    async def get_dead_letter(request: Request, seq: int = Path(ge=1, le=2**53),
                              _: Principal = Depends(require(Permission.FLEET_MANAGE))) -> dict[str, Any]:
        letters = _letters(request)
        letter = await letters.get(seq)
        if letter is None:
            raise not_found("dead letter", str(seq))
        return jsonable_encoder(redact(view(seq, letter, letters.prefix)))

    @app.post("/v1/dead-letters/{seq}/replay", tags=["operations"],
              summary="Publish a dead letter's message again on its original subject (after a fix)",
              responses={409: {"description": "Its payload was cut, or its subject is one only the part that sent "
                                                "it may publish: it cannot be replayed"}})
    async def replay_dead_letter(request: Request, seq: int = Path(ge=1, le=2**53),
                                 principal: Principal = Depends(require(Permission.FLEET_MANAGE))) -> dict[str, Any]:
        letters = _letters(request)
        letter = await letters.get(seq)
        if letter is None:
            raise not_found("dead letter", str(seq))
        refused = refusal(seq, letter, letters.prefix)
        if refused:
            raise ApiError(409, "not_replayable", refused)
        done = await letters.replay(seq, letter)
        commands = request.app.state.commands
        if commands is not None:
            await commands.record(CommandOutcome(command_id=new_id(), kind="dead_letter_replay", accepted=True,
                                                 by="gateway", detail={"actor": principal.actor, "seq": seq,
                                                                       "subject": done.subject,
                                                                       "service": letter.service}))
        return {"seq": seq, "replayed": True, "subject": done.subject, "msg_id": done.msg_id}
