"""The accelerator's figures (issue 12): the deep-check suite's GEMM and memory bandwidth against the device's
datasheet peaks, and the built-in fine-tune's steps/s and checkpoint stall on the device, all measured in one run.

- **GEMM**: the deep-check suite's own ``matmul`` test (``agents/executor/checks/suite.py``: an 8192 x 8192 product
  timed for half a second per precision on CUDA), its ``tflops_<precision>`` figures against the dense (no
  sparsity) peak of NVIDIA's datasheet for the device: bf16 on an H200 against 989 TFLOP/s.
- **Memory bandwidth**: the suite's ``membw`` test (a 1 GiB device-to-device copy, read plus write counted),
  ``copy_gbps`` against the datasheet's memory bandwidth: 4,800 GB/s on an H200.
- **The built-in fine-tune** (``python -m agents.executor.workloads.finetune``, the workload the agent starts, with
  its default parameters): steps per second from its own step reports (the first step, which holds the warm-up,
  to the last, both written the moment they end), on CUDA and, as the reference measured in the same run, on the
  CPU (``CUDA_VISIBLE_DEVICES`` empty): the ratio is the device's speed-up.
- **Checkpoint stall on CUDA**: ``bench_checkpoint`` with the state on the device (a pinned device-to-host copy
  against ``torch.save`` + fsync of the same state).

Without CUDA the suite's tests and the fine-tune run on the CPU: real figures, with no datasheet peak and no
reference (the ``checkpoint`` benchmark covers the CPU's stall). Nothing here has a pass/short target (the issue
asks for the figures against the peaks), so every row's verdict is ``-``. A device not in ``PEAKS`` has no peak
unless ``--peak-tflops``/``--peak-gbps`` give one.

Run: .venv/bin/python -m bench.bench_gpu [--quick] [--steps N] [--peak-tflops X] [--peak-gbps Y] [--json PATH]
(or ``teto bench gpu``); on a GPU machine without Teto's environment, ``bench/gpu_device.sh`` (one prepared run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FINETUNE = "agents.executor.workloads.finetune"


@dataclass(frozen=True)
class Peak:
    """Dense peaks from NVIDIA's datasheets (half the "with sparsity" figures): TFLOP/s per precision, memory GB/s."""

    tflops: dict[str, float]
    memory_gbps: float | None


_HOPPER = {"bfloat16": 989.0, "float16": 989.0, "tf32": 495.0, "float32": 67.0}
_AMPERE = {"bfloat16": 312.0, "float16": 312.0, "tf32": 156.0, "float32": 19.5}
# By the exact name torch reports (``torch.cuda.get_device_name``): a close name (an H200 NVL, an H100 PCIe) has
# other peaks and is left out rather than matched loosely.
PEAKS: dict[str, Peak] = {
    "NVIDIA H200": Peak(_HOPPER, 4800.0),
    "NVIDIA H100 80GB HBM3": Peak(_HOPPER, 3350.0),  # H100 SXM5
    "NVIDIA A100-SXM4-80GB": Peak(_AMPERE, 2039.0),
    "NVIDIA A100-SXM4-40GB": Peak(_AMPERE, 1555.0),
}


def peak_for(name: str, tflops: float | None = None, gbps: float | None = None) -> Peak | None:
    """The device's peaks; ``tflops`` (bf16) and ``gbps`` given on the command line replace or supply them."""
    known = PEAKS.get(name)
    if tflops is None and gbps is None:
        return known
    table = dict(known.tflops) if known else {}
    if tflops is not None:
        table["bfloat16"] = tflops
    return Peak(table, gbps if gbps is not None else (known.memory_gbps if known else None))


def device_name() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def _ratio(figure: float | None, peak: float | None) -> float | None:
    return round(figure / peak, 4) if figure is not None and peak else None


def gemm_row(figures: dict[str, float], status: str, name: str, peak: Peak | None) -> dict[str, Any]:
    """The suite's matmul figures as a row: bf16 (float32 where there is no bf16) against the peak."""
    peaks = peak.tflops if peak else {}
    measured = {k[len("tflops_"):]: v for k, v in sorted(figures.items()) if k.startswith("tflops_")}
    precision = "bfloat16" if "bfloat16" in measured else "float32"
    figure, ref = measured.get(precision), peaks.get(precision)
    each = ", ".join(f"{p} {v:.4g}" + (f" ({v / peaks[p]:.0%} of {peaks[p]:g})" if p in peaks else "")
                     for p, v in measured.items())
    return {"name": f"deep check GEMM, {precision} ({name})", "figure": _round(figure), "reference": ref,
            "ratio": _ratio(figure, ref), "target": None, "unit": "TFLOP/s", "passed": None,
            "note": (f"suite matmul {status}; TFLOP/s by precision: {each}; reference: "
                     + ("the datasheet's dense peak" if ref else "no datasheet peak for this device"))}


def membw_row(figures: dict[str, float], status: str, name: str, peak: Peak | None) -> dict[str, Any]:
    figure = figures.get("copy_gbps")
    ref = peak.memory_gbps if peak else None
    return {"name": f"deep check memory bandwidth ({name})", "figure": _round(figure), "reference": ref,
            "ratio": _ratio(figure, ref), "target": None, "unit": "GB/s", "passed": None,
            "note": (f"suite membw {status}: a copy within the device's memory, read and write counted; reference: "
                     + ("the datasheet's memory bandwidth" if ref else "no datasheet peak for this device"))}


def _round(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.4g}")


def suite_figures() -> tuple[dict[str, float], str, dict[str, float], str]:
    """The deep-check suite's matmul and membw tests, run as a node's check runs them (CUDA when available)."""
    from agents.executor.checks import suite

    mm = suite.matmul(suite.Spec(tests=["matmul"]))
    bw = suite.membw(suite.Spec(tests=["membw"]))
    return mm.figures, mm.status, bw.figures, bw.status


