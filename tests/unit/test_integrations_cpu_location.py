"""Regression: a CPU DDP run's resume loads its optimizer with map_location=cpu:0 (Trainer's args.device), which
torch refuses unless teto.integrations.cpu_location is installed (docs/workloads.md, troubleshooting)."""

from __future__ import annotations

import io

import pytest
import torch

from teto.integrations import cpu_location

pytestmark = pytest.mark.unit


def _saved() -> io.BytesIO:
    buf = io.BytesIO()
    torch.save({"exp_avg": torch.arange(4.0)}, buf)
    buf.seek(0)
    return buf


def test_a_state_loads_onto_cpu_index_zero_once_installed_and_other_locations_are_torchs():
    cpu_location.install()
    cpu_location.install()  # once per process, however often called
    loaded = torch.load(_saved(), map_location=torch.device("cpu", 0), weights_only=True)
    assert torch.equal(loaded["exp_avg"], torch.arange(4.0)) and loaded["exp_avg"].device.type == "cpu"
    with pytest.raises(RuntimeError):
        torch.load(_saved(), map_location="nowhere:3", weights_only=True)


@pytest.mark.parametrize(("location", "ours"), [("cpu:0", True), ("cpu:12", True), ("cpu", False), ("cuda:0", False),
                                                ("cpu:x", False), ("xcpu:0", False)], ids=str)
def test_only_cpu_with_an_index_is_restored_here(location, ours):
    assert (cpu_location._restore("storage", location) == "storage") is ours
