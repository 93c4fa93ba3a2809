"""The built-in fine-tune's model and data: shapes, a falling loss, deterministic base and batches."""

from __future__ import annotations

import hashlib
import warnings

import pytest

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch  # noqa: E402

from agents.executor.workloads import data, model  # noqa: E402

pytestmark = pytest.mark.unit


def test_forward_and_backward_shapes():
    torch.manual_seed(0)
    m = model.TinyLM()
    x = torch.randint(0, 256, (3, 17))
    logits, loss = m(x, x)
    assert logits.shape == (3, 17, 256) and loss.shape == ()
    loss.backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in m.parameters())
    assert m.tok.weight.grad is not None  # the tied output layer trains the embedding too


def test_the_model_is_causal():
    torch.manual_seed(0)
    m = model.TinyLM().eval()
    x = torch.randint(0, 256, (1, 12))
    y = x.clone()
    y[0, 8:] = (y[0, 8:] + 1) % 256  # change the future only
    with torch.no_grad():
        assert torch.allclose(m(x)[0][0, :8], m(y)[0][0, :8], atol=1e-6)


def test_sequences_longer_than_the_context_are_refused():
    with pytest.raises(ValueError, match="context"):
        model.TinyLM(model.ModelConfig(context=16))(torch.zeros(1, 17, dtype=torch.long))


def test_loss_falls_over_a_few_steps_of_finetuning(tmp_path):
    m = model.load_base(tmp_path)
    corpus = data.finetune_corpus()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    val_x, val_y = corpus.batch(0, batch_size=16, seq_len=64, seed=1, split="val")
    with torch.no_grad():
        before = float(m(val_x, val_y)[1])
    for step in range(1, 31):
        x, y = corpus.batch(step, batch_size=16, seq_len=64, seed=0)
        _, loss = m(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        after = float(m(val_x, val_y)[1])
    assert after < before * 0.85, (before, after)


def test_the_base_checkpoint_is_the_same_bytes_every_time(tmp_path):
    a = model.ensure_base(tmp_path / "a")
    b = model.ensure_base(tmp_path / "b")
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()
    # and it is cached: a second call does not rebuild it
    mtime = a.stat().st_mtime_ns
    assert model.ensure_base(tmp_path / "a") == a and a.stat().st_mtime_ns == mtime


def test_a_corrupt_cached_base_is_rebuilt(tmp_path):
    path = model.ensure_base(tmp_path)
    good = path.read_bytes()
    path.write_bytes(good[:100])
    assert model.ensure_base(tmp_path).read_bytes() == good


def test_the_base_is_pretrained_not_just_initialised():
    with torch.random.fork_rng():
        init = model.build_base_state(steps=0)
        trained = model.build_base_state(steps=5)
    assert not torch.equal(init["tok.weight"], trained["tok.weight"])


def test_batches_are_a_function_of_seed_and_step():
    corpus = data.finetune_corpus()
    a = corpus.batch(7, batch_size=4, seq_len=32, seed=3)
    b = corpus.batch(7, batch_size=4, seq_len=32, seed=3)
    c = corpus.batch(8, batch_size=4, seq_len=32, seed=3)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])
    assert torch.equal(a[0][:, 1:], a[1][:, :-1])  # targets are the inputs shifted by one byte


def _slow_counted_build(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Stand in for the pre-training (seconds of CPU) with a slow build that counts its calls."""
    import threading
    import time

    built: list[int] = []
    lock = threading.Lock()

    def slow_state() -> dict:
        with lock:
            built.append(1)
        time.sleep(0.3)
        return {"w": torch.zeros(4)}
    monkeypatch.setattr(model, "build_base_state", slow_state)
    return built


def test_builders_at_once_build_the_base_once_and_the_others_find_it_built(tmp_path, monkeypatch):
    # The agents of a node share one base directory: four asking at once used to build it four times over,
    # on the same cores (the first grant of each waited for all of them).
    from concurrent.futures import ThreadPoolExecutor

    built = _slow_counted_build(monkeypatch)
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: model.ensure_base(tmp_path), range(4)))
    assert built == [1]
    assert len(set(paths)) == 1 and checkpoints_valid(paths[0])


def test_a_lock_file_left_behind_by_a_dead_builder_does_not_hold_anyone(tmp_path, monkeypatch):
    # The lock is the kernel's (flock), released when its holder dies; the file itself means nothing.
    built = _slow_counted_build(monkeypatch)
    (tmp_path / (model.base_path(tmp_path).name + ".lock")).write_text("")
    assert checkpoints_valid(model.ensure_base(tmp_path)) and built == [1]


def test_without_a_lock_file_the_build_goes_on_unlocked(tmp_path, monkeypatch):
    # A directory where the lock cannot be made (here: its name taken by a directory) does not stop a build.
    built = _slow_counted_build(monkeypatch)
    (tmp_path / (model.base_path(tmp_path).name + ".lock")).mkdir()
    assert checkpoints_valid(model.ensure_base(tmp_path)) and built == [1]


def checkpoints_valid(path) -> bool:  # noqa: ANN001
    from agents.executor import checkpoints

    return checkpoints.validate(path)[0] is not None
