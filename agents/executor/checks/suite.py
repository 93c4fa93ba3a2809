"""The check tests themselves. Each takes the run's ``Spec`` and returns a ``Result`` (status, figures with
their units in their names, detail, error). On a CUDA device they use it; on a CPU-only node the same torch
tests run on the CPU with sizes that finish in seconds, and NVML reports ``not_applicable`` (never a silent
pass). Figure names ending in ``_gbps`` or starting with ``tflops_`` are the ones the health service compares
with the group. ``Spec`` and ``Result`` are in spec.py, the NVML test in nvml.py; ``TESTS`` names them all.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from . import reach
from .faults import SLOW_FACTOR
from .nvml import nvml
from .spec import Result, Spec

# The suite's version, sent with every figure. Bump it whenever a test's sizes, method or figures change meaning:
# the health service compares a node's figures only with figures measured by the same version, so a fleet part
# way through an upgrade is never judged against numbers of another yardstick.
SUITE_VERSION = "2"

# Relative Frobenius error of an n x n product against the float64 product of the same (rounded) inputs.
ERROR_BOUNDS = {"float64": 1e-12, "float32": 1e-5, "tf32": 5e-3, "float16": 5e-3, "bfloat16": 3e-2}


def _device(spec: Spec) -> Any:
    import torch

    if spec.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec.device)


def _sync(dev: Any) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _timed(spec: Spec, test: str, dev: Any, fn: Callable[[], None], min_seconds: float) -> tuple[int, float]:
    """Run ``fn`` until ``min_seconds`` have passed; (iterations, seconds). The slow fault really waits."""
    fn()
    _sync(dev)
    n, start = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        _sync(dev)
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            break
    if spec.fault.get(test) == "slow":
        time.sleep(elapsed * (SLOW_FACTOR - 1))
        elapsed *= SLOW_FACTOR
    return n, elapsed


# -- GPU (or CPU) compute --------------------------------------------------------------------------------------

def precisions(dev: Any) -> list[str]:
    import torch

    if dev.type != "cuda":
        return ["float32", "bfloat16"]
    out = ["float32", "tf32", "float16"]
    if torch.cuda.is_bf16_supported():
        out.append("bfloat16")
    return out


def _dtype(precision: str) -> Any:
    import torch

    return {"tf32": torch.float32, "float32": torch.float32, "float16": torch.float16,
            "bfloat16": torch.bfloat16, "float64": torch.float64}[precision]


def matmul(spec: Spec) -> Result:
    import torch

    dev = _device(spec)
    cuda = dev.type == "cuda"
    n_check, n_speed = (2048, 8192) if cuda else (256, 384)
    figures: dict[str, float] = {}
    errors: list[str] = []
    gen = torch.Generator(device="cpu").manual_seed(0)
    for precision in precisions(dev):
        dtype = _dtype(precision)
        if cuda:
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        a = torch.randn(n_check, n_check, generator=gen).to(dev, dtype)
        b = torch.randn(n_check, n_check, generator=gen).to(dev, dtype)
        c = (a @ b).double()
        if spec.fault.get("matmul") == "fail":
            c[0, 0] += 1e3 * c.abs().max()  # a silent data corruption, as a bad unit would produce
        ref = a.double() @ b.double()
        rel = float(torch.linalg.norm(c - ref) / torch.linalg.norm(ref))
        figures[f"rel_error_{precision}"] = rel
        if not rel <= ERROR_BOUNDS[precision]:
            errors.append(f"{precision}: relative error {rel:.3g} exceeds {ERROR_BOUNDS[precision]:g}")
        x = torch.randn(n_speed, n_speed, generator=gen).to(dev, dtype)
        y = torch.randn(n_speed, n_speed, generator=gen).to(dev, dtype)
        iters, seconds = _timed(spec, "matmul", dev, lambda: torch.mm(x, y), 0.5 if cuda else 0.25)
        figures[f"tflops_{precision}"] = 2 * n_speed**3 * iters / seconds / 1e12
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
    detail = {"device": str(dev), "n_check": n_check, "n_speed": n_speed, "bounds": ERROR_BOUNDS}
    return Result("failed" if errors else "passed", figures, detail, "; ".join(errors) or None)


def membw(spec: Spec) -> Result:
    import torch

    dev = _device(spec)
    nbytes = (1 << 30) if dev.type == "cuda" else (64 << 20)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    iters, seconds = _timed(spec, "membw", dev, lambda: dst.copy_(src), 0.3)
    # A copy reads and writes every byte once.
    gbps = 2 * nbytes * iters / seconds / 1e9
    return Result("passed", {"copy_gbps": gbps}, {"device": str(dev), "bytes": nbytes, "iterations": iters})


def _free_bytes(dev: Any) -> int:
    import torch

    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0])
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 256 << 20


def memtest(spec: Spec) -> Result:
    import torch

    dev = _device(spec)
    cap = spec.memtest_max_mb if spec.memtest_max_mb is not None else (None if dev.type == "cuda" else 32.0)
    size = int(_free_bytes(dev) * spec.memtest_fraction)
    if cap is not None:
        size = min(size, int(cap * (1 << 20)))
    size = max(size // 4 * 4, 1 << 20)
    buf = torch.empty(size, dtype=torch.uint8, device=dev)
    bad = 0
    for pattern in (0x00, 0xFF, 0xAA, 0x55):
        buf.fill_(pattern)
        if spec.fault.get("memtest") == "fail" and pattern == 0xAA:
            buf[size // 2] = 0xAB  # one flipped bit
        bad += int((buf != pattern).sum())
    # Address-in-address: each word holds its own index, so a wrong mapping shows as well as a stuck bit.
    words = buf.view(torch.int32)
    words.copy_(torch.arange(words.numel(), dtype=torch.int32, device=dev))
    bad += int((words != torch.arange(words.numel(), dtype=torch.int32, device=dev)).sum())
    figures = {"tested_mb": size / (1 << 20), "errors": float(bad)}
    detail = {"device": str(dev), "fraction_of_free": spec.memtest_fraction, "patterns": "00 FF AA 55 address"}
    return Result("failed" if bad else "passed", figures, detail, f"{bad} mismatching bytes/words" if bad else None)


# -- the group -------------------------------------------------------------------------------------------------

def connectivity(spec: Spec) -> Result:
    if not spec.peers:
        return Result("not_applicable", error="no other node in the group to reach")
    rtts: dict[str, float] = {}
    failures: list[str] = []
    for peer in spec.peers:
        host, _, port = peer["address"].rpartition(":")
        if spec.fault.get("connectivity") == "fail":
            port = "1"  # nothing listens there
        start = time.perf_counter()
        try:
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.sendall(b"teto-ping\n")
                s.settimeout(5)
                if not s.recv(64).startswith(b"teto-ping"):
                    raise OSError("wrong echo")
            rtts[peer["node_id"]] = (time.perf_counter() - start) * 1000
        except OSError as exc:
            failures.append(f"{peer['node_id']} at {peer['address']}: {exc}")
    figures = {"peers": float(len(spec.peers)), "reached": float(len(rtts))}
    if rtts:
        figures["max_rtt_ms"] = max(rtts.values())
    return Result("failed" if failures else "passed", figures, {"rtt_ms": rtts},
                  ("unreachable: " + "; ".join(failures)) if failures else None)


def allreduce(spec: Spec) -> Result:
    if spec.world_size < 2 or not spec.rendezvous:
        return Result("not_applicable", error="a single node in this run: no collective to measure")
    import torch
    import torch.distributed as dist

    dev = _device(spec)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    nbytes = (256 << 20) if dev.type == "cuda" else (4 << 20)
    timeout = timedelta(seconds=spec.collective_timeout_seconds)
    # Not init_method="tcp://...": torch's TCPStore would listen on every address of rank 0 and gloo's pairs on
    # whatever the host name resolves to. Rank 0 hands the store a socket bound to its advertised address, and
    # gloo's device is made for this node's advertised address.
    host, _, port = spec.rendezvous.rpartition(":")
    if spec.rank == 0:
        listener = reach.rendezvous_listener(spec.bind_host or host, int(port))
        store = dist.TCPStore(host, int(port), spec.world_size, True, timeout=timeout, wait_for_workers=False,
                              master_listen_fd=listener.detach())  # the store owns the socket from here
    else:
        store = dist.TCPStore(host, int(port), spec.world_size, False, timeout=timeout)
    options = None
    if backend == "gloo" and spec.bind_host:
        options = dist.ProcessGroupGloo._Options()
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=spec.bind_host)]
        options._timeout = timeout
    dist.init_process_group(backend, store=store, rank=spec.rank, world_size=spec.world_size, timeout=timeout,
                            pg_options=options)
    try:
        t = torch.empty(nbytes // 4, dtype=torch.float32, device=dev)
        t.fill_(spec.rank + 1)
        dist.all_reduce(t)
        _sync(dev)
        expect = spec.world_size * (spec.world_size + 1) / 2
        wrong = float(t[0]) != expect or float(t[-1]) != expect
        if spec.fault.get("allreduce") == "fail":
            wrong = True
        iters = 5
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        _sync(dev)
        seconds = (time.perf_counter() - start) / iters
        if spec.fault.get("allreduce") == "slow":
            time.sleep(seconds * iters * (SLOW_FACTOR - 1))
            seconds *= SLOW_FACTOR
    finally:
        dist.destroy_process_group()
    algbw, bus = bus_bandwidth(nbytes, seconds, spec.world_size)
    figures = {"algbw_gbps": algbw, "busbw_gbps": bus, "bytes": float(nbytes), "seconds": seconds}
    detail = {"backend": backend, "world_size": spec.world_size, "rank": spec.rank}
    return Result("failed" if wrong else "passed", figures, detail,
                  f"all-reduce result wrong (expected {expect:g} everywhere)" if wrong else None)


def bus_bandwidth(nbytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s, the nccl-tests way for all-reduce: busbw = algbw x 2(n-1)/n."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (world_size - 1) / world_size


def sendable(record: dict[str, Any]) -> dict[str, Any]:
    """A test's record as it may travel: a figure that is not a finite number (inf or nan, e.g. a throughput
    over a zero duration) cannot be judged or sent (the report contract refuses it), so the test fails with
    the figures named and no figures at all, never an unsendable report that leaves the node checking."""
    figures = record.get("figures") or {}
    bad = sorted(k for k, v in figures.items()
                 if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v))
    if not bad:
        return record
    why = f"the test produced figures that are not finite numbers: {', '.join(f'{k}={figures[k]!r}' for k in bad)}"
    error = f"{record['error']}; {why}" if record.get("error") else why
    return {**record, "status": "failed", "figures": {}, "error": error[:4000],
            "detail": {**(record.get("detail") or {}), "refused_figures": {k: repr(figures[k]) for k in bad}}}


TESTS: dict[str, Callable[[Spec], Result]] = {"matmul": matmul, "membw": membw, "memtest": memtest, "nvml": nvml,
                                              "connectivity": connectivity, "allreduce": allreduce}
# Node-local tests first; the collective last, so the nodes of a run meet there at about the same time.
ORDER = ("nvml", "matmul", "membw", "memtest", "connectivity", "allreduce")


def threads() -> None:
    """CPU checks use every core the agent may use (TETO_TORCH_THREADS)."""
    import torch

    if os.environ.get("TETO_TORCH_THREADS"):
        torch.set_num_threads(int(os.environ["TETO_TORCH_THREADS"]))
