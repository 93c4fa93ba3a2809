"""The tiny client a training script uses to talk to its Teto executor, imported by scripts as ``teto.sdk``.

It lives in the agent package (it is the child's side of the agent's report pipe) and ``teto.sdk`` re-exports
it, so user scripts keep importing ``sdk`` from ``teto`` while the agent never imports the launcher on top.

Under Teto the agent starts the script with ``TETO_*`` environment variables (job, rank, where checkpoints
live, where to resume from) and the write end of a pipe in ``TETO_REPORT_FD``; every call here writes one JSON
line to it, except that step reports are held back to at most 4 lines a second (``sdk_steps.py``). Outside
Teto the same calls are no-ops, except that checkpoints are still saved (to ``TETO_CHECKPOINT_DIR`` or
``./checkpoints``), so a script runs the same on a laptop.

Stopping: the agent sends SIGTERM. A script that polls ``stop_requested()`` decides itself when to stop (and
may write a final checkpoint when ``checkpoint_on_stop()`` says the stop asked for one); a script that never
polls is ended at its next ``report_step`` with exit status 143. If the agent is gone (the pipe is broken) the
process exits at once: a training process whose agent died must not keep writing past its lease.

Checkpoints: ``save_checkpoint(state, step, background=True)`` blocks only for a copy of the state in host memory
and writes it on a background thread (``ckpt_async.py``); ``wait_checkpoints()`` waits for that write. Once a
checkpoint is complete, the older ones beyond the newest ``TETO_CHECKPOINTS_KEPT`` complete ones (the job's
``checkpoints_kept``, else the executor's default, 3) are deleted by this process (``checkpoints.prune``); outside
Teto, unset, every checkpoint is kept. A checkpoint larger than the job's quota (``TETO_CHECKPOINT_QUOTA_BYTES``)
is removed before it gets its name, reported to the agent as refused, and raises ``CheckpointRefused``.

Imports nothing heavy: torch is imported only when ``save_checkpoint`` is given an object to serialise.
"""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

from . import checkpoints as _ckpt
from . import ckpt_dir as _dir
from . import ckpt_quota as _quota
from . import sdk_ckpt as _sdk_ckpt
from . import sdk_context as _context
from . import sdk_steps as _steps
from . import sdk_trace as _trace
from .ckpt_async import BackgroundWriter
from .sdk_context import Context

CheckpointRefused = _quota.CheckpointRefused
CheckpointInvalid = _dir.Invalid
Manifest = _dir.Manifest
__all__ = ["EXIT_AGENT_GONE", "EXIT_PEER_LOST", "EXIT_STOPPED", "CheckpointInvalid", "CheckpointRefused", "Context",
           "Manifest", "checkpoint_on_stop", "context", "exit_peer_lost", "exit_stopped", "init_distributed", "report_checkpoint",
           "report_phase", "report_ready", "report_step", "resume_checkpoint", "save_checkpoint",
           "seal_checkpoint", "sleep", "stop_requested", "trace_parent", "wait_checkpoints"]

EXIT_AGENT_GONE = 75  # EX_TEMPFAIL: the report pipe broke, the agent is gone
EXIT_PEER_LOST = 76  # a gang worker whose group could not form or lost a peer: not a training error
EXIT_STOPPED = 143  # 128 + SIGTERM, the conventional status of a process ended by SIGTERM

_lock = threading.Lock()
# Set from the SIGTERM handler: a plain flag, never a threading.Event. A stop may be signalled twice (a signal to
# the guard, which forwards it, on top of the agent's), and a handler run that interrupts the first
# inside Event.set() would block forever on the Event's own lock, leaving the process to be killed at the grace.
_stop = {"set": False}
_state: dict[str, Any] = {"installed": False, "polled": False, "last_step_at": None, "fd": None}
_writer = BackgroundWriter()
_held = _steps.Held()  # the step report held back (sdk_steps.py), written under _lock


def context() -> Context:
    """Where this process stands, read from the ``TETO_*`` environment the agent started it with."""
    _install()
    return _context.from_environ(os.environ)


# -- stopping ------------------------------------------------------------------------------------------------


def _on_sigterm(signum: int, frame: Any) -> None:
    _stop["set"] = True


def _install() -> None:
    """Catch SIGTERM (once, from the main thread) so a stop can end the step cleanly instead of mid-write."""
    if _state["installed"]:
        return
    _state["installed"] = True
    _trace.start()
    if threading.current_thread() is threading.main_thread() and os.environ.get("TETO_JOB_ID"):
        signal.signal(signal.SIGTERM, _on_sigterm)


