"""The accelerator benchmark's arithmetic (bench/bench_gpu.py): which peaks a device is judged against, the rows'
ratios and notes, the fine-tune's rate from its step reports, and what a CUDA run adds (the CPU reference, the
checkpoint stall). The figures themselves come from the real suite and fine-tune (tests/integration/test_bench_gpu.py)."""

from __future__ import annotations

import pytest

from bench import bench_gpu


def test_an_h200_is_judged_against_989_tflops_bf16_and_4800_gbps():
    peak = bench_gpu.peak_for("NVIDIA H200")
    assert peak.tflops["bfloat16"] == 989.0 and peak.memory_gbps == 4800.0
    assert bench_gpu.peak_for("NVIDIA H100 80GB HBM3").memory_gbps == 3350.0


def test_a_device_not_in_the_table_has_no_peak_unless_one_is_given():
    assert bench_gpu.peak_for("NVIDIA H200 NVL") is None  # a close name is not matched loosely
    assert bench_gpu.peak_for("cpu") is None
    given = bench_gpu.peak_for("Some GPU", tflops=500.0, gbps=2000.0)
    assert given.tflops == {"bfloat16": 500.0} and given.memory_gbps == 2000.0
    # A given figure replaces the table's; the other stays.
    mixed = bench_gpu.peak_for("NVIDIA H200", tflops=900.0)
    assert mixed.tflops["bfloat16"] == 900.0 and mixed.tflops["float16"] == 989.0 and mixed.memory_gbps == 4800.0


def test_the_gemm_row_is_bf16_against_the_peak_with_every_precision_in_the_note():
    figures = {"tflops_bfloat16": 791.2, "tflops_float16": 801.0, "tflops_tf32": 380.0, "tflops_float32": 51.0,
               "rel_error_bfloat16": 0.004}
    row = bench_gpu.gemm_row(figures, "passed", "NVIDIA H200", bench_gpu.peak_for("NVIDIA H200"))
    assert row["figure"] == 791.2 and row["reference"] == 989.0 and row["ratio"] == pytest.approx(0.8, abs=1e-3)
    assert row["passed"] is None and row["unit"] == "TFLOP/s" and "H200" in row["name"]
    assert "float16 801 (81% of 989)" in row["note"] and "tf32 380 (77% of 495)" in row["note"]
    assert "rel_error" not in row["note"] and "datasheet's dense peak" in row["note"]


def test_without_bf16_or_a_peak_the_gemm_row_is_float32_and_has_no_ratio():
    row = bench_gpu.gemm_row({"tflops_float32": 0.2}, "passed", "cpu", None)
    assert row["figure"] == 0.2 and "float32" in row["name"]
    assert row["reference"] is None and row["ratio"] is None and "no datasheet peak" in row["note"]


def test_the_memory_row_is_the_copy_against_the_memory_bandwidth():
    row = bench_gpu.membw_row({"copy_gbps": 4300.0}, "passed", "NVIDIA H200", bench_gpu.peak_for("NVIDIA H200"))
    assert row["figure"] == 4300.0 and row["reference"] == 4800.0 and row["ratio"] == pytest.approx(0.8958, abs=1e-4)
    assert bench_gpu.membw_row({"copy_gbps": 30.0}, "passed", "cpu", None)["ratio"] is None


def _step(n: int) -> dict:
    return {"type": "step", "step": n, "total_steps": 100}


def test_the_rate_runs_from_the_first_step_to_the_last_and_ignores_held_reports_between():
    reports = [(0.0, {"type": "phase", "phase": "training"}), (10.0, _step(1)), (10.3, _step(7)),
               (10.9, _step(40)), (12.0, _step(100)), (12.5, {"type": "checkpoint", "step": 100})]
    assert bench_gpu.step_rate(reports, 100) == pytest.approx(99 / 2.0)


@pytest.mark.parametrize("reports", [
    [(1.0, _step(1)), (2.0, _step(50))],  # the last step never reported (the run ended early)
    [(1.0, _step(7)), (2.0, _step(100))],  # no first step
    [(2.0, _step(1)), (2.0, _step(100))],  # no time between them
    [],
])
def test_no_rate_without_both_ends(reports):
    assert bench_gpu.step_rate(reports, 100) is None


def test_the_fine_tune_row_on_cuda_is_the_speed_up_over_the_cpu_run():
    gpu = {"steps_per_s": 120.0, "steps": 600, "parameters": 462336, "device": "cuda", "threads": 8}
    cpu = {"steps_per_s": 40.0, "steps": 100, "parameters": 462336, "device": "cpu", "threads": 8}
    row = bench_gpu.finetune_row(gpu, cpu, 1024)
    assert row["name"] == "built-in fine-tune on cuda" and row["ratio"] == 3.0 and row["reference"] == 40.0
    assert "122,880 tokens/s" in row["note"] and "speed-up" in row["note"]
    alone = bench_gpu.finetune_row({**cpu, "steps_per_s": None}, None, 1024)
    assert alone["figure"] is None and alone["ratio"] is None and "no CUDA device" in alone["note"]


def test_a_cuda_run_adds_the_cpu_reference_and_the_checkpoint_stall(monkeypatch):
    """The CUDA branch's wiring, with the measuring parts replaced (no GPU here): the fine-tune runs twice (the
    device, then the CPU with fewer steps), and the checkpoint stall is measured with the state on the device."""
    runs, stalls = [], []
    monkeypatch.setattr(bench_gpu.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench_gpu, "device_name", lambda: "NVIDIA H200")
    monkeypatch.setattr(bench_gpu, "suite_figures", lambda: (
        {"tflops_bfloat16": 790.0}, "passed", {"copy_gbps": 4300.0}, "passed"))

    def finetune(steps, work, *, cpu_only, timeout=900):
        runs.append((steps, cpu_only))
        return {"steps_per_s": 30.0 if cpu_only else 150.0, "steps": steps, "parameters": 1,
                "device": "cpu" if cpu_only else "cuda", "threads": 8}

    def checkpoint_main(quick, device="cpu"):
        stalls.append(device)
        return {"name": "checkpoint", "figure": 2.0, "reference": 100.0, "ratio": 0.02, "passed": True}

    monkeypatch.setattr(bench_gpu, "run_finetune", finetune)
    from bench import bench_checkpoint
    monkeypatch.setattr(bench_checkpoint, "main", checkpoint_main)
    rows = bench_gpu.main(steps=600)
    assert runs == [(600, False), (100, True)] and stalls == ["cuda"]
    gemm, mem, tune, stall = rows
    assert gemm["ratio"] == pytest.approx(0.7988, abs=1e-4) and mem["reference"] == 4800.0
    assert tune["ratio"] == 5.0 and stall["name"] == "checkpoint stall on CUDA (NVIDIA H200)"
    assert stall["passed"] is True
