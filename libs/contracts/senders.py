"""A report is bound to its sender: the executor id in the subject must be the one the body claims.

The bus (libs/runtime/natsauth.py) lets an executor publish heartbeats, usage, progress and check reports only
under its own id, the last token of those subjects. A body naming another executor is a forgery (or a bug):
consumers refuse it visibly (``Runtime.reject``, then the audit log) instead of charging, moving or judging
someone else's job or node with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from .envelope import ContractError
from .subjects import Subjects


class _FromExecutor(Protocol):
    executor_id: str


M = TypeVar("M", bound=_FromExecutor)


def check_sender(subject: str, claimed: str, schema: str = "teto.sender") -> None:
    """Raise ContractError when the subject's sender token is not the executor id the body claims."""
    token = Subjects.sender_token(subject)
    if token != claimed:
        raise ContractError(schema, f"sent as executor {token!r} but the body claims executor {claimed!r}: "
                                    "a report from another executor is refused")


def bound(decode: Callable[[bytes], M]) -> Callable[[str, bytes], M]:
    """A decoder that also checks the sender: ``read(subject, body)``."""

    def read(subject: str, body: bytes) -> M:
        msg = decode(body)
        check_sender(subject, msg.executor_id, getattr(msg, "SCHEMA", "teto.sender"))
        return msg

    return read


def check_node(subject: str, node_id: str, schema: str = "teto.node.registered/1") -> None:
    """A node registration (``teto.node.<node_id>.registered``) speaks for the node its subject names; the bus
    lets an executor register only its own node."""
    parts = subject.rsplit(".", 2)
    if len(parts) != 3 or parts[1] != node_id:
        raise ContractError(schema, f"registration sent for node {parts[1] if len(parts) == 3 else '?'!r} but the "
                                    f"body claims node {node_id!r}")


def registration(decode: Callable[[bytes], M]) -> Callable[[str, bytes], M]:
    def read(subject: str, body: bytes) -> M:
        msg = decode(body)
        check_node(subject, msg.node_id)
        return msg

    return read
