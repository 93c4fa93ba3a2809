"""Train a small byte-level language model (a causal transformer in plain PyTorch) with Lightning: a user's own
training script, run by Teto with one callback and one resume argument.

    pip install -e '.[lightning]'
    python examples/lightning/train.py                 # minutes on 2 CPU cores, checkpoints in ./checkpoints
    python examples/lightning/train.py --max-steps 50 --save-steps 10

The corpus is ``examples/hf_lora/corpus.txt`` (``--corpus``), read as bytes, so nothing is downloaded. Under Teto
(a ``command`` job) ``TetoCallback`` reports steps, loss, learning rate and checkpoints and stops the run on a
fresh checkpoint at its GPU ceiling; ``resume_from_checkpoint()`` names the checkpoint a requeued run continues
from. With several workers (``"workers": 2``) it trains with DDP across them: ``num_nodes`` is the gang's size
(``WORLD_SIZE``, which the agent sets as ``torchrun`` would; docs/workloads.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import lightning.pytorch as L
import torch
from torch import nn

from teto.integrations.lightning import TetoCallback, resume_from_checkpoint

CORPUS = Path(__file__).resolve().parents[1] / "hf_lora" / "corpus.txt"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default=str(CORPUS))
    p.add_argument("--max-steps", type=int, default=300)
    p.add_argument("--save-steps", type=int, default=0,
                   help="steps between checkpoints (default: the job's checkpoint_every_steps under Teto, 50 outside)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--learning-rate", type=float, default=3e-3)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-seconds", type=float, default=0.0, help="sleep this long in each step (tests)")
    return p.parse_args(argv)


class Blocks(torch.utils.data.Dataset):
    def __init__(self, data: bytes, seq_len: int) -> None:
        ids = torch.tensor(list(data), dtype=torch.long)
        n = max(1, (len(ids) - 1) // seq_len)
        self.x = [ids[i * seq_len:(i + 1) * seq_len + 1] for i in range(n)]

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.x[i]


class ByteLM(L.LightningModule):
    def __init__(self, width: int, layers: int, seq_len: int, learning_rate: float, max_steps: int,
                 step_seconds: float = 0.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(256, width)
        self.pos = nn.Parameter(torch.zeros(seq_len, width))
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=2 * width, batch_first=True, dropout=0.0)
        self.body = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(width, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(n)
        return self.head(self.body(self.embed(x) + self.pos[:n], mask=mask, is_causal=True))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if self.hparams.step_seconds:
            time.sleep(self.hparams.step_seconds)
        x, y = batch[:, :-1], batch[:, 1:]
        loss = nn.functional.cross_entropy(self(x).reshape(-1, 256), y.reshape(-1))
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):  # noqa: ANN201 - Lightning's contract
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.learning_rate)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, self.hparams.max_steps))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    L.seed_everything(args.seed, verbose=False)
    data = torch.utils.data.DataLoader(Blocks(Path(args.corpus).read_bytes(), args.seq_len),
                                       batch_size=args.batch_size, shuffle=True, num_workers=0)
    model = ByteLM(args.width, args.layers, args.seq_len, args.learning_rate, args.max_steps, args.step_seconds)
    teto = TetoCallback(every_n_steps=args.save_steps or None)  # 1. reports, checkpoints, stops on a fresh one
    if teto.every is None:
        teto.every = 50  # outside Teto, without --save-steps: still checkpoint now and then
    trainer = L.Trainer(max_steps=args.max_steps, accelerator="auto", devices=1,
                        num_nodes=int(os.environ.get("WORLD_SIZE", "1")), callbacks=[teto],
                        enable_checkpointing=False, enable_progress_bar=False, logger=False, log_every_n_steps=1,
                        enable_model_summary=False)
    trainer.fit(model, data, ckpt_path=resume_from_checkpoint())  # 2. where a requeued run continues from
    return 0


if __name__ == "__main__":
    sys.exit(main())
