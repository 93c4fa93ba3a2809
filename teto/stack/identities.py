"""The local executors' identities, kept in ``<data-dir>/executors.json`` so ``teto up`` on a data directory that
ran before re-attaches its nodes instead of growing the fleet.

Each executor part (``executor-1``, ``executor-r1``, ...) starts this run under the executor id it last had. Its
node id follows from the executor id (agents/executor/settings.py), so the node registers again as the same node
(a new boot): it is checked and ready again in the time of its checks, rather than leaving a dead node behind
and joining as a stranger. A restart after a crash within one run still takes a new id (supervisor.Part): the
predecessor's lease then expires on its own rather than being inherited by a process that knows nothing of it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

FILE = "executors.json"
_ID = re.compile(r"^[A-Za-z0-9_-]{1,120}$")


class Identities:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FILE
        self.known: dict[str, str | None] = self._read()
        self.taken: set[str] = set()

    def _read(self) -> dict[str, str]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ValueError(f"{self.path} is not readable JSON ({exc}); move it away to start with new "
                             "executor identities") from None
        if not isinstance(data, dict):
            raise ValueError(f"{self.path} must map executor part names to executor ids")
        return {str(k): v for k, v in data.items() if v is None or (isinstance(v, str) and _ID.match(v))}

    def names(self) -> list[str]:
        """Every part recorded (replaced ones too), in the order they were first recorded."""
        return list(self.known)

    def replaced(self, name: str) -> bool:
        return name in self.known and self.known[name] is None

    def take(self, name: str, make: Callable[[], str]) -> str:
        """The id of part ``name`` for this start: the recorded one on its first start in this run, else (a
        crash restart, or a part never seen) a new one from ``make``; recorded either way."""
        recorded = self.known.get(name)
        if recorded is not None and name not in self.taken:
            executor_id = recorded
        else:
            executor_id = make()
        self.taken.add(name)
        self.known[name] = executor_id
        self._write()
        return executor_id

    def forget(self, name: str) -> None:
        """A replaced node's part is gone for good: neither it nor its id comes back on the next ``teto up``
        (its replacement, recorded under its own name, does)."""
        self.known[name] = None
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.known, indent=2))
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)
