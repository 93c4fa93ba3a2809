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

Imports nothing heavy: torch is imported only when ``save_checkpoint`` is given an object to serialise. The
process's link to its agent (the stop flag, the report pipe, the held step, the background writer) is
``sdk_link.py``; the calls for gangs are ``sdk_gang.py``; both are part of this module's public names.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from pathlib import Path
from typing import Any, NoReturn

from . import checkpoints, ckpt_dir, ckpt_quota, sdk_ckpt, sdk_link, sdk_trace
from .sdk_context import Context
from .sdk_gang import exit_peer_lost, exit_stopped, init_distributed, report_ready
from .sdk_link import EXIT_AGENT_GONE, EXIT_PEER_LOST, EXIT_STOPPED, context

CheckpointRefused = ckpt_quota.CheckpointRefused
CheckpointInvalid = ckpt_dir.Invalid
Manifest = ckpt_dir.Manifest
__all__ = ["EXIT_AGENT_GONE", "EXIT_PEER_LOST", "EXIT_STOPPED", "CheckpointInvalid", "CheckpointRefused", "Context",
           "Manifest", "checkpoint_on_stop", "context", "exit_peer_lost", "exit_stopped", "init_distributed",
           "report_checkpoint", "report_phase", "report_ready", "report_step", "resume_checkpoint", "save_checkpoint",
           "seal_checkpoint", "sleep", "stop_requested", "trace_parent", "wait_checkpoints"]

# -- stopping ------------------------------------------------------------------------------------------------


def stop_requested() -> bool:
    """True once the agent asked this process to stop; the script then owns when it exits."""
    sdk_link.install()
    sdk_link.state["polled"] = True
    return sdk_link.stop["set"]


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
    return sdk_link.stop["set"]


# -- reporting -----------------------------------------------------------------------------------------------


def trace_parent() -> str | None:
    """The W3C ``traceparent`` of the job's trace this process continues (None when the run is not traced): pass it
    on to anything the script calls that should join the trace."""
    return sdk_trace.trace_parent()


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
    sdk_link.install()
    if sdk_link.stop["set"] and not sdk_link.state["polled"]:
        # The script does not handle stops itself: end it here, between steps.
        raise SystemExit(EXIT_STOPPED)
    now = time.monotonic()
    last = sdk_link.state["last_step_at"]
    sdk_link.state["last_step_at"] = now
    if step_seconds is None and last is not None:
        step_seconds = now - last
    numeric = {k: n for k, v in metrics.items() if (n := _number(v)) is not None}
    sdk_link.send({"type": "step", "step": int(step), "total_steps": total_steps, "loss": _number(loss),
           "step_seconds": _number(step_seconds), "metrics": numeric})


def report_checkpoint(step: int, path: str | os.PathLike[str]) -> None:
    """Tell the agent a checkpoint for ``step`` is complete at ``path``: a file (its sidecar written if missing) or a
    directory (``checkpoint-120/``, sealed if it has no manifest: ``seal_checkpoint``); kept like the SDK's own."""
    sdk_link.install()
    path = Path(path)
    quota = sdk_link.context().checkpoint_quota
    if ckpt_dir.holds_checkpoint(path):
        ckpt = sdk_ckpt.of(_seal(path, int(step)))
    else:
        if quota is not None and (size := path.stat().st_size) > quota:
            _refuse(ckpt_quota.CheckpointRefused(int(step), size, quota), path)
        ckpt, _ = checkpoints.validate(path, quota=quota)
        if ckpt is None:
            ckpt = checkpoints.write_sidecar(path, int(step))
    sdk_link.send(sdk_ckpt.record(ckpt))
    if sdk_ckpt.in_layout(path, sdk_link.context().checkpoint_dir):
        _prune(int(step))


def seal_checkpoint(path: str | os.PathLike[str], step: int) -> Manifest:
    """Write a complete directory's manifest (each file's path, size, SHA-256; last, atomically: ``ckpt_dir.seal``)
    unless it has a valid one of ``step``; returns it. A link or special file inside (``CheckpointInvalid``) or more
    bytes than the quota (``CheckpointRefused``): nothing written, the agent told why."""
    sdk_link.install()
    return _seal(Path(path), int(step)).manifest


def _seal(path: Path, step: int) -> ckpt_dir.Sealed:
    report_phase("checkpointing")  # hashing a large directory is no stuck step
    try:
        return sdk_ckpt.sealed(path, step, quota=sdk_link.context().checkpoint_quota)
    except ckpt_quota.CheckpointRefused as exc:
        _refuse(exc, path)
    except ckpt_dir.Invalid as exc:
        sdk_link.send({"type": "checkpoint_invalid", "step": step, "path": str(path.resolve()), "reason": str(exc)})
        raise
    finally:
        report_phase("training")


def report_phase(phase: str) -> None:
    """``checkpointing`` while writing a checkpoint (a pause the health service must not call stuck)."""
    sdk_link.send({"type": "phase", "phase": phase})


