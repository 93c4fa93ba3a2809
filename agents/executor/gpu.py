"""GPUs on this node, read through NVML (nvidia-ml-py). No NVIDIA driver or library means no GPU, not an error."""

from __future__ import annotations

import logging

from libs.contracts.telemetry import GpuInfo

log = logging.getLogger(__name__)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def detect_gpus() -> list[GpuInfo]:
    try:
        import pynvml
    except ImportError:  # the package is a dependency; a broken install still must not stop a CPU node
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:  # NVMLError_LibraryNotFound on machines without a driver
        log.info("no NVIDIA GPU found (%s): running on CPU", exc.__class__.__name__)
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                memory_mb = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024))
            except pynvml.NVMLError:
                memory_mb = None
            try:
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            except pynvml.NVMLError:
                uuid = None
            gpus.append(GpuInfo(index=index, name=_text(pynvml.nvmlDeviceGetName(handle)), uuid=uuid,
                                memory_total_mb=memory_mb))
        return gpus
    except pynvml.NVMLError as exc:
        log.warning("NVML failed while listing GPUs (%s): running on CPU", exc)
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
