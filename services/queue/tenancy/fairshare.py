"""Weighted fair share on dominant resource use, with an explanation of the order.

An organisation's share of a node group is the devices it holds there over the group's capacity; its dominant
share is the largest of these, divided by its weight. Admission goes to the lowest dominant share first (ties:
organisation name), recomputed after every admission, so two organisations of equal weight alternate and one of
weight 2 settles at twice the devices of one of weight 1. Jobs that stay within their organisation's nominal
share come before any job that would borrow, whatever the shares: a guarantee is not a matter of fairness.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .model import Organisation
from .quota import Usage, held


@dataclass(frozen=True)
class Share:
    org: str
    dominant: float  # weighted: held / capacity / weight, of the dominant group
    group: str | None  # the dominant group (None: holds nothing)
    held: int
    capacity: int
    weight: float

    def explain(self) -> str:
        if self.group is None:
            return f"{self.org}: holds nothing (share 0)"
        return (f"{self.org}: share {self.dominant:.3f} = {self.held} of {self.capacity} devices of node group "
                f"{self.group} / weight {self.weight:g}")


def dominant_share(org: Organisation, usage: Usage, capacity: Mapping[str, int]) -> Share:
    best = Share(org.name, 0.0, None, 0, 0, org.weight)
    for group, total in sorted(capacity.items()):
        used = held(usage, org.name, group)
        if total <= 0 or used <= 0:
            continue
        share = used / total / org.weight
        if share > best.dominant:
            best = Share(org.name, share, group, used, total, org.weight)
    return best


def order_key(share: Share, borrowing: bool) -> tuple[bool, float, str]:
    """Smaller first: within nominal before borrowing, then lower dominant share, then name."""
    return (borrowing, share.dominant, share.org)


def explain_order(shares: list[Share]) -> list[str]:
    """Lines that say why the organisations come in this order (lowest share first)."""
    ranked = sorted(shares, key=lambda s: (s.dominant, s.org))
    return [f"{i}. {s.explain()}" for i, s in enumerate(ranked, 1)]
