"""The test-only fault switch: ``TETO_TEST_FAULT="matmul:fail,membw:slow"`` makes the named tests fail (a
corrupted result, a flipped byte, an unreachable peer) or run ten times slower (real sleeping inside the timed
region), so the recovery path can be exercised end to end. Never set it on a production node.
"""

from __future__ import annotations

from pathlib import Path

MODES = ("fail", "slow")
SLOW_FACTOR = 10.0


def spec_of(setting: str | None, path: Path | None, node_id: str = "") -> str:
    """The fault switch now: the setting, plus what the test's file says at this moment (read each check run; a
    directory holds one file per node id)."""
    try:
        if path is not None and path.is_dir():
            path = path / node_id
        extra = path.read_text().strip() if path is not None else ""
    except OSError:  # no file: no fault from it
        extra = ""
    return ",".join(filter(None, [(setting or "").strip(), extra]))


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
