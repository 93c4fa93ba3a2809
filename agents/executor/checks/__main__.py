"""``python -m agents.executor.checks``: run the tests named in the JSON spec read from stdin, printing one
JSON line per test as it starts and one with its result (what ``runner`` turns into CheckReports)."""

from __future__ import annotations

import json
import sys
import time
import traceback

from .spec import Spec
from .suite import ORDER, TESTS, threads


def main() -> int:
    spec = Spec(**json.loads(sys.stdin.read()))
    threads()

    def say(record: dict) -> None:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()

    for name in sorted(spec.tests, key=ORDER.index):
        say({"test": name, "status": "running"})
        start = time.perf_counter()
        try:
            r = TESTS[name](spec)
            out = {"status": r.status, "figures": r.figures, "detail": r.detail, "error": r.error}
        except Exception as exc:  # noqa: BLE001 - a test that crashes has failed, with the reason
            out = {"status": "failed", "figures": {}, "detail": {"traceback": traceback.format_exc()[-3000:]},
                   "error": f"{type(exc).__name__}: {exc}"[:2000]}
        say({"test": name, **out, "seconds": time.perf_counter() - start})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