def stop_requested() -> bool:
    """True once the agent asked this process to stop; the script then owns when it exits."""
    _install()
    _state["polled"] = True
    return _stop["set"]


def checkpoint_on_stop() -> bool:
    """Whether the stop asked for a final checkpoint (budget ceiling) or just an exit (the agent decides)."""
    path = os.environ.get("TETO_STOP_FILE")
    if not path:
        return True
    try:
        return bool(json.loads(Path(path).read_text()).get("checkpoint_first", False))
    except (OSError, ValueError):
        return False


def sleep(seconds: float) -> bool:
    """Sleep, waking early when a stop is requested; returns stop_requested()."""
    deadline = time.monotonic() + seconds
    while not stop_requested():
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(left, 0.05))
    return _stop["set"]


# -- reporting -----------------------------------------------------------------------------------------------


def trace_parent() -> str | None:
    """The W3C ``traceparent`` of the job's trace this process continues (None when the run is not traced): pass it
    on to anything the script calls that should join the trace."""
    return _trace.trace_parent()


def _fd() -> int | None:
    if _state["fd"] is None:
        _state["fd"] = _context.env_int(os.environ, "TETO_REPORT_FD", -1)
    fd = _state["fd"]
    return fd if fd is not None and fd >= 0 else None


def _send(record: dict[str, Any]) -> None:
    _trace.start()  # the job's trace goes on in this process (sdk_trace.py)
    if record.get("type") == "checkpoint":
        _trace.event("checkpoint", step=record.get("step"))
    fd = _fd()
    if fd is None:
        return
    with _lock:
        if record.get("type") == "step":
            held = _steps.hold(_held, record, time.monotonic())
            if held is None:
                _start_step_timer()
                return
            _write(fd, held)
        else:
            held = _steps.take(_held, time.monotonic())  # the step a checkpoint covers goes first
            if held is not None:
                _write(fd, held)
            _write(fd, record)


