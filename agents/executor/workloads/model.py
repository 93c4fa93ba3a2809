"""A small byte-level causal language model, and its base checkpoint built deterministically on the node.

Nothing can be downloaded at run time, so the "pre-trained" base is made here: a fixed-seed initialisation
plus a few pre-training steps on a built-in generic corpus, single-threaded so the bytes are the same on
every machine for the same ``BASE_VERSION``. It is cached under ``<base_dir>/base-v<N>.pt`` and rebuilt when
missing or corrupt. Builders on one machine take turns on a lock file beside it (the agents of a node share one
base directory, and so do a gang's workers): one builds, the others wait and find it built, instead of each
spending the same seconds of CPU at once. Were the lock unavailable, builders would still write identical bytes
through an atomic rename, so none can corrupt it.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import math
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from agents.executor import checkpoints

from . import data

BASE_VERSION = 1
BASE_SEED = 1234
BASE_PRETRAIN_STEPS = 40


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 256  # bytes
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    context: int = 256  # longest sequence the position table covers


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(),
                                 nn.Linear(4 * cfg.d_model, cfg.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """Decoder-only transformer over bytes; the output layer shares the token embedding."""

    def __init__(self, cfg: ModelConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or ModelConfig()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        t = idx.shape[1]
        if t > self.cfg.context:
            raise ValueError(f"sequence of {t} tokens is longer than the model's context {self.cfg.context}")
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.tok.weight.T
        loss = None if targets is None else F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


def build_base_state(cfg: ModelConfig | None = None, *, seed: int = BASE_SEED,
                     steps: int = BASE_PRETRAIN_STEPS) -> dict[str, torch.Tensor]:
    """The base weights: same bytes for the same arguments (one thread, fixed seeds, CPU)."""
    cfg = cfg or ModelConfig()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # reductions split over threads may sum in a different order
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = TinyLM(cfg)
            if steps:
                corpus = data.ByteCorpus(data.load_text("generic.txt"), val_fraction=0.0)
                opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
                for step in range(1, steps + 1):
                    x, y = corpus.batch(step, batch_size=8, seq_len=64, seed=seed)
                    _, loss = model(x, y)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    finally:
        torch.set_num_threads(threads)


def base_path(directory: Path) -> Path:
    return Path(directory) / f"base-v{BASE_VERSION}.pt"


def ensure_base(directory: Path) -> Path:
    """The cached base checkpoint, built if missing or corrupt: by one builder at a time (``_building``); whoever
    waited for the lock finds it built and only validates it."""
    path = base_path(directory)
    if checkpoints.validate(path)[0] is not None:
        return path
    with _building(path):
        if checkpoints.validate(path)[0] is not None:
            return path
        _build(path)
    return path


@contextlib.contextmanager
def _building(path: Path) -> Iterator[None]:
    """An exclusive lock on ``<base>.lock`` (released by the kernel if the holder dies). Where the lock file cannot
    be made (a directory this process may only read), no lock: the build then fails or succeeds as before."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o644)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _build(path: Path) -> None:
    buf = io.BytesIO()
    torch.save({"config": asdict(ModelConfig()), "version": BASE_VERSION, "model": build_base_state()}, buf)
    checkpoints.write_atomic(path, lambda f: f.write(buf.getvalue()))
    checkpoints.write_sidecar(path, 0, fmt="torch")


def load_base(directory: Path, device: str = "cpu") -> TinyLM:
    state = torch.load(ensure_base(directory), map_location=device, weights_only=True)
    model = TinyLM(ModelConfig(**state["config"]))
    model.load_state_dict(state["model"])
    return model.to(device)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 50.0))
