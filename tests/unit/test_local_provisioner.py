"""teto up's local provisioner: the hook command writes a request; the loop replaces the node's agent."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from teto.stack.provisioner import provisioner_command, replace_nodes

pytestmark = pytest.mark.unit


class FakeSupervisor:
    def __init__(self) -> None:
        from teto.stack.supervisor import Part

        self.parts = {"executor-1": Part("executor-1", ["x"], {}, executor_id="local-1-abc")}
        self.stopped: list[str] = []
        self.stopping = False

    def stop(self, names: list[str]) -> None:
        self.stopped += names
        self.stopping = True


def test_the_hook_writes_a_request_and_the_loop_swaps_the_agent(tmp_path: Path):
    cmd = provisioner_command(tmp_path).format(node_id="node-1", group="gpu-a", executor_id="local-1-abc")
    subprocess.run(shlex.split(cmd), check=True)
    assert len(list((tmp_path / "provision").glob("*.json"))) == 1
    sup = FakeSupervisor()
    added = []
    started = replace_nodes(sup, tmp_path, lambda name, group: added.append((name, group)))
    assert started == ["executor-r1"] and added == [("executor-r1", "gpu-a")]
    assert sup.stopped == ["executor-1"] and "executor-1" not in sup.parts and not sup.stopping
    assert not list((tmp_path / "provision").glob("*.json"))  # served once
