"""Fine-tune a small Llama-architecture language model with a LoRA adapter, using Hugging Face ``Trainer`` and
``peft``: a user's own training script, run by Teto with one callback and one resume argument.

    pip install -e '.[hf]'
    python examples/hf_lora/train.py                        # minutes on 2 CPU cores, writes ./hf-lora-out
    python examples/hf_lora/train.py --model /models/llama  # a real model directory, offline

With no ``--model`` the model is built from a tiny ``LlamaConfig`` (random weights) and the text is read as bytes
(a 259-token vocabulary), so nothing is downloaded. The corpus is ``corpus.txt`` beside this file (``--corpus``).
Under Teto (a ``command`` job) ``TetoCallback`` reports steps, loss, learning rate and checkpoints and stops the
run on a fresh checkpoint at its GPU ceiling; ``resume_from_checkpoint()`` names the ``checkpoint-N`` directory a
requeued run continues from. With several workers (``"workers": 2``) the same script trains with DDP: the agent
gives each worker ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``... as ``torchrun`` would (docs/workloads.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from safetensors.torch import save_file
from transformers import (AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, Trainer,
                          TrainerCallback, TrainingArguments)

from teto.integrations.transformers import TetoCallback, resume_from_checkpoint

HERE = Path(__file__).resolve().parent
BYTES = 256  # byte tokens 0..255, then pad, bos, eos
PAD, BOS, EOS = BYTES, BYTES + 1, BYTES + 2


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a local model directory (default: a tiny Llama built from a config)")
    p.add_argument("--corpus", default=str(HERE / "corpus.txt"), help="a text file to fine-tune on")
    p.add_argument("--max-steps", type=int, default=300)
    p.add_argument("--save-steps", type=int, default=50)
    p.add_argument("--output-dir", default="hf-lora-out", help="checkpoints outside Teto (under Teto: the job's)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--learning-rate", type=float, default=3e-3)
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--hidden-size", type=int, default=64, help="of the built model (no --model)")
    p.add_argument("--layers", type=int, default=2, help="of the built model (no --model)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-teto", action="store_true", help="train without the callback (the bench's reference)")
    p.add_argument("--step-seconds", type=float, default=0.0, help="sleep this long in each step (tests)")
    p.add_argument("--hang-at-step", type=int, default=0, help="hang inside this step, for ever (tests)")
    p.add_argument("--adapter-at-start", help="write the adapter's weights here as training begins (tests)")
    p.add_argument("--timings", help="append each step's seconds to this file (the bench)")
    return p.parse_args(argv)


class Blocks(torch.utils.data.Dataset):
    """The corpus cut into ``seq_len`` token blocks; labels are the inputs (the model shifts them)."""

    def __init__(self, ids: list[int], seq_len: int) -> None:
        n = max(1, (len(ids) - 1) // seq_len)
        self.blocks = [ids[i * seq_len:(i + 1) * seq_len] for i in range(n)]

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.tensor(self.blocks[i], dtype=torch.long)
        return {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}


def model_and_ids(args: argparse.Namespace) -> tuple[torch.nn.Module, list[int]]:
    text = Path(args.corpus).read_text(encoding="utf-8")
    if args.model:
        tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True, dtype=torch.float32)
        return model, tokenizer(text)["input_ids"]
    torch.manual_seed(args.seed)
    config = LlamaConfig(vocab_size=BYTES + 3, hidden_size=args.hidden_size, intermediate_size=2 * args.hidden_size,
                         num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max(128, args.seq_len), pad_token_id=PAD, bos_token_id=BOS,
                         eos_token_id=EOS)
    return LlamaForCausalLM(config), [BOS, *text.encode("utf-8"), EOS]


class Pacing(TrainerCallback):
    """The test and bench hooks: a slower step, a step that never ends, each step's whole time (from one step's
    beginning to the next's: every callback's share included)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.began: float | None = None

    def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001 - the library's signature
        now = time.perf_counter()
        if self.args.timings and self.began is not None:
            with open(self.args.timings, "a") as f:
                f.write(f"{now - self.began:.6f}\n")
        self.began = now
        if self.args.hang_at_step and state.global_step + 1 == self.args.hang_at_step:
            print(f"hanging inside step {self.args.hang_at_step}", flush=True)
            while True:
                time.sleep(3600)
        if self.args.step_seconds:
            time.sleep(self.args.step_seconds)


class AdapterAtStart(TrainerCallback):
    """Writes the adapter's weights as training begins (after a resume loaded them), to compare with the saved."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_begin(self, args, state, control, model=None, **kw):  # noqa: ANN001
        if state.is_world_process_zero:
            weights = {k: v.detach().clone().contiguous() for k, v in get_peft_model_state_dict(model).items()}
            save_file(weights, self.path, metadata={"global_step": str(state.global_step)})


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(int(os.environ.get("TETO_TORCH_THREADS", "0")) or torch.get_num_threads())
    model, ids = model_and_ids(args)
    lora = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0,
                      target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    training = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.max_steps, save_steps=args.save_steps, save_strategy="steps",
        per_device_train_batch_size=args.batch_size, learning_rate=args.learning_rate, logging_steps=1,
        lr_scheduler_type="cosine", warmup_steps=min(10, args.max_steps // 10), seed=args.seed, report_to=[],
        use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0, disable_tqdm=True, save_total_limit=3)
    callbacks: list[TrainerCallback] = [Pacing(args)]
    if args.adapter_at_start:
        callbacks.append(AdapterAtStart(args.adapter_at_start))
    if not args.no_teto:
        callbacks.append(TetoCallback())  # 1. reports, checkpoints, stops on a fresh checkpoint
    trainer = Trainer(model=model, args=training, train_dataset=Blocks(ids, args.seq_len), callbacks=callbacks)
    resume = None if args.no_teto else resume_from_checkpoint()  # 2. where a requeued run continues from
    if resume:
        print(f"resuming from {resume}", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    if trainer.is_world_process_zero():
        model.save_pretrained(Path(training.output_dir) / "adapter")
    return 0


if __name__ == "__main__":
    sys.exit(main())
