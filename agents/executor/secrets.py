"""Opening a ``command`` workload's sealed env values into the run's environment, and nowhere else.

The gateway sealed each secret for this job and this variable name (libs/runtime/sealing.py); the agent holds
the key (``TETO_SECRETS_KEY``, removed from the run's environment with every other ``TETO_*`` variable). A value
that does not open (no key here, another job's ciphertext, tampering, a redacted copy) stops the run from
starting, naming the variable and never the value.
"""

from __future__ import annotations

from collections.abc import Mapping

from libs.contracts.secrets import SealedValue, SecretValue
from libs.runtime.sealing import KEY_SETTING, SealingError, load_key, open_sealed


class SecretUnavailable(ValueError):
    """A sealed value this agent cannot open (the reason names the variable)."""


def open_env(env: Mapping[str, str | SecretValue | SealedValue], *, job_id: str,
             key_setting: str | None) -> dict[str, str]:
    """The workload's env as the process gets it: plain values as given, sealed ones opened."""
    out: dict[str, str] = {}
    key: bytes | None = None
    for name, value in env.items():
        if isinstance(value, str):
            out[name] = value
            continue
        if isinstance(value, SecretValue):
            # Only the gateway makes grants and it seals every secret; a clear one here came another way.
            raise SecretUnavailable(f"secret {name!r} arrived unsealed; refusing to run it")
        if key is None:
            if not key_setting:
                raise SecretUnavailable(f"secret {name!r} is sealed but this executor has no {KEY_SETTING}")
            try:
                key = load_key(key_setting)
            except SealingError as exc:
                raise SecretUnavailable(str(exc)) from None
        try:
            out[name] = open_sealed(key, value.sealed, job_id=job_id, name=name)
        except SealingError as exc:
            raise SecretUnavailable(str(exc)) from None
    return out
