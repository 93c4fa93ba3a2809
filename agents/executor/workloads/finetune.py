"""The built-in fine-tune: ``python -m agents.executor.workloads.finetune``, started by the agent.

Loads the base checkpoint (built on first use), fine-tunes it with AdamW on the clinical-note corpus, reports
every step's loss and time through ``teto.sdk``, checkpoints (model, optimizer, step, RNG state) every
``TETO_CHECKPOINT_EVERY`` steps and at the end, and resumes from ``TETO_RESUME_FROM`` at step k+1. On SIGTERM
it finishes the current step, writes a checkpoint if the stop asked for one, and exits with status 143.
Parameters come as JSON in ``TETO_PARAMS`` (see FinetuneParams).

A gang (world size N > 1) trains data-parallel with torch.distributed (gloo on CPU, nccl on GPU) at the
rendezvous the queue chose: each rank draws its own batches (its own data shard: the seed differs per rank),
gradients and the loss are averaged with one all-reduce per step, and the ranks agree every step on whether a
stop was asked, so they all stop after the same step. Rank 0 writes the checkpoints; every rank resumes from
the step rank 0 resumes from, and rank 0's weights are broadcast so all ranks start identical. A collective
that fails because a peer vanished ends the worker with ``sdk.EXIT_PEER_LOST`` (not a training error).
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

# torch warns at import that numpy is absent; it is not used here, and the warning would crowd the stderr
# tail the agent reports on failure.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch  # noqa: E402

from libs.contracts.jobs import FinetuneParams  # noqa: E402
from agents.executor import sdk  # noqa: E402

from agents.executor import checkpoints  # noqa: E402

from . import data  # noqa: E402
from .model import load_base, parameter_count  # noqa: E402

EXIT_BAD_PARAMS = 2


class Group:
    """The gang's collectives (or a single worker's trivial versions of them)."""

    def __init__(self, dist, world_size: int) -> None:  # noqa: ANN001 - torch.distributed or None
        self.dist = dist
        self.world_size = world_size

    def _call(self, fn, *args) -> None:  # noqa: ANN001
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - gloo/nccl raise RuntimeError subclasses when a peer is gone
            sdk.exit_peer_lost(exc)

    def any(self, flag: bool) -> bool:
        """True on every rank if any rank says so."""
        if self.dist is None:
            return flag
        t = torch.tensor([1.0 if flag else 0.0])
        self._call(self.dist.all_reduce, t)
        return bool(t.item() > 0)

    def broadcast_int(self, value: int) -> int:
        if self.dist is None:
            return value
        t = torch.tensor([value], dtype=torch.long)
        self._call(self.dist.broadcast, t, 0)
        return int(t.item())

    def broadcast_model(self, model: torch.nn.Module) -> None:
        if self.dist is None:
            return
        for p in model.state_dict().values():
            self._call(self.dist.broadcast, p, 0)

    def average_grads(self, model: torch.nn.Module, loss: torch.Tensor) -> float:
        """Average every gradient and the loss over the ranks in one all-reduce; returns the mean loss."""
        if self.dist is None:
            return float(loss.item())
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1)])
        self._call(self.dist.all_reduce, flat)
        flat /= self.world_size
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        return float(flat[-1].item())

    def close(self) -> None:
        if self.dist is not None:
            try:
                self.dist.destroy_process_group()
            except Exception:  # noqa: BLE001, S110 - leaving anyway
                pass


def _threads() -> int:
    configured = os.environ.get("TETO_TORCH_THREADS", "")
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    return max(1, min(os.cpu_count() or 1, 8))


def _checkpoint(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int, params: FinetuneParams, *,
                background: bool = True) -> None:
    """Periodic checkpoints are written in the background (training stalls only for the copy to host
    memory); the final one on a stop is synchronous, durable before the process exits."""
    sdk.save_checkpoint({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
                         "rng": torch.get_rng_state(), "params": params.model_dump()}, step, background=background)


def main() -> int:
    ctx = sdk.context()
    try:
        params = FinetuneParams.model_validate(ctx.params or {})
    except ValueError as exc:
        print(f"invalid fine-tune parameters: {exc}", file=sys.stderr)
        return EXIT_BAD_PARAMS
    torch.set_num_threads(_threads())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base_dir = Path(os.environ.get("TETO_BASE_DIR") or Path(".teto") / "base")
    model = load_base(base_dir, device)  # before joining the gang: a slow first build must not eat its timeout
    group = Group(sdk.init_distributed(), ctx.world_size)
    try:
        return _train(ctx, params, model, device, group)
    finally:
        group.close()


def _train(ctx: sdk.Context, params: FinetuneParams, model: torch.nn.Module, device: str, group: Group) -> int:
    if params.seq_len > model.cfg.context:
        print(f"seq_len {params.seq_len} is longer than the model's context {model.cfg.context}", file=sys.stderr)
        return EXIT_BAD_PARAMS
    opt = torch.optim.AdamW(model.parameters(), lr=params.learning_rate, weight_decay=0.01)
    corpus = data.finetune_corpus()
    every = ctx.checkpoint_every or 50

    start = 0
    resume = sdk.resume_checkpoint()
    # Every rank resumes from the step rank 0 resumes from (a checkpoint directory seen a moment apart could
    # differ); a rank that chose another loads rank 0's file from the shared checkpoint directory.
    step0 = group.broadcast_int(resume[0] if resume else 0)
    if step0 != (resume[0] if resume else 0):
        resume = (step0, checkpoints.checkpoint_path(ctx.checkpoint_dir, step0)) if step0 else None
    if resume is not None:
        state = torch.load(resume[1], map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        start = int(state["step"])
    group.broadcast_model(model)
    print(f"fine-tune: {parameter_count(model)} parameters on {device}, {torch.get_num_threads()} threads, "
          f"steps {start + 1}..{params.steps}, rank {ctx.rank} of {ctx.world_size}", flush=True)
    # Each rank its own shard of the data: a seed per rank (rank 0 of one worker keeps the job's own seed).
    seed = params.seed * ctx.world_size + ctx.rank

    model.train()
    last_done, last_saved = start, start
    stopped = False
    for step in range(start + 1, params.steps + 1):
        if group.any(sdk.stop_requested()):  # every rank stops after the same step
            stopped = True
            break
        began = time.perf_counter()
        x, y = corpus.batch(step, batch_size=params.batch_size, seq_len=params.seq_len, seed=seed)
        x, y = x.to(device), y.to(device)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        loss_value = group.average_grads(model, loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        compute = time.perf_counter() - began
        last_done = step
        sdk.report_step(step, total_steps=params.steps, loss=loss_value, compute_seconds=compute,
                        tokens_per_second=params.batch_size * params.seq_len / max(compute, 1e-9),
                        learning_rate=opt.param_groups[0]["lr"])
        if step % every == 0 or step == params.steps:
            _checkpoint(model, opt, step, params)
            last_saved = step
        if params.step_delay_seconds and sdk.sleep(params.step_delay_seconds) and group.dist is None:
            stopped = True  # a gang learns of the stop at the next step's agreement
            break
    if stopped or sdk.stop_requested():
        if sdk.checkpoint_on_stop() and last_done > last_saved:
            _checkpoint(model, opt, last_done, params, background=False)
        sdk.wait_checkpoints()
        return sdk.EXIT_STOPPED
    sdk.wait_checkpoints()  # the last checkpoint is durable and reported before the job says it succeeded
    return 0


if __name__ == "__main__":
    sys.exit(main())