# -- the built-in fine-tune ------------------------------------------------------------------------------------

def step_rate(reports: list[tuple[float, dict[str, Any]]], total: int) -> float | None:
    """Steps per second from (arrival time, report) pairs: from the first step to the last (``total``), the two
    reports the SDK writes the moment their step ends (those between may be held up to a quarter second)."""
    steps = [(t, r["step"]) for t, r in reports if r.get("type") == "step" and isinstance(r.get("step"), int)]
    first = next(((t, s) for t, s in steps if s == 1), None)
    last = next(((t, s) for t, s in steps if s == total), None)
    if first is None or last is None or last[0] <= first[0]:
        return None
    return (last[1] - first[1]) / (last[0] - first[0])


_PARAMS_LINE = re.compile(r"fine-tune: (\d+) parameters on (\w+), (\d+) threads")


def run_finetune(steps: int, work: Path, *, cpu_only: bool, timeout: float = 900) -> dict[str, Any]:
    """Run the built-in fine-tune for ``steps`` steps (one checkpoint, at the end) and read its reports."""
    base = work / "base"  # built once (the first run), as a node's agents share theirs
    ckdir = Path(tempfile.mkdtemp(prefix="ck-", dir=work))
    r, w = os.pipe()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETO_")}
    # The repository first, then what the caller's path holds (on a GPU machine: the carried wheels).
    path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    env.update(PYTHONPATH=path, TETO_JOB_ID="bench-gpu", TETO_CHECKPOINT_DIR=str(ckdir),
               TETO_REPORT_FD=str(w), TETO_CHECKPOINT_EVERY=str(steps), TETO_BASE_DIR=str(base),
               TETO_PARAMS=json.dumps({"steps": steps}))
    if cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.Popen([sys.executable, "-m", FINETUNE], env=env, pass_fds=(w,), cwd=work,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.close(w)
    reports: list[tuple[float, dict[str, Any]]] = []
    with os.fdopen(r) as f:
        for raw in f:
            reports.append((time.perf_counter(), json.loads(raw)))
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"the fine-tune exited with {proc.returncode}: {err[-2000:]}")
    shutil.rmtree(ckdir, ignore_errors=True)
    found = _PARAMS_LINE.search(out)
    return {"steps_per_s": step_rate(reports, steps), "steps": steps,
            "parameters": int(found.group(1)) if found else None,
            "device": found.group(2) if found else "?", "threads": int(found.group(3)) if found else None}


def finetune_row(on_device: dict[str, Any], on_cpu: dict[str, Any] | None, tokens_per_step: int) -> dict[str, Any]:
    rate = on_device["steps_per_s"]
    ref = on_cpu["steps_per_s"] if on_cpu else None
    note = (f"{on_device['parameters']} parameters, {on_device['steps']} steps of {tokens_per_step} tokens: "
            + (f"{rate * tokens_per_step:,.0f} tokens/s" if rate else "no rate (too few reports)"))
    if on_cpu:
        note += (f"; reference: the same fine-tune on the CPU in this run ({on_cpu['threads']} threads, "
                 f"{on_cpu['steps']} steps), ratio = the device's speed-up")
    else:
        note += f"; {on_device['threads']} threads; no CUDA device, so no reference"
    return {"name": f"built-in fine-tune on {on_device['device']}", "figure": _round(rate), "reference": _round(ref),
            "ratio": _ratio(rate, ref), "target": None, "unit": "steps/s", "passed": None, "note": note}


def main(quick: bool = False, *, steps: int | None = None, peak_tflops: float | None = None,
         peak_gbps: float | None = None) -> list[dict[str, Any]]:
    from libs.contracts.jobs import FinetuneParams

    cuda = torch.cuda.is_available()
    name = device_name()
    peak = peak_for(name, peak_tflops, peak_gbps) if cuda else None
    mm, mm_status, bw, bw_status = suite_figures()
    rows = [gemm_row(mm, mm_status, name, peak), membw_row(bw, bw_status, name, peak)]
    steps = steps or (20 if quick else (600 if cuda else 200))
    params = FinetuneParams()
    with tempfile.TemporaryDirectory(prefix="teto-bench-gpu-") as tmp:
        work = Path(tmp)
        on_device = run_finetune(steps, work, cpu_only=False)
        on_cpu = run_finetune(max(10, steps // 6), work, cpu_only=True) if cuda else None
    rows.append(finetune_row(on_device, on_cpu, params.batch_size * params.seq_len))
    if cuda:
        from bench import bench_checkpoint

        stall = bench_checkpoint.main(quick, device="cuda")
        rows.append({**stall, "name": f"checkpoint stall on CUDA ({name})"})
    return rows


def _cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, help="fine-tune steps on the device (default 600 on CUDA, 200 on CPU)")
    ap.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak, for a device not in PEAKS")
    ap.add_argument("--peak-gbps", type=float, help="the device's memory bandwidth, for a device not in PEAKS")
    ap.add_argument("--json", type=Path, help="also write the rows (and the device's name) here")
    a = ap.parse_args()
    rows = main(a.quick, steps=a.steps, peak_tflops=a.peak_tflops, peak_gbps=a.peak_gbps)
    if a.json:
        a.json.write_text(json.dumps({"device": device_name(), "torch": torch.__version__, "quick": a.quick,
                                      "results": rows}, indent=2))
    for r in rows:
        ref = f" against {r['reference']:g} ({r['ratio']:.2f}x)" if r["reference"] and r["ratio"] else ""
        print(f"{r['name']}: {r['figure']} {r['unit']}{ref}\n    {r['note']}")


if __name__ == "__main__":
    _cli()
