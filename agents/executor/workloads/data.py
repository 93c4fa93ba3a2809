"""The fine-tune dataset: synthetic clinical-note-style text shipped in ``corpus/``, as byte sequences.

Batches are a pure function of (seed, step), so a run resumed at step k+1 sees exactly the batches an
uninterrupted run would have, without saving any data-loader state.
"""

from __future__ import annotations

from pathlib import Path

import torch

CORPUS_DIR = Path(__file__).parent / "corpus"
FINETUNE_CORPUS = "clinical_notes.txt"


def load_text(name: str) -> bytes:
    return (CORPUS_DIR / name).read_bytes()


class ByteCorpus:
    def __init__(self, text: bytes, *, val_fraction: float = 0.1) -> None:
        tokens = torch.tensor(list(text), dtype=torch.long)
        split = len(tokens) - int(len(tokens) * val_fraction)
        self.train = tokens[:split]
        self.val = tokens[split:]

    def batch(self, step: int, *, batch_size: int, seq_len: int, seed: int, split: str = "train"
              ) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.train if split == "train" else self.val
        if len(tokens) <= seq_len + 1:
            raise ValueError(f"the {split} text has {len(tokens)} bytes, too few for sequences of {seq_len}")
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        starts = torch.randint(0, len(tokens) - seq_len - 1, (batch_size,), generator=g)
        x = torch.stack([tokens[s:s + seq_len] for s in starts.tolist()])
        y = torch.stack([tokens[s + 1:s + seq_len + 1] for s in starts.tolist()])
        return x, y


def finetune_corpus() -> ByteCorpus:
    return ByteCorpus(load_text(FINETUNE_CORPUS))