def _refused(exc: ckpt_quota.CheckpointRefused, path: Path | None = None) -> None:
    """Tell the agent a checkpoint was refused for its size (the job shows a checkpoint_skipped event saying so)."""
    where = path if path is not None else checkpoints.checkpoint_path(sdk_link.context().checkpoint_dir, exc.step or 0)
    sdk_link.send({"type": "checkpoint_refused", "step": exc.step, "path": str(Path(where).resolve()), "bytes": exc.size,
           "quota": exc.quota})


def _refuse(exc: ckpt_quota.CheckpointRefused, path: Path | None = None) -> NoReturn:
    _refused(exc, path)
    raise exc


def _report_saved(ckpt: checkpoints.Checkpoint) -> None:
    sdk_link.send(sdk_ckpt.record(ckpt))


def _prune(step: int) -> None:
    """Retention once the checkpoint of ``step`` is complete (``sdk_ckpt.prune``); never raises."""
    sdk_ckpt.prune(sdk_link.context(), step, os.environ.get("TETO_CHECKPOINT_CONFIRMED"))


def _completed(ckpt: checkpoints.Checkpoint, *, report: bool) -> None:
    """A checkpoint is complete (renamed, sidecar written): report it, then make room, unless a stop was asked
    for: the stop's grace (the job's devices still held and charged) is not spent deleting files; the next run's
    first checkpoint deletes them."""
    if report:
        _report_saved(ckpt)
    if not sdk_link.stop["set"]:
        _prune(ckpt.step)


def save_checkpoint(state: Any, step: int, *, report: bool = True, background: bool = False) -> Path | None:
    """Write a checkpoint atomically with its sidecar and report it; returns its path (None on rank != 0).

    ``state`` is bytes (written as is) or any object torch can save (a state dict).

    ``background=True`` blocks only while ``state`` is copied to host memory, then writes, fsyncs, renames and
    reports on a background thread (see ``agents/executor/ckpt_async.py``); the returned path exists once
    ``wait_checkpoints()`` returns. At most one write is in flight: a new save first waits for the previous
    one. Once a stop was requested every save is synchronous, so the final checkpoint is durable before the
    process exits; a synchronous save also waits for a background one first (checkpoints land in order).
    """
    ctx = sdk_link.context()
    if not ctx.is_writer:
        return None
    fmt = "bytes" if isinstance(state, bytes | bytearray | memoryview) else "torch"
    if background and not sdk_link.stop["set"]:
        if not sdk_link.state.get("atexit"):
            import atexit

            atexit.register(sdk_link.flush_at_exit)
            sdk_link.state["atexit"] = True
        sdk_link.writer.submit(ctx.checkpoint_dir, step, state, fmt=fmt,
                       on_done=functools.partial(_completed, report=report), quota=ctx.checkpoint_quota,
                       on_refused=_refused)
        return checkpoints.checkpoint_path(ctx.checkpoint_dir, step)
    wait_checkpoints()
    report_phase("checkpointing")
    try:
        if fmt == "bytes":
            ckpt = checkpoints.save_bytes(ctx.checkpoint_dir, step, bytes(state), quota=ctx.checkpoint_quota)
        else:
            import torch

            ckpt = checkpoints.save(ctx.checkpoint_dir, step, lambda f: torch.save(state, f), fmt="torch",
                              quota=ctx.checkpoint_quota)
    except ckpt_quota.CheckpointRefused as exc:
        _refuse(exc)
    finally:
        report_phase("training")
    _completed(ckpt, report=report)
    return ckpt.path


def wait_checkpoints() -> None:
    """Block until the background checkpoint in flight (if any) is durable and reported; raise its error."""
    if sdk_link.writer.busy:
        report_phase("checkpointing")
        try:
            sdk_link.writer.wait()
        finally:
            report_phase("training")
    else:
        sdk_link.writer.wait()  # re-raises the error of a write that already failed


def resume_checkpoint() -> tuple[int, Path] | None:
    """(step, path) of the checkpoint to resume from (a file, or a directory: what ``resume_from_checkpoint=`` or
    ``ckpt_path=`` take), or None to start fresh. Under Teto the agent chose (and verified) it; outside Teto the
    latest valid one in the directory."""
    ctx = sdk_link.context()
    if ctx.in_teto:
        if ctx.resume_from is None:
            return None
        step = sdk_ckpt.resumed_step(ctx.resume_from)
        if step is None:
            ckpt, _ = checkpoints.validate(ctx.resume_from)
            step = ckpt.step if ckpt is not None else sdk_ckpt.step_of_resume(ctx.resume_from)
        return (step, ctx.resume_from) if step is not None else None
    ckpt, _ = checkpoints.latest_valid(ctx.checkpoint_dir)
    return (ckpt.step, ckpt.path) if ckpt else None


