"""The NVML check (nvidia-ml-py): ECC errors, retired pages or remapped rows, XID events, temperature, power, clocks
and throttle reasons of every GPU of the node; ``not_applicable`` where there is no NVML or no NVIDIA GPU (never a
silent pass). One of the suite's tests (suite.py ``TESTS``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .spec import Result, Spec

TEMPERATURE_LIMIT_C = 90.0


def nvml(spec: Spec) -> Result:
    try:
        import pynvml
    except ImportError:
        return Result("not_applicable", error="nvidia-ml-py is not installed: no NVML readings")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return Result("not_applicable", error=f"no NVIDIA GPU on this node ({exc.__class__.__name__})")
    try:
        return _nvml_readings(pynvml, spec)
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _nvml_readings(nv: Any, spec: Spec) -> Result:
    """ECC, retired pages / remapped rows, XID events, temperature, power, clocks and throttle reasons."""
    figures: dict[str, float] = {}
    problems: list[str] = []
    devices = []
    hw_slowdown = 0x8 | 0x40 | 0x80  # HW slowdown, HW thermal slowdown, HW power brake

    def read(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except nv.NVMLError:
            return None

    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        d: dict[str, Any] = {"index": i}
        d["ecc_uncorrected"] = read(lambda: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC))
        d["ecc_corrected"] = read(lambda: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC))
        remap = read(lambda: nv.nvmlDeviceGetRemappedRows(h))  # (corr, uncorr, pending, failure)
        if remap is not None:
            d["remapped_rows_correctable"], d["remapped_rows_uncorrectable"] = remap[0], remap[1]
            d["remap_pending"], d["remap_failure"] = bool(remap[2]), bool(remap[3])
        else:
            retired = read(lambda: nv.nvmlDeviceGetRetiredPages(h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))
            d["retired_pages_dbe"] = len(retired) if retired is not None else None
        d["temperature_c"] = read(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        power = read(lambda: nv.nvmlDeviceGetPowerUsage(h))
        d["power_w"] = power / 1000 if power is not None else None
        d["sm_clock_mhz"] = read(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        d["mem_clock_mhz"] = read(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))
        reasons = read(lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))
        d["throttle_reasons"] = hex(reasons) if reasons is not None else None
        d["xid_events"] = _xids(nv, h)
        if d["ecc_uncorrected"]:
            problems.append(f"GPU {i}: {d['ecc_uncorrected']} uncorrected ECC errors")
        if d.get("remap_failure") or d.get("remap_pending"):
            problems.append(f"GPU {i}: row remapping {'failed' if d.get('remap_failure') else 'pending'}")
        if d["xid_events"]:
            problems.append(f"GPU {i}: XID events {d['xid_events']}")
        if d["temperature_c"] is not None and d["temperature_c"] > TEMPERATURE_LIMIT_C:
            problems.append(f"GPU {i}: temperature {d['temperature_c']} C above {TEMPERATURE_LIMIT_C:g}")
        if reasons is not None and reasons & hw_slowdown:
            problems.append(f"GPU {i}: hardware slowdown (throttle reasons {hex(reasons)})")
        for key in ("temperature_c", "power_w", "sm_clock_mhz", "ecc_uncorrected", "ecc_corrected"):
            if isinstance(d.get(key), int | float):
                figures[f"gpu{i}_{key}"] = float(d[key])
        devices.append(d)
    if spec.fault.get("nvml") == "fail":
        problems.append("injected by TETO_TEST_FAULT")
    return Result("failed" if problems else "passed", figures, {"gpus": devices}, "; ".join(problems) or None)


def _xids(nv: Any, handle: Any, wait_ms: int = 200) -> list[int]:
    """XID critical errors seen while we listen briefly (older ones are in the kernel log, not here)."""
    try:
        events = nv.nvmlEventSetCreate()
        nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, events)
    except nv.NVMLError:
        return []
    seen = []
    try:
        while True:
            try:
                data = nv.nvmlEventSetWait_v2(events, wait_ms)
            except nv.NVMLError:  # timeout: nothing more
                break
            seen.append(int(data.eventData))
    finally:
        try:
            nv.nvmlEventSetFree(events)
        except nv.NVMLError:
            pass
    return seen
