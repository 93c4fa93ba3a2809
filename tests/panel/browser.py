"""The browser the panel tests drive: the system's Chromium (Debian's ``chromium`` package) through Playwright.

Playwright's own browser download (``playwright install``) is never used. When ``chromium`` is missing and this
is a Debian-like system (apt-get) running as root, it is installed once with
``apt-get install -y --no-install-recommends chromium``; anywhere else the tests stop with the one line to run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

CANDIDATES = ("chromium", "chromium-browser")
INSTALL = "apt-get install -y --no-install-recommends chromium"


class BrowserMissing(RuntimeError):
    pass


def find_chromium() -> str | None:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def ensure_chromium() -> str:
    """The path of the system Chromium, installing it with apt-get when that is possible here."""
    found = find_chromium()
    if found:
        return found
    if shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
        print(f"tests/panel: Chromium is not installed; running `{INSTALL}` (once)", file=sys.stderr, flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        update = subprocess.run(["apt-get", "update"], env=env, capture_output=True, text=True)
        result = subprocess.run(INSTALL.split(), env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise BrowserMissing(f"`{INSTALL}` failed ({result.returncode}): {result.stderr[-2000:]}"
                                 f"{update.stderr[-500:]}")
        found = find_chromium()
        if found:
            return found
    raise BrowserMissing("the panel's browser tests need Chromium from the system's package manager; on Debian or "
                         f"Ubuntu run as root: {INSTALL}  (elsewhere install Chromium and put it on PATH)")


if __name__ == "__main__":
    print(ensure_chromium())
