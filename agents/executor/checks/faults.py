"""The test-only fault switch: ``TETO_TEST_FAULT="matmul:fail,membw:slow"`` makes the named tests fail (a
corrupted result, a flipped byte, an unreachable peer) or run ten times slower (real sleeping inside the timed
region), so the recovery path can be exercised end to end. Never set it on a production node.
"""

from __future__ import annotations

MODES = ("fail", "slow")
SLOW_FACTOR = 10.0


def parse(spec: str | None) -> dict[str, str]:
    """``"matmul:fail, membw:slow"`` -> ``{"matmul": "fail", "membw": "slow"}``; anything malformed is refused."""
    out: dict[str, str] = {}
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        test, sep, mode = item.partition(":")
        if not sep or mode not in MODES or not test:
            raise ValueError(f"TETO_TEST_FAULT item {item!r} is not <test>:fail or <test>:slow")
        out[test.strip()] = mode
    return out
