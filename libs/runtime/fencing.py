"""Epoch fencing at the edge: a fact from an older lease epoch is old news (a zombie executor, a redelivered
report), never an error. The domain says *that* a fact is stale (a typed result); this module owns what every
service then does: count it against the executor that sent it and log it once per executor, so a zombie that
reports every interval cannot flood the log."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


def is_stale(epoch: int | None, current: int | None) -> bool:
    """A message names an epoch older than the job's current lease (no epoch, or no lease yet: not stale)."""
    return epoch is not None and current is not None and epoch < current


@dataclass(frozen=True)
class StaleEpoch:
    """Ignored: ``executor_id`` spoke about ``job_id`` under ``epoch`` while ``current`` is the live lease."""

    executor_id: str
    job_id: str
    epoch: int | None
    current: int | None
    what: str = "message"

    @property
    def reason(self) -> str:
        return f"stale epoch {self.epoch} (current {self.current})"


@dataclass
class StaleCounter:
    """How many stale facts each service ignored, for views, metrics and tests."""

    service: str
    count: int = 0
    by_executor: dict[str, int] = field(default_factory=dict)

    def note(self, stale: StaleEpoch) -> None:
        self.count += 1
        seen = self.by_executor.get(stale.executor_id, 0)
        self.by_executor[stale.executor_id] = seen + 1
        if not seen:  # once per executor
            log.warning("%s ignores %ss of executor %s about job %s: %s (logged once per executor)", self.service,
                        stale.what, stale.executor_id, stale.job_id, stale.reason)
