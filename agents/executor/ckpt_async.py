"""Background checkpoints for ``sdk.save_checkpoint(..., background=True)``.

The caller's thread only takes a snapshot in host memory (``snapshot``: every tensor copied to the CPU, into
the staging buffers of the previous snapshot when shapes match, so no fresh pages are faulted in; everything
else deep-copied). A ``BackgroundWriter`` thread then writes it exactly as a synchronous save does
(``checkpoints.save``: temp file, fsync, atomic rename, checksummed sidecar) and only then calls ``on_done``,
which reports the checkpoint: the agent is never told of a checkpoint that is not complete.

At most one write is in flight. A new save WAITS for the previous write to finish before it snapshots (it
never supersedes it): every checkpoint asked for is written, in step order, and the staging buffers are free
to be reused. Training stalls for the snapshot only, unless checkpoints come faster than they are written.

A crash (SIGKILL) in the middle of a background write leaves at most a ``.step-*.tmp`` file (not a checkpoint
name) or a renamed file without its sidecar (invalid): ``checkpoints.latest_valid`` skips both, so a resume
loads the previous complete checkpoint. A write that fails raises its error at the next save or wait.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from . import checkpoints
from .ckpt_quota import CheckpointRefused


def _is_tensor(obj: Any) -> bool:
    # No torch import here: a script saving bytes must not pay for it.
    return type(obj).__module__.startswith("torch") and hasattr(obj, "detach") and hasattr(obj, "copy_")


def _tensor(t: Any, old: Any, memo: dict[tuple, Any]) -> Any:
    import torch

    t = t.detach()
    key = (t.device.type, t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
    if key in memo:  # tied weights (one storage under two names) stay one tensor in the snapshot
        return memo[key]
    if (_is_tensor(old) and old.device.type == "cpu" and old.shape == t.shape and old.dtype == t.dtype
            and old.is_contiguous() and old.data_ptr() != t.data_ptr()):
        buf = old
    else:
        pin = t.device.type == "cuda" and torch.cuda.is_available()
        buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
    buf.copy_(t, non_blocking=t.device.type == "cuda")
    memo[key] = buf
    return buf


def _snap(obj: Any, old: Any, memo: dict[tuple, Any], tensors: list[Any]) -> Any:
    if _is_tensor(obj):
        out = _tensor(obj, old, memo)
        if obj.device.type == "cuda":
            tensors.append(obj)
        return out
    if isinstance(obj, dict):
        prev = old if isinstance(old, dict) else {}
        items = ((k, _snap(v, prev.get(k), memo, tensors)) for k, v in obj.items())
        return OrderedDict(items) if isinstance(obj, OrderedDict) else dict(items)
    if isinstance(obj, list | tuple) and type(obj) in (list, tuple):
        prev = old if isinstance(old, list | tuple) and len(old) == len(obj) else [None] * len(obj)
        return type(obj)(_snap(v, o, memo, tensors) for v, o in zip(obj, prev, strict=True))
    return copy.deepcopy(obj)


def snapshot(state: Any, reuse: Any = None) -> Any:
    """A copy of ``state`` in host memory that later changes to ``state`` cannot reach.

    Dicts, lists and tuples are rebuilt; tensors are copied to the CPU (into ``reuse``'s tensor at the same
    place when it has the same shape and dtype: pass the previous snapshot once its write is done); anything
    else is deep-copied. ``bytes`` are copied as they are."""
    if isinstance(state, bytes | bytearray | memoryview):
        return bytes(state)
    cuda: list[Any] = []
    out = _snap(state, reuse, {}, cuda)
    if cuda:
        import torch

        torch.cuda.synchronize()  # the non-blocking device-to-host copies are complete before we return
    return out


def write_payload(f: BinaryIO, payload: Any) -> None:
    """Serialise a snapshot into the open temp file (bytes as they are, anything else with torch.save)."""
    if isinstance(payload, bytes):
        f.write(payload)
    else:
        import torch

        torch.save(payload, f)


class BackgroundWriter:
    """One checkpoint write at a time on a worker thread; ``wait`` blocks until it is durable and reported."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self._error: BaseException | None = None
        self._staging: Any = None

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._busy

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the write in flight (if any); re-raise its error once. False if ``timeout`` ran out."""
        with self._cond:
            if not self._cond.wait_for(lambda: not self._busy, timeout):
                return False
            error, self._error = self._error, None
        if error is not None:
            raise RuntimeError(f"a background checkpoint write failed: {error}") from error
        return True

    def submit(self, directory: Path, step: int, state: Any, *, fmt: str,
               on_done: Callable[[checkpoints.Checkpoint], None], quota: int | None = None,
               on_refused: Callable[[CheckpointRefused], None] | None = None) -> None:
        """Wait for the previous write, snapshot ``state`` on this thread, and write it on a worker thread. One
        over ``quota`` is removed, ``on_refused`` is told at once, and its error raised at the next save or wait."""
        self.wait()
        payload = snapshot(state, self._staging)
        self._staging = None if isinstance(payload, bytes) else payload
        with self._cond:
            self._busy = True
        # Not a daemon: an interpreter that is exiting waits for the checkpoint to be complete.
        threading.Thread(target=self._run, args=(Path(directory), int(step), payload, fmt, on_done, quota, on_refused),
                         name=f"teto-checkpoint-{step}", daemon=False).start()

    def _run(self, directory: Path, step: int, payload: Any, fmt: str, on_done: Callable[[checkpoints.Checkpoint], None],
             quota: int | None = None, on_refused: Callable[[CheckpointRefused], None] | None = None) -> None:
        error: BaseException | None = None
        try:
            ckpt = checkpoints.save(directory, step, lambda f: write_payload(f, payload), fmt=fmt, quota=quota)
            on_done(ckpt)  # only now, after the rename and the sidecar: the checkpoint is complete
        except CheckpointRefused as exc:
            error = exc
            if on_refused is not None:
                on_refused(exc)  # the person sees why now, not only when the training thread next saves
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread at its next save or wait
            error = exc
        with self._cond:
            self._busy = False
            self._error = error
            self._cond.notify_all()
