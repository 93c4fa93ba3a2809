"""The audit key: a secret file only the audit service is given (``TETO_AUDIT_KEY_FILE``).

Whoever holds it can make valid macs and anchors, so it must not be readable by the database's writers, the other
services or the jobs: ``teto up`` creates it 0600 under the data directory and hands its path to the audit
service alone; a deployment mounts it as a secret into the audit container only.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from .domain.anchoring import MIN_KEY_BYTES

log = logging.getLogger(__name__)


class AuditKeyError(ValueError):
    """The configured key file cannot be used (missing, empty, too short): the service refuses to start."""


def load_key(path: Path) -> bytes:
    try:
        key = path.read_bytes().strip()
    except OSError as exc:
        raise AuditKeyError(f"audit key file {path}: {exc.strerror or exc}") from None
    if len(key) < MIN_KEY_BYTES:
        raise AuditKeyError(f"audit key file {path} holds {len(key)} bytes; at least {MIN_KEY_BYTES} are needed")
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        log.warning("audit key file %s is readable by others (mode %o): anyone who reads it can forge the audit "
                    "log's macs and anchors; chmod 600 it", path, mode)
    return key


def create_key_file(path: Path) -> bool:
    """Create a fresh random key at ``path`` (0600) unless one is there; True when created now."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return True


if __name__ == "__main__":  # python -m services.audit.keyfile PATH: make the key once (deploy/compose.yml)
    import sys

    target = Path(sys.argv[1])
    print(f"audit key {'created' if create_key_file(target) else 'kept'} at {target}")
