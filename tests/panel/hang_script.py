"""A training that reports five steps and then hangs (its process alive, its step standing still) until stopped:
the panel's "Stuck" story."""

from __future__ import annotations

import sys
import time

from teto import sdk


def main() -> int:
    for step in range(1, 6):
        sdk.report_step(step, total_steps=100, loss=1.0 / step)
        time.sleep(0.2)
    while not sdk.stop_requested():
        time.sleep(0.2)
    return sdk.EXIT_STOPPED


if __name__ == "__main__":
    sys.exit(main())
