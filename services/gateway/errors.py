"""The gateway's error type: an HTTP status, a short code, a reason a person reads, and the numbers behind it."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    def __init__(self, status: int, error: str, reason: str, **extra: Any) -> None:
        super().__init__(reason)
        self.status = status
        self.body = {"error": error, "reason": reason, **extra}


def not_found(what: str, ident: str) -> ApiError:
    return ApiError(404, "not_found", f"no such {what}: {ident}")


def unavailable() -> ApiError:
    return ApiError(503, "unavailable", "the gateway is not connected to the database and the bus")
