"""Loading a tensor onto ``cpu:0``: what ``Trainer`` asks of ``torch.load`` when a CPU run of several processes
(DDP over gloo, a gang under Teto) resumes its optimizer. ``TrainingArguments.device`` is then ``cpu:0`` and
``Trainer`` loads ``optimizer.pt`` with ``map_location=args.device``, which torch 2.13 refuses ("don't know how to
restore data location ... (tagged with cpu:0)"; transformers 5.17). ``install()`` registers, once per process, a
location torch consults for ``cpu:<index>`` only: the storage stays on the CPU, where it already is. Every other
location is left to torch (docs/workloads.md, troubleshooting)."""

from __future__ import annotations

import re
from typing import Any

CPU_INDEX = re.compile(r"cpu:\d+")
_done = {"installed": False}


def _tag(obj: Any) -> None:
    return None  # never the location a tensor is saved with: only how one is loaded


def _restore(obj: Any, location: str) -> Any:
    return obj if CPU_INDEX.fullmatch(location) else None


def install() -> None:
    if _done["installed"]:
        return
    import torch.serialization

    torch.serialization.register_package(97, _tag, _restore)  # after every location of torch's own (10-25)
    _done["installed"] = True
