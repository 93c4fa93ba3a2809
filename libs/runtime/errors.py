"""How a consumer's failure is judged: permanent (the message can never succeed: dead-lettered and acked) or
transient (the world is not ready: redelivered with back-off, up to the consumer's delivery limit).

Raise ``PermanentError`` from a handler or store for input that is valid on the wire but can never be applied
(a value the database refuses, a reference to something that cannot exist). Anything else is transient until
``is_permanent`` says otherwise; a transient failure that keeps failing is dead-lettered once its deliveries are
spent, so no message is redelivered forever.
"""

from __future__ import annotations

import asyncpg

from libs.contracts.envelope import ContractError


class PermanentError(Exception):
    """This message can never be applied; ``reason`` is what a person reads in the dead letter."""

    retryable = False

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TransientError(Exception):
    """Try again later (a dependency is away); redelivered with back-off."""

    retryable = True


# PostgreSQL refuses the data itself (NUL in text, out of range, bad encoding, a constraint): retrying the same
# message gives the same answer. Connection and availability errors are not in this list: they are transient.
_PERMANENT_DB = (
    asyncpg.DataError,  # class 22: NUL in text/jsonb, numeric out of range, invalid text representation
    asyncpg.IntegrityConstraintViolationError,  # class 23
    asyncpg.SyntaxOrAccessError,  # class 42 (a bug, but one that a redelivery will not fix)
)


def is_permanent(exc: BaseException) -> bool:
    """True when redelivering the same message cannot change the outcome."""
    if isinstance(exc, (PermanentError, ContractError)):
        return True
    if getattr(exc, "retryable", None) is False:
        return True
    return isinstance(exc, _PERMANENT_DB)


def reason_of(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason) if reason else f"{type(exc).__name__}: {exc}"[:4000]
