"""What a training-stack callback does for a gang (a job with several workers), at the edge with
``torch.distributed``: tell the agent the process group formed, stop every worker at the same step, and end a
worker whose peer was lost with ``teto.sdk.EXIT_PEER_LOST`` (not a training error) instead of a traceback. A peer
is lost when the error came out of a collective, or when a peer stopped counting itself alive in the gang's store
(each worker does once a second, a thread of its own), or that store (rank 0's process) is gone.

The stack (``Trainer``/``accelerate``, Lightning) forms the group itself from the ``torch.distributed`` variables
the agent gives every worker (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...: ``agents/executor/distenv.py``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, NoReturn

from teto import sdk

from . import policy

_hook: dict[str, Any] = {"installed": False, "previous": None}
_beat: dict[str, Any] = {"thread": None}
BEAT_SECONDS = 1.0  # how often each worker counts itself alive in rank 0's store


def world_size() -> int:
    return sdk.context().world_size


def group_formed(world: int | None = None) -> bool:
    """Whether this process is in a formed ``torch.distributed`` group of more than one worker (``world``: the
    gang's size, when the caller knows it)."""
    if (world_size() if world is None else world) <= 1:
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
        start_beating()


def stop_together(requested: bool, checkpoint_first: Callable[[], bool], world: int | None = None
                  ) -> tuple[bool, bool]:
    """(stop, checkpoint first) for this step: this worker's own stop request and whether its stop asks for a
    checkpoint (``checkpoint_first``, read only once a stop came), or any peer's: in a formed group of more than
    one, an all-reduce (max) of the two flags, so every worker stops at the same step and they all save or none
    does (rank 0 writes; a save is collective). One that fails means a peer is gone: the worker ends as
    peer-lost. ``world``: the gang's size, when the caller knows it (a single worker then costs nothing)."""
    save = requested and checkpoint_first()
    if not group_formed(world):
        return requested, save
    import torch
    import torch.distributed as dist

    flags = torch.tensor([int(requested), int(save)], dtype=torch.int32)
    try:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    except Exception as exc:  # noqa: BLE001 - a collective that fails is a lost peer, whatever its type
        sdk.exit_peer_lost(exc)
    return policy.stop_agreed([bool(flags[0].item())]), bool(flags[1].item())


def end_stopped(world: int) -> NoReturn:
    """End a run stopped by a stop request, after its checkpoint: ``SystemExit(EXIT_STOPPED)`` for a single worker;
    a gang worker at once (``sdk.exit_stopped``: its process group could abort in the interpreter's teardown)."""
    if world > 1:
        sdk.exit_stopped()
    raise SystemExit(sdk.EXIT_STOPPED)


# Where a collective is called from: an error raised through these modules' frames came out of a collective (a
# plain RuntimeError from gloo when the peer's connection closed, e.g. in DDP's buffer broadcast before a forward).
COLLECTIVE_MODULES = ("torch.distributed", "torch.nn.parallel.distributed")


def is_peer_lost(exc: BaseException) -> bool:
    """A ``torch.distributed`` error (a ``DistError``), or an error raised out of a collective (a frame of
    ``COLLECTIVE_MODULES`` in its traceback): the peer, not this worker's training, went away. Judged by the
    exception's type, its causes and where it was raised, never by its text."""
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, dist.DistError) or raised_in(current, COLLECTIVE_MODULES):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def raised_in(exc: BaseException, modules: tuple[str, ...]) -> bool:
    """Whether any frame of ``exc``'s traceback runs code of one of ``modules`` (or their submodules)."""
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_globals.get("__name__", "")
        if isinstance(name, str) and any(name == m or name.startswith(m + ".") for m in modules):
            return True
        tb = tb.tb_next
    return False


def _liveness_store() -> Any:
    """A client of the gang's store (rank 0's, at ``MASTER_ADDR:MASTER_PORT``), under a prefix of Teto's own."""
    import datetime

    import torch.distributed as dist

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=5), wait_for_workers=False)
    return dist.PrefixStore("teto-liveness", store)


def start_beating() -> None:
    """Count this worker alive in the gang's store every ``BEAT_SECONDS`` (a daemon thread, once per process): a
    peer whose count stops is gone (``peers_gone``). Without the torch.distributed variables, nothing."""
    if _beat["thread"] is not None or "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
        return
    rank = sdk.context().rank

    def beat() -> None:
        try:
            store = _liveness_store()
            while True:
                store.add(f"alive/{rank}", 1)
                time.sleep(BEAT_SECONDS)
        except Exception:  # noqa: BLE001 - the store (rank 0) is gone: nothing left to count in
            return

    _beat["thread"] = threading.Thread(target=beat, name="teto-gang-beat", daemon=True)
    _beat["thread"].start()


def peers_gone(wait: float = 3 * BEAT_SECONDS) -> bool:
    """Whether a peer of this worker stopped counting itself alive over ``wait`` seconds, or the store they count
    in (rank 0's process) is gone: the peer, not this worker's training, failed."""
    ctx = sdk.context()
    peers = [r for r in range(ctx.world_size) if r != ctx.rank]
    try:
        store = _liveness_store()  # a client of its own: the beating thread's may be inside a call
        before = [int(store.add(f"alive/{r}", 0)) for r in peers]
        time.sleep(wait)
        after = [int(store.add(f"alive/{r}", 0)) for r in peers]
    except Exception:  # noqa: BLE001 - the store cannot be reached: rank 0 is gone
        return True
    return policy.beats_stopped(before, after)


def _excepthook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    # An error out of a collective is a lost peer; any other is one only if a peer is found gone (gloo's error in
    # DDP's backward comes out of the autograd engine, like a training bug would).
    if world_size() > 1 and not isinstance(exc, KeyboardInterrupt) and (is_peer_lost(exc) or peers_gone()):
        sdk.exit_peer_lost(exc)
    previous = _hook["previous"] or sys.__excepthook__
    previous(kind, exc, tb)


def install_peer_lost() -> None:
    """An uncaught ``torch.distributed`` error ends a gang worker with ``EXIT_PEER_LOST`` (once per process)."""
    if _hook["installed"]:
        return
    _hook["installed"], _hook["previous"] = True, sys.excepthook
    sys.excepthook = _excepthook
