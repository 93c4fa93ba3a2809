"""Encryption of secret environment values between the gateway (which seals) and the executors (which open).

AES-256-GCM with a random 96-bit nonce per value. The associated data binds each ciphertext to its job id and
its variable name, so a sealed value copied into another job, or under another name, does not open: a
user who somehow got another tenant's ciphertext cannot have it delivered to a run of their own. The key is
``TETO_SECRETS_KEY``: a path to a file holding the key, or the key itself, as 32 bytes in base64; ``teto up``
writes one and gives it only to the gateway and the executors.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_BYTES = 32
_VERSION = "v1."
_NONCE = 12
KEY_SETTING = "TETO_SECRETS_KEY"


class SealingError(ValueError):
    """A key that cannot be used, or a sealed value that does not open (tampered, other job, other key)."""


def new_key() -> str:
    """A fresh key, base64 text (what a key file holds)."""
    return base64.urlsafe_b64encode(secrets.token_bytes(KEY_BYTES)).decode()


def write_key_file(path: Path) -> Path:
    """Create ``path`` with a new key, readable by its owner only; an existing key is kept (jobs sealed with
    it must still open after a restart)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(new_key() + "\n")
    return path


def load_key(setting: str) -> bytes:
    """The key named by the setting: a file path (its content is the key) or the base64 key itself."""
    text = setting.strip()
    candidate = Path(text).expanduser()
    if candidate.is_file():
        try:
            text = candidate.read_text().strip()
        except OSError as exc:
            raise SealingError(f"{KEY_SETTING}: cannot read key file {str(candidate)!r}: {exc.strerror}") from None
    try:
        standard = text.replace("-", "+").replace("_", "/")
        key = base64.b64decode(standard + "=" * (-len(standard) % 4), validate=True)
    except (binascii.Error, ValueError):
        if "/" in text:
            raise SealingError(f"{KEY_SETTING}: no key file at {text!r}") from None
        raise SealingError(f"{KEY_SETTING}: not base64 (give a key file path or {KEY_BYTES} bytes in base64)"
                           ) from None
    if len(key) != KEY_BYTES:
        raise SealingError(f"{KEY_SETTING}: the key is {len(key)} bytes; it must be {KEY_BYTES}")
    return key


def _aad(job_id: str, name: str) -> bytes:
    return b"teto-secret/1\0" + job_id.encode() + b"\0" + name.encode()


def seal(key: bytes, plaintext: str, *, job_id: str, name: str) -> str:
    nonce = secrets.token_bytes(_NONCE)
    sealed = AESGCM(key).encrypt(nonce, plaintext.encode(), _aad(job_id, name))
    return _VERSION + base64.urlsafe_b64encode(nonce + sealed).decode().rstrip("=")


def open_sealed(key: bytes, token: str, *, job_id: str, name: str) -> str:
    """The plaintext, or SealingError naming the variable (never the value)."""
    if not token.startswith(_VERSION):
        raise SealingError(f"secret {name!r}: not a sealed value")
    body = token[len(_VERSION):]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        if len(raw) <= _NONCE:
            raise ValueError("too short")
        return AESGCM(key).decrypt(raw[:_NONCE], raw[_NONCE:], _aad(job_id, name)).decode()
    except (InvalidTag, ValueError, binascii.Error):
        raise SealingError(f"secret {name!r} does not open with this key for job {job_id} "
                           "(tampered, sealed for another job, or another key)") from None
