"""The local stack's provisioner: which executor parts ``teto up`` starts, the command the health service runs
to replace a node (it drops a request file), and serving those requests by stopping the replaced node's agent
and starting a fresh one in its group."""

from __future__ import annotations

import json
import logging
import re
import shlex
import sys
from pathlib import Path

from teto.stack.identities import Identities
from teto.stack.supervisor import Supervisor

log = logging.getLogger("teto.up")


def provisioner_command(data_dir: Path) -> str:
    """The health service runs this when a node is replaced: it drops a request file for ``replace_nodes``."""
    code = ("import json,sys,pathlib,uuid; d=pathlib.Path(sys.argv[1]); d.mkdir(parents=True,exist_ok=True); "
            "t=d/(uuid.uuid4().hex+'.tmp'); t.write_text(json.dumps(dict(node_id=sys.argv[2],group=sys.argv[3],"
            "executor_id=sys.argv[4]))); t.rename(t.with_suffix('.json'))")
    return (f"{shlex.quote(sys.executable)} -c {shlex.quote(code)} {shlex.quote(str(data_dir / 'provision'))} "
            "{node_id} {group} {executor_id}")


def executor_parts(executors: int, identities: Identities) -> list[str]:
    """The executor parts to start: ``executor-1`` .. ``executor-N`` but those an earlier run replaced, and the
    replacements it started (``executor-rK``), which are nodes of the fleet like the others and come back."""
    wanted = [f"executor-{i}" for i in range(1, executors + 1)]
    wanted += [name for name in identities.names() if re.fullmatch(r"executor-r\d+", name)]
    return [name for name in wanted if not identities.replaced(name)]


def replace_nodes(sup: Supervisor, data_dir: Path, add_executor, identities: Identities | None = None) -> list[str]:
    """Serve the local provisioner's requests: stop the replaced node's agent for good and start a fresh one
    in the same group (a new executor and node id, so it joins and is checked like any new node)."""
    started = []
    for request in sorted((data_dir / "provision").glob("*.json")):
        try:
            info = json.loads(request.read_text())
        except (OSError, ValueError):
            continue
        old = next((p for p in sup.parts.values() if p.executor_id == info.get("executor_id")), None)
        if old is not None:
            sup.stop([old.name])
            sup.parts.pop(old.name, None)
            sup.stopping = False  # stop() is for shutdown; the rest of the stack keeps being supervised
            if identities is not None:
                identities.forget(old.name)
        taken = {*sup.parts, *(identities.names() if identities is not None else ())}
        name = next(f"executor-r{k}" for k in range(1, len(taken) + 2) if f"executor-r{k}" not in taken)
        add_executor(name, str(info.get("group") or "local"))
        log.warning("node %s was replaced: started %s in group %s", info.get("node_id"), name, info.get("group"))
        request.unlink(missing_ok=True)
        started.append(name)
    return started