def _write(fd: int, record: dict[str, Any]) -> None:
    """One JSON line on the report pipe; call with _lock held."""
    if _state["fd"] == -1:
        return
    data = (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BrokenPipeError:
        # The agent is gone, and with it the lease: stop now, without writing anything else.
        os._exit(EXIT_AGENT_GONE)
    except OSError:
        _state["fd"] = -1  # not a pipe we can use: keep training without progress reports


def _flush_steps() -> None:
    """Write the held step report, if any (the timer when its interval ends; at exit)."""
    fd = _fd()
    if fd is None:
        return
    with _lock:
        held = _steps.take(_held, time.monotonic())
        if held is not None:
            _write(fd, held)


def _step_timer() -> None:
    while True:
        time.sleep(_steps.EVERY / 2)
        if _steps.due(_held, time.monotonic()):
            _flush_steps()


def _after_fork_in_child() -> None:
    """A forked child (a data loader worker) has no timer thread, and the lock may have been held by it: start
    afresh, holding nothing."""
    global _lock
    _lock = threading.Lock()
    _state["timer"] = False
    _held.record, _held.seconds_sum, _held.seconds_n, _held.written_at = None, 0.0, 0, None


os.register_at_fork(after_in_child=_after_fork_in_child)


def _start_step_timer() -> None:
    """The daemon thread that writes a held step when its interval ends (once per process); and the last held
    step at exit."""
    if _state.get("timer"):
        return
    _state["timer"] = True
    import atexit

    atexit.register(_flush_steps)
    threading.Thread(target=_step_timer, name="teto-sdk-steps", daemon=True).start()


def _number(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def report_step(step: int, *, total_steps: int | None = None, loss: float | None = None,
                step_seconds: float | None = None, **metrics: Any) -> None:
    """Report that ``step`` finished (at most 4 a second reach the agent, the latest and the last always:
    ``sdk_steps.py``; the agent forwards at most one per progress interval). ``step_seconds``: the step's time as
    the caller measured it (a callback reporting every few steps gives their mean); else the time since the last
    report."""
    _install()
    if _stop["set"] and not _state["polled"]:
        # The script does not handle stops itself: end it here, between steps.
        raise SystemExit(EXIT_STOPPED)
    now = time.monotonic()
    last = _state["last_step_at"]
    _state["last_step_at"] = now
    if step_seconds is None and last is not None:
        step_seconds = now - last
    numeric = {k: n for k, v in metrics.items() if (n := _number(v)) is not None}
    _send({"type": "step", "step": int(step), "total_steps": total_steps, "loss": _number(loss),
           "step_seconds": _number(step_seconds), "metrics": numeric})


def report_checkpoint(step: int, path: str | os.PathLike[str]) -> None:
    """Tell the agent a checkpoint for ``step`` is complete at ``path``: a file (its sidecar written if missing) or a
    directory (``checkpoint-120/``, sealed if it has no manifest: ``seal_checkpoint``); kept like the SDK's own."""
    _install()
    path = Path(path)
    quota = context().checkpoint_quota
    if _dir.holds_checkpoint(path):
        ckpt = _sdk_ckpt.of(_seal(path, int(step)))
    else:
        if quota is not None and (size := path.stat().st_size) > quota:
            _refuse(_quota.CheckpointRefused(int(step), size, quota), path)
        ckpt, _ = _ckpt.validate(path, quota=quota)
        if ckpt is None:
            ckpt = _ckpt.write_sidecar(path, int(step))
    _send(_sdk_ckpt.record(ckpt))
    if _sdk_ckpt.in_layout(path, context().checkpoint_dir):
        _prune(int(step))


def seal_checkpoint(path: str | os.PathLike[str], step: int) -> Manifest:
    """Write a complete directory's manifest (each file's path, size, SHA-256; last, atomically: ``ckpt_dir.seal``)
    unless it has a valid one of ``step``; returns it. A link or special file inside (``CheckpointInvalid``) or more
    bytes than the quota (``CheckpointRefused``): nothing written, the agent told why."""
    _install()
    return _seal(Path(path), int(step)).manifest


def _seal(path: Path, step: int) -> _dir.Sealed:
    report_phase("checkpointing")  # hashing a large directory is no stuck step
    try:
        return _sdk_ckpt.sealed(path, step, quota=context().checkpoint_quota)
    except _quota.CheckpointRefused as exc:
        _refuse(exc, path)
    except _dir.Invalid as exc:
        _send({"type": "checkpoint_invalid", "step": step, "path": str(path.resolve()), "reason": str(exc)})
        raise
    finally:
        report_phase("training")


def report_phase(phase: str) -> None:
    """``checkpointing`` while writing a checkpoint (a pause the health service must not call stuck)."""
    _send({"type": "phase", "phase": phase})


def _refused(exc: _quota.CheckpointRefused, path: Path | None = None) -> None:
    """Tell the agent a checkpoint was refused for its size (the job shows a checkpoint_skipped event saying so)."""
    where = path if path is not None else _ckpt.checkpoint_path(context().checkpoint_dir, exc.step or 0)
    _send({"type": "checkpoint_refused", "step": exc.step, "path": str(Path(where).resolve()), "bytes": exc.size,
           "quota": exc.quota})


def _refuse(exc: _quota.CheckpointRefused, path: Path | None = None) -> NoReturn:
    _refused(exc, path)
    raise exc


def _report_saved(ckpt: _ckpt.Checkpoint) -> None:
    _send(_sdk_ckpt.record(ckpt))


def _prune(step: int) -> None:
    """Retention once the checkpoint of ``step`` is complete (``sdk_ckpt.prune``); never raises."""
    _sdk_ckpt.prune(context(), step, os.environ.get("TETO_CHECKPOINT_CONFIRMED"))


def _completed(ckpt: _ckpt.Checkpoint, *, report: bool) -> None:
    """A checkpoint is complete (renamed, sidecar written): report it, then make room, unless a stop was asked
    for: the stop's grace (the job's devices still held and charged) is not spent deleting files; the next run's
    first checkpoint deletes them."""
    if report:
        _report_saved(ckpt)
    if not _stop["set"]:
        _prune(ckpt.step)


def _flush_at_exit() -> None:
    try:
        _writer.wait()
    except RuntimeError as exc:
        import sys

        print(exc, file=sys.stderr, flush=True)


def save_checkpoint(state: Any, step: int, *, report: bool = True, background: bool = False) -> Path | None:
    """Write a checkpoint atomically with its sidecar and report it; returns its path (None on rank != 0).

    ``state`` is bytes (written as is) or any object torch can save (a state dict).

    ``background=True`` blocks only while ``state`` is copied to host memory, then writes, fsyncs, renames and
    reports on a background thread (see ``agents/executor/ckpt_async.py``); the returned path exists once
    ``wait_checkpoints()`` returns. At most one write is in flight: a new save first waits for the previous
    one. Once a stop was requested every save is synchronous, so the final checkpoint is durable before the
    process exits; a synchronous save also waits for a background one first (checkpoints land in order).
    """
    ctx = context()
    if not ctx.is_writer:
        return None
    fmt = "bytes" if isinstance(state, bytes | bytearray | memoryview) else "torch"
    if background and not _stop["set"]:
        if not _state.get("atexit"):
            import atexit

            atexit.register(_flush_at_exit)
            _state["atexit"] = True
        _writer.submit(ctx.checkpoint_dir, step, state, fmt=fmt,
                       on_done=functools.partial(_completed, report=report), quota=ctx.checkpoint_quota,
                       on_refused=_refused)
        return _ckpt.checkpoint_path(ctx.checkpoint_dir, step)
    wait_checkpoints()
    report_phase("checkpointing")
    try:
        if fmt == "bytes":
            ckpt = _ckpt.save_bytes(ctx.checkpoint_dir, step, bytes(state), quota=ctx.checkpoint_quota)
        else:
            import torch

            ckpt = _ckpt.save(ctx.checkpoint_dir, step, lambda f: torch.save(state, f), fmt="torch",
                              quota=ctx.checkpoint_quota)
    except _quota.CheckpointRefused as exc:
        _refuse(exc)
    finally:
        report_phase("training")
    _completed(ckpt, report=report)
    return ckpt.path


def wait_checkpoints() -> None:
    """Block until the background checkpoint in flight (if any) is durable and reported; raise its error."""
    if _writer.busy:
        report_phase("checkpointing")
        try:
            _writer.wait()
        finally:
            report_phase("training")
    else:
        _writer.wait()  # re-raises the error of a write that already failed


def resume_checkpoint() -> tuple[int, Path] | None:
    """(step, path) of the checkpoint to resume from (a file, or a directory: what ``resume_from_checkpoint=`` or
    ``ckpt_path=`` take), or None to start fresh. Under Teto the agent chose (and verified) it; outside Teto the
    latest valid one in the directory."""
    ctx = context()
    if ctx.in_teto:
        if ctx.resume_from is None:
            return None
        step = _sdk_ckpt.resumed_step(ctx.resume_from)
        if step is None:
            ckpt, _ = _ckpt.validate(ctx.resume_from)
            step = ckpt.step if ckpt is not None else _sdk_ckpt.step_of_resume(ctx.resume_from)
        return (step, ctx.resume_from) if step is not None else None
    ckpt, _ = _ckpt.latest_valid(ctx.checkpoint_dir)
    return (ckpt.step, ckpt.path) if ckpt else None


# -- gangs (jobs with several workers) ------------------------------------------------------------------------


def report_ready() -> None:
    """Tell the agent this worker's process group has formed. A gang runs (and is charged) only once every
    worker has said so; one that has not within the ready timeout is stopped and backed off."""
    _send({"type": "ready"})


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
    _flush_steps()
    _flush_at_exit()
    sys.stdout.flush()
    os._exit(EXIT_PEER_LOST)


def exit_stopped() -> NoReturn:
    """End a stopped gang worker at once with ``EXIT_STOPPED``, as ``exit_peer_lost`` ends a lost one: the held step
    report written and a background checkpoint finished first, then ``os._exit``, skipping the interpreter's
    teardown, where a process group whose peers are leaving too can abort (gloo's threads: SIGABRT), which would
    read as the worker's own failure."""
    import sys

    _flush_steps()
    _flush_at_exit()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_STOPPED)


def init_distributed(backend: str | None = None, *, timeout_seconds: float | None = None) -> Any:
    """Join the gang: ``torch.distributed.init_process_group`` at ``TETO_RENDEZVOUS`` (rank 0's host and the port
    the queue chose) with this worker's rank and world size, a barrier, then ``report_ready()``.

    Returns ``torch.distributed`` (None for a single worker: nothing to join). The backend is nccl on a GPU and
    gloo on a CPU unless given. While the group forms, SIGTERM ends the process at once (a blocked rendezvous
    never gets to poll ``stop_requested()``); afterwards stops are handled as usual. A group that cannot form
    ends the process with ``EXIT_PEER_LOST``. The timeout (also the collectives' timeout) defaults to the
    queue's ready timeout, at least 30 s."""
    ctx = context()
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
