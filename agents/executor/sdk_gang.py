"""The SDK for gangs, jobs with several workers: ``init_distributed``, ``report_ready``, and the two ways a worker
ends at once, ``exit_peer_lost`` and ``exit_stopped``. Part of ``teto.sdk``: sdk.py imports these for its surface.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, NoReturn

from . import sdk_link


def report_ready() -> None:
    """Tell the agent this worker's process group has formed. A gang runs (and is charged) only once every
    worker has said so; one that has not within the ready timeout is stopped and backed off."""
    sdk_link.send({"type": "ready"})


def exit_peer_lost(exc: BaseException | str) -> NoReturn:
    """End this worker because the gang lost a peer (a collective failed): exit status ``EXIT_PEER_LOST``, which
    the queue does not count as a training failure. It waits for the real cause (the peer's own failure, or
    its node's lease expiry) before deciding what happens to the job.

    The held step report is written and a background checkpoint in flight finished first; then the process
    ends at once (``os._exit``), without the interpreter's teardown: a process group whose peer vanished can
    abort there (gloo's threads: "terminate called without an active exception", SIGABRT), and an abort would
    read as this worker's own training failure, spending an attempt."""
    import sys

    print(f"a peer of this gang was lost: {exc}", file=sys.stderr, flush=True)
    sdk_link.flush_steps()
    sdk_link.flush_at_exit()
    sys.stdout.flush()
    os._exit(sdk_link.EXIT_PEER_LOST)


def exit_stopped() -> NoReturn:
    """End a stopped gang worker at once with ``EXIT_STOPPED``, as ``exit_peer_lost`` ends a lost one: the held step
    report written and a background checkpoint finished first, then ``os._exit``, skipping the interpreter's
    teardown, where a process group whose peers are leaving too can abort (gloo's threads: SIGABRT), which would
    read as the worker's own failure."""
    import sys

    sdk_link.flush_steps()
    sdk_link.flush_at_exit()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(sdk_link.EXIT_STOPPED)


def init_distributed(backend: str | None = None, *, timeout_seconds: float | None = None) -> Any:
    """Join the gang: ``torch.distributed.init_process_group`` at ``TETO_RENDEZVOUS`` (rank 0's host and the port
    the queue chose) with this worker's rank and world size, a barrier, then ``report_ready()``.

    Returns ``torch.distributed`` (None for a single worker: nothing to join). The backend is nccl on a GPU and
    gloo on a CPU unless given. While the group forms, SIGTERM ends the process at once (a blocked rendezvous
    never gets to poll ``stop_requested()``); afterwards stops are handled as usual. A group that cannot form
    ends the process with ``EXIT_PEER_LOST``. The timeout (also the collectives' timeout) defaults to the
    queue's ready timeout, at least 30 s."""
    ctx = sdk_link.context()
    if ctx.world_size <= 1:
        return None
    import datetime

    import torch
    import torch.distributed as dist

    if not ctx.rendezvous:
        exit_peer_lost("no rendezvous (TETO_RENDEZVOUS) for a gang worker")
    if backend is None:
        backend = "nccl" if ctx.device == "cuda" and torch.cuda.is_available() else "gloo"
    if timeout_seconds is None:
        configured = os.environ.get("TETO_READY_TIMEOUT", "")
        timeout_seconds = float(configured) if configured else 300.0
    restore = None
    if threading.current_thread() is threading.main_thread():
        restore = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        if backend == "nccl":
            torch.cuda.set_device(0)  # the agent exposes this worker's GPUs only (CUDA_VISIBLE_DEVICES)
        dist.init_process_group(backend, init_method=f"tcp://{ctx.rendezvous}", rank=ctx.rank,
                                world_size=ctx.world_size, timeout=datetime.timedelta(seconds=max(30.0, timeout_seconds)))
        dist.barrier()
    except Exception as exc:  # noqa: BLE001 - a store that cannot bind or be reached, a peer that never came
        exit_peer_lost(f"the gang could not form at {ctx.rendezvous}: {exc}")
    finally:
        if restore is not None:
            signal.signal(signal.SIGTERM, restore)
    report_ready()
    return dist
