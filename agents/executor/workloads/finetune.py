"""The built-in fine-tune: ``python -m agents.executor.workloads.finetune``, started by the agent.

Loads the base checkpoint (built on first use), fine-tunes it with AdamW on the clinical-note corpus, reports
every step's loss and time through ``teto.sdk``, checkpoints (model, optimizer, step, RNG state) every
``TETO_CHECKPOINT_EVERY`` steps and at the end, and resumes from ``TETO_RESUME_FROM`` at step k+1. On SIGTERM
it finishes the current step, writes a checkpoint if the stop asked for one, and exits with status 143.
Parameters come as JSON in ``TETO_PARAMS`` (see FinetuneParams). Rank 0 writes checkpoints; world sizes above
1 are refused until distributed training lands.
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
from teto import sdk  # noqa: E402

from . import data  # noqa: E402
from .model import load_base, parameter_count  # noqa: E402

EXIT_BAD_PARAMS = 2


def _threads() -> int:
    configured = os.environ.get("TETO_TORCH_THREADS", "")
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    return max(1, min(os.cpu_count() or 1, 8))


def _checkpoint(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int, params: FinetuneParams) -> None:
    sdk.save_checkpoint({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
                         "rng": torch.get_rng_state(), "params": params.model_dump()}, step)


def main() -> int:
    ctx = sdk.context()
    try:
        params = FinetuneParams.model_validate(ctx.params or {})
    except ValueError as exc:
        print(f"invalid fine-tune parameters: {exc}", file=sys.stderr)
        return EXIT_BAD_PARAMS
    if ctx.world_size > 1:
        print("distributed fine-tune (world size > 1) is not supported yet", file=sys.stderr)
        return EXIT_BAD_PARAMS
    torch.set_num_threads(_threads())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base_dir = Path(os.environ.get("TETO_BASE_DIR") or Path(".teto") / "base")
    model = load_base(base_dir, device)
    if params.seq_len > model.cfg.context:
        print(f"seq_len {params.seq_len} is longer than the model's context {model.cfg.context}", file=sys.stderr)
        return EXIT_BAD_PARAMS
    opt = torch.optim.AdamW(model.parameters(), lr=params.learning_rate, weight_decay=0.01)
    corpus = data.finetune_corpus()
    every = ctx.checkpoint_every or 50

    start = 0
    resume = sdk.resume_checkpoint()
    if resume is not None:
        state = torch.load(resume[1], map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        start = int(state["step"])
    print(f"fine-tune: {parameter_count(model)} parameters on {device}, {torch.get_num_threads()} threads, "
          f"steps {start + 1}..{params.steps}", flush=True)

    model.train()
    last_done, last_saved = start, start
    stopped = False
    for step in range(start + 1, params.steps + 1):
        if sdk.stop_requested():
            stopped = True
            break
        began = time.perf_counter()
        x, y = corpus.batch(step, batch_size=params.batch_size, seq_len=params.seq_len, seed=params.seed)
        x, y = x.to(device), y.to(device)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_value = float(loss.item())
        compute = time.perf_counter() - began
        last_done = step
        sdk.report_step(step, total_steps=params.steps, loss=loss_value, compute_seconds=compute,
                        tokens_per_second=params.batch_size * params.seq_len / max(compute, 1e-9))
        if step % every == 0 or step == params.steps:
            _checkpoint(model, opt, step, params)
            last_saved = step
        if params.step_delay_seconds and sdk.sleep(params.step_delay_seconds):
            stopped = True
            break
    if stopped or sdk.stop_requested():
        if sdk.checkpoint_on_stop() and last_done > last_saved:
            _checkpoint(model, opt, last_done, params)
        return sdk.EXIT_STOPPED
    return 0


if __name__ == "__main__":
    sys.exit(main())
