"""``teto up``'s part of the audit's anchoring: the audit key, made once under the data directory (0600) and handed
to the audit service alone (its ``own`` environment), so no other part, no job and no database writer can make
the macs that verify checks."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from services.audit.keyfile import create_key_file

log = logging.getLogger("teto.up")

KEY_FILE = "audit.key"


def audit_key_env(data_dir: Path) -> dict[str, str]:
    """Create ``<data-dir>/audit.key`` if missing and return the audit service's own variables.

    Which other local processes can read the key depends on who runs them: as root, jobs run as another user and
    cannot; as a non-root user, every part runs as that same user, so the file mode protects the key from other
    users but not from the stack's own processes (said at start-up)."""
    path = data_dir / KEY_FILE
    if create_key_file(path):
        log.info("audit key created at %s (0600; the audit service alone is given it)", path)
    else:
        os.chmod(path, 0o600)
    if os.geteuid() != 0:
        log.warning("not root: the audit key %s is readable by every process of this user (the other services and "
                    "jobs run as you too); run as root, or use deploy/, to keep it from them", path)
    return {"TETO_AUDIT_KEY_FILE": str(path)}
