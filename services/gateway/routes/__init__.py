"""HTTP routes of the gateway, one module per area; each route declares its permission with require()."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from ..errors import unavailable

COMMAND_KEY = "x-teto-command"  # openapi_extra marker: the command kind a route issues (refusals are audited)


def reads_of(request: Request) -> Any:
    reads = request.app.state.reads
    if reads is None:
        raise unavailable()
    return reads


def commands_of(request: Request) -> Any:
    commands = request.app.state.commands
    if commands is None:
        raise unavailable()
    return commands
