"""``TetoCallback`` for Lightning (``lightning.pytorch``). The three-line change::

    from teto.integrations.lightning import TetoCallback, resume_from_checkpoint
    trainer = L.Trainer(..., callbacks=[TetoCallback()])
    trainer.fit(model, data, ckpt_path=resume_from_checkpoint())

The same semantics as the ``transformers`` callback (decisions in ``policy.py``): step, loss, learning rate and
mean step time at the progress interval, never more often; a stop request (GPU ceiling, cancel, drain) saves a
fresh checkpoint and sets ``trainer.should_stop``, every worker of a gang at the same step, and the process then
exits with ``teto.sdk.EXIT_STOPPED``. Checkpoints: under Teto the callback writes the job's own every
``checkpoint_every_steps`` (or ``every_n_steps``) through ``trainer.save_checkpoint`` (a full Lightning checkpoint,
what ``ModelCheckpoint`` writes) in the SDK's layout (``TETO_CHECKPOINT_DIR/step-N.pt``, so retention and resume
treat it as any file checkpoint) and reports it once written; a ``ModelCheckpoint``'s own saves in the job's
checkpoint directory are reported too once written. Outside Teto it writes nothing unless ``every_n_steps`` says.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from agents.executor.checkpoints import checkpoint_path
from teto import sdk

from . import gang, policy

__all__ = ["TetoCallback", "resume_from_checkpoint"]


def resume_from_checkpoint() -> str | None:
    """The checkpoint to pass to ``trainer.fit(..., ckpt_path=...)``: the one the agent chose for this run (the latest
    the queue accepted), or None to start fresh."""
    return policy.resume_path(sdk.resume_checkpoint())


def _loss(outputs: Any) -> Any:
    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    return outputs.detach().item() if hasattr(outputs, "detach") else outputs


class TetoCallback(Callback):
    """Reports a Lightning ``Trainer``'s progress and checkpoints to Teto and stops it on a fresh checkpoint."""

    def __init__(self, *, every_n_steps: int | None = None, progress_interval: float | None = None) -> None:
        self.interval = policy.progress_interval(os.environ) if progress_interval is None else progress_interval
        self._ctx = sdk.context()
        self.every = every_n_steps if every_n_steps is not None else (
            self._ctx.checkpoint_every if self._ctx.in_teto else None)
        self.pace = policy.Pace()
        self.reported: set[int] = set()
        self.saved: set[int] = set()
        self.stopping = False
        self._began: float | None = None
        self._seen: dict[int, str] = {}  # id of each ModelCheckpoint -> the last path of its reported
        sdk.stop_requested()  # catches SIGTERM from here on (the callback is made on the main thread)
        self._on_sigterm = signal.getsignal(signal.SIGTERM)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            gang.ready()  # the strategy formed the process group before the callbacks' setup

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._ctx.in_teto and callable(self._on_sigterm) and threading.current_thread() is threading.main_thread():
            # Under Teto this callback owns the stop: Lightning's own SIGTERM handling (installed just before the
            # fit loop runs) would end the run with status 0 after the step, and in a gang broadcast from inside
            # the handler, out of step with the collectives the workers are in.
            signal.signal(signal.SIGTERM, self._on_sigterm)

    # -- steps ----------------------------------------------------------------------------------------------

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._began = time.monotonic()
        self._report_model_checkpoints(trainer)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        now = time.monotonic()
        step = trainer.global_step
        policy.note_step(self.pace, None if self._began is None else now - self._began)
        max_steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        # The stop file is read only once a stop came: a file read per step would be most of the callback's cost.
        requested, checkpoint_first = gang.stop_together(sdk.stop_requested(), sdk.checkpoint_on_stop,
                                                         self._ctx.world_size)
        decision = policy.on_stop(requested, checkpoint_first=checkpoint_first, saved_this_step=step in self.saved)
        if policy.report_due(self.pace, now, self.interval, step=step, max_steps=max_steps, final=decision.stop):
            logs: dict[str, Any] = {"loss": _loss(outputs)}
            if trainer.optimizers:
                logs["learning_rate"] = trainer.optimizers[0].param_groups[0]["lr"]
            policy.note_logs(self.pace, logs)
            r = policy.take_report(self.pace, now, step=step, max_steps=max_steps)
            sdk.report_step(r.step, total_steps=r.total_steps, loss=r.loss, step_seconds=r.step_seconds,
                            **r.metrics)
        if decision.save or (not decision.stop and policy.cadence_due(step, self.every, saved=self.saved)):
            self._save(trainer, step)
        if decision.stop:
            self.stopping = True
            trainer.should_stop = True

    # -- checkpoints and the end ----------------------------------------------------------------------------

    def _save(self, trainer: pl.Trainer, step: int) -> None:
        """A full Lightning checkpoint of ``step`` in the job's directory (every rank takes part; rank 0 writes),
        reported once written."""
        path = checkpoint_path(self._ctx.checkpoint_dir, step)
        sdk.report_phase("checkpointing")
        try:
            if trainer.is_global_zero:
                path.parent.mkdir(parents=True, exist_ok=True)
            trainer.save_checkpoint(path)
        finally:
            sdk.report_phase("training")
        self.saved.add(step)
        writer = self._ctx.is_writer and trainer.is_global_zero
        if policy.report_checkpoint_due(step, is_writer=writer, reported=self.reported):
            sdk.report_checkpoint(step, path)
            self.reported.add(step)

    def _report_model_checkpoints(self, trainer: pl.Trainer) -> None:
        """A ``ModelCheckpoint``'s newest save (written by now: it saves after every other callback's hook), when
        it lies in the job's checkpoint directory."""
        if not (self._ctx.in_teto and self._ctx.is_writer and trainer.is_global_zero):
            return
        root = self._ctx.checkpoint_dir.resolve()
        for cb in trainer.checkpoint_callbacks:
            if not isinstance(cb, ModelCheckpoint):
                continue
            last = getattr(cb, "_last_checkpoint_saved", "") or ""
            step = getattr(cb, "_last_global_step_saved", 0) or 0
            if not last or self._seen.get(id(cb)) == last or not os.path.exists(last):
                continue
            self._seen[id(cb)] = last
            if Path(last).resolve().parent == root and policy.report_checkpoint_due(
                    step, is_writer=True, reported=self.reported):
                sdk.report_checkpoint(step, last)
                self.reported.add(step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._report_model_checkpoints(trainer)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.stopping:
            gang.end_stopped(self._ctx.world_size)
