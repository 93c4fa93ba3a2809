"""Which nodes may take a job that names a Python environment (issue 27): only those whose executor offers it
(``TETO_ENVIRONMENTS``, sent with every heartbeat and stored on its row); a job naming none goes anywhere. A
worker granted to a node without its environment would fail the run and spend an attempt, so placement (the
``placement`` pass) counts, for such a job, only the nodes that offer it: as ready capacity (a job no ready node
offers its environment to waits with ``no_environment``), as free nodes to grant (every worker of a gang), and as
nodes a reclaim may free for it. Pure.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol


class Offering(Protocol):
    @property
    def environments(self) -> Collection[str]: ...


def offers(offered: Collection[str], environment: str | None) -> bool:
    """Whether a node offering ``offered`` may run a job naming ``environment`` (None: the executor's own
    interpreter, which every node has)."""
    return environment is None or environment in offered


def pick(free: Sequence[Offering], start: int, workers: int, environment: str | None) -> range | list[int]:
    """The positions in ``free`` (a node group's free nodes, smallest first) of the ``workers`` nodes a job
    takes, from ``start`` (the first with enough GPUs) on: the next ones, skipping those that do not offer its
    environment; fewer than ``workers`` when not enough do. A job naming none takes the next ``workers`` (a
    range: the pass deletes them as one slice)."""
    if environment is None:
        return range(start, min(start + workers, len(free)))
    found: list[int] = []
    for i in range(start, len(free)):
        if environment in free[i].environments:
            found.append(i)
            if len(found) == workers:
                break
    return found


def remove(free: list, picked: range | list[int]) -> None:
    """``free`` without the nodes at ``picked`` (``pick``'s answer): granted, no longer free in this pass."""
    if isinstance(picked, range):
        del free[picked.start:picked.stop]
        return
    for i in reversed(picked):
        del free[i]


def missing_reason(environment: str) -> str:
    """A job's wait when no ready node offers its environment (all that offered it gone, or stopped offering it):
    it waits queued until one does, never granted to a node without it."""
    return (f"no ready node offers the Python environment {environment} (prepare it on a node with teto env "
            "create and list it in its TETO_ENVIRONMENTS)")
