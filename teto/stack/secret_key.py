"""``teto up``'s key for sealing job secrets: made once under the data directory, given to the gateway (which
seals) and the executors (which open) only; every other part has the variable removed.

An operator's own ``TETO_SECRETS_KEY`` wins; it is handed out the same way.
"""

from __future__ import annotations

import os
from pathlib import Path

from libs.runtime.sealing import write_key_file

HOLDERS = ("gateway", "executor")


def key_file(data_dir: Path) -> Path:
    return data_dir / "secrets" / "secrets.key"


def give_secrets_key(own: dict[str, dict[str, str | None]], data_dir: Path, environ: dict[str, str]) -> str:
    """Fill ``own`` (teto/stack/up.py ``part_env``) and return the key's setting (a file path)."""
    setting = environ.get("TETO_SECRETS_KEY") or ""
    if not setting:
        path = key_file(data_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        setting = str(write_key_file(path).resolve())
    for part in own:
        own[part]["TETO_SECRETS_KEY"] = setting if part in HOLDERS else None
    return setting
