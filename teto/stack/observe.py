"""Metrics ports for ``teto up``: every process it starts gets a free port of its own for ``/metrics``
(``TETO_METRICS_PORT``), kept across that process's restarts, listed in ``<data-dir>/metrics.json`` and printed.
``TETO_METRICS_PORT=0`` in ``teto up``'s environment turns every endpoint off.

The ports are taken below the kernel's ephemeral range (``free_port``): a port from inside it, free when
chosen, could be handed to any process's outgoing connection (to NATS, to PostgreSQL) in the seconds before the
part starts and binds it, and it is kept across restarts. A part that still finds its port taken runs on without
``/metrics`` and says so (libs/runtime/metrics.py ``Endpoint``). Nor is a metrics port ever one of the stack's own
ports that are bound later (``reserved``: the gateway replicas' ``--http-port`` and the ports after it): free when
a metrics port is chosen, taken by a part's ``/metrics`` it would leave the gateway unable to start, and anyone
reading the gateway's URL would get metrics instead of the API."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from libs.runtime.ports import free_port


class MetricsPorts:
    def __init__(self, data_dir: Path, environ: Mapping[str, str] | None = None, host: str = "127.0.0.1",
                 reserved: Iterable[int] = ()) -> None:
        environ = os.environ if environ is None else environ
        self.reserved = frozenset(reserved)
        self.path = data_dir / "metrics.json"
        self.host = environ.get("TETO_METRICS_HOST") or host
        self.off = environ.get("TETO_METRICS_PORT", "").strip() == "0"
        self.ports: dict[str, int] = {}

    def env(self, part: str, env: dict[str, str]) -> dict[str, str]:
        """``env`` with this part's metrics port (the same one each time the same part is asked for)."""
        if self.off:
            return {**env, "TETO_METRICS_PORT": "0"}
        if part not in self.ports:
            self.ports[part] = self._free()
            self._write()
        return {**env, "TETO_METRICS_PORT": str(self.ports[part]), "TETO_METRICS_HOST": self.host}

    def _free(self) -> int:
        """A free port below the ephemeral range that no other part of this stack has or will bind."""
        while (port := free_port()) in self.ports.values() or port in self.reserved:
            pass
        return port

    def urls(self) -> dict[str, str]:
        return {part: f"http://{self.host}:{port}/metrics" for part, port in self.ports.items()}

    def summary(self) -> str:
        if self.off:
            return "off (TETO_METRICS_PORT=0)"
        ports = ", ".join(f"{part} :{port}" for part, port in self.ports.items())
        return f"http://{self.host}:<port>/metrics  ({ports}; list in {self.path})"

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.urls(), indent=2))
        os.replace(tmp, self.path)
