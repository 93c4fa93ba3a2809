"""``TetoCallback`` for Hugging Face ``transformers``: ``Trainer``, ``Seq2SeqTrainer`` and TRL's ``SFTTrainer``,
with or without ``peft``. The three-line change::

    from teto.integrations.transformers import TetoCallback, resume_from_checkpoint
    trainer = Trainer(..., callbacks=[TetoCallback()])
    trainer.train(resume_from_checkpoint=resume_from_checkpoint())

What it does (the decisions are ``policy.py``'s): step, loss, learning rate and mean step time reach Teto at the
progress interval, never more often; under Teto, rank 0's ``checkpoint-N`` directories go to the job's checkpoint
directory and each is reported once ``Trainer`` has finished writing it (``on_save``); a stop request (GPU
ceiling, cancel, drain) sets ``should_save`` and ``should_training_stop``, so the run ends on a fresh checkpoint
within the stop grace, every worker of a gang at the same step, and the process then exits with
``teto.sdk.EXIT_STOPPED`` (code after ``train()`` is for a finished run, not a stopped one). Outside Teto it only
times steps: the script runs as it would without it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from teto import sdk

from . import cpu_location, gang, policy

__all__ = ["TetoCallback", "resume_from_checkpoint"]


def resume_from_checkpoint() -> str | None:
    """The ``checkpoint-N`` directory to pass to ``trainer.train(resume_from_checkpoint=...)``: the one the agent
    chose for this run (the latest the queue accepted), or None to start fresh."""
    return policy.resume_path(sdk.resume_checkpoint())


class TetoCallback(TrainerCallback):
    """Reports a ``Trainer``'s progress and checkpoints to Teto and stops it on a fresh checkpoint when asked."""

    def __init__(self, *, progress_interval: float | None = None) -> None:
        self.interval = policy.progress_interval(os.environ) if progress_interval is None else progress_interval
        self.pace = policy.Pace()
        self.reported: set[int] = set()
        self.stopping = False
        self._began: float | None = None
        self._pending: int | None = None  # a step whose report waits for the loss its log is about to give
        self._final = False  # the pending step is the one a stop ends the run at
        self._ctx = sdk.context()
        sdk.stop_requested()  # catches SIGTERM from here on (the callback is made on the main thread)
        cpu_location.install()  # a CPU gang's resume loads its optimizer onto cpu:0 (cpu_location.py)

    # -- where checkpoints go, and the gang ----------------------------------------------------------------

    def _place(self, args: TrainingArguments) -> None:
        root = policy.checkpoint_root(in_teto=self._ctx.in_teto, rank=self._ctx.rank,
                                      checkpoint_dir=self._ctx.checkpoint_dir, work_dir=self._ctx.work_dir,
                                      user_dir=args.output_dir)
        if root is not None and str(args.output_dir) != str(root):
            print(f"teto: checkpoints go to {root} (rank {self._ctx.rank}; output_dir was {args.output_dir})",
                  flush=True)
            args.output_dir = str(root)

    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._place(args)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kw: Any) -> None:
        self._place(args)  # a callback added after the trainer was made never saw on_init_end
        gang.ready()

    # -- steps ----------------------------------------------------------------------------------------------

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kw: Any) -> None:
        self._began = time.monotonic()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kw: Any) -> None:
        now = time.monotonic()
        policy.note_step(self.pace, None if self._began is None else now - self._began)
        if self._pending is not None:  # its log never came: report it without a loss
            self._report(self._pending, state.max_steps, now)
        # The stop file is read only once a stop came: a file read per step would be most of the callback's cost.
        requested, checkpoint_first = gang.stop_together(sdk.stop_requested(), sdk.checkpoint_on_stop,
                                                         self._ctx.world_size)
        decision = policy.on_stop(requested, checkpoint_first=checkpoint_first, saved_this_step=control.should_save)
        if decision.stop:
            self.stopping = True
            control.should_training_stop = True
            control.should_save = control.should_save or decision.save
        if control.should_save:
            sdk.report_phase("checkpointing")  # a long save is not a stuck step
        self._final = decision.stop
        if control.should_log:  # DefaultFlowCallback, first in the list, decided: the loss comes in on_log
            self._pending = state.global_step
        else:
            self._report(state.global_step, state.max_steps, now)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kw: Any) -> None:
        if logs:
            policy.note_logs(self.pace, logs)
        if self._pending is not None and self._pending == state.global_step:
            self._report(self._pending, state.max_steps, time.monotonic())

    def _report(self, step: int, max_steps: int | None, now: float) -> None:
        self._pending = None
        if not policy.report_due(self.pace, now, self.interval, step=step, max_steps=max_steps, final=self._final):
            return
        r = policy.take_report(self.pace, now, step=step, max_steps=max_steps)
        sdk.report_step(r.step, total_steps=r.total_steps, loss=r.loss, step_seconds=r.step_seconds, **r.metrics)

    # -- checkpoints and the end ----------------------------------------------------------------------------

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        """``Trainer`` calls this once the ``checkpoint-N`` directory is written (weights or adapter, optimizer,
        scheduler, RNG and trainer state): only then is it reported, rank 0's only."""
        step = state.global_step
        path = Path(args.output_dir) / f"checkpoint-{step}"
        writer = self._ctx.is_writer and state.is_world_process_zero
        if policy.report_checkpoint_due(step, is_writer=writer, reported=self.reported) and path.is_dir():
            sdk.report_checkpoint(step, path)
            self.reported.add(step)
        sdk.report_phase("training")

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kw: Any) -> None:
        if self._pending is not None:
            self._report(self._pending, state.max_steps, time.monotonic())
        if self.stopping:
            gang.end_stopped(self._ctx.world_size)
