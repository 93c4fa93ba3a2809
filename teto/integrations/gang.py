"""What a training-stack callback does for a gang (a job with several workers), at the edge with
``torch.distributed``: tell the agent the process group formed, stop every worker at the same step, and end a
worker whose peer was lost with ``teto.sdk.EXIT_PEER_LOST`` (not a training error) instead of a traceback.

The stack (``Trainer``/``accelerate``, Lightning) forms the group itself from the ``torch.distributed`` variables
the agent gives every worker (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...: ``agents/executor/distenv.py``).
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any

from teto import sdk

from . import policy

_hook: dict[str, Any] = {"installed": False, "previous": None}


def world_size() -> int:
    return sdk.context().world_size


def group_formed() -> bool:
    """Whether this process is in a formed ``torch.distributed`` group of more than one worker."""
    if world_size() <= 1:
        return False
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def ready() -> None:
    """The group formed: a gang runs (and is charged) only once every worker said so (``sdk.report_ready``)."""
    if world_size() > 1:
        sdk.report_ready()
        install_peer_lost()


def stop_together(requested: bool) -> bool:
    """Whether to stop at this step: this worker's own request, or any peer's (an all-reduce of one flag; only in a
    formed group of more than one). One that fails means a peer is gone: the worker ends as peer-lost."""
    if not group_formed():
        return requested
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if requested else 0], dtype=torch.int32)
    try:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    except Exception as exc:  # noqa: BLE001 - a collective that fails is a lost peer, whatever its type
        sdk.exit_peer_lost(exc)
    return policy.stop_agreed([bool(flag.item())])


def is_peer_lost(exc: BaseException) -> bool:
    """A ``torch.distributed`` error (a collective or the store failing): the peer, not this worker's training,
    went away. Judged by the exception's type and its causes, never by its text."""
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, dist.DistError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _excepthook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if world_size() > 1 and is_peer_lost(exc):
        sdk.exit_peer_lost(exc)
    previous = _hook["previous"] or sys.__excepthook__
    previous(kind, exc, tb)


def install_peer_lost() -> None:
    """An uncaught ``torch.distributed`` error ends a gang worker with ``EXIT_PEER_LOST`` (once per process)."""
    if _hook["installed"]:
        return
    _hook["installed"], _hook["previous"] = True, sys.excepthook
    sys.excepthook = _excepthook
