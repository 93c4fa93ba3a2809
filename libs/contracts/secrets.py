"""Secret environment values of a ``command`` workload, in the three shapes they take.

A user marks a value secret: ``"env": {"HF_TOKEN": {"secret": "hf_..."}}``. The gateway replaces it with its
ciphertext, ``{"sealed": "<token>"}``, before the command goes on the bus, so the command stream, the queue's
stored spec, job events and grants hold only ciphertext; only an executor holding the key opens it, into the
run's environment. Wherever a spec is shown (views, events, the audit log) a sealed or secret value is shown
as :data:`REDACTED`, never its ciphertext nor its plaintext. ``redact`` is the one rule for that, used by the
gateway and the audit service alike.
"""

from __future__ import annotations

import re
from typing import Any

from typing import Annotated

from pydantic import Field, TypeAdapter, ValidationError, WrapValidator

from .bounds import EnvValue
from .envelope import Model

REDACTED_TEXT = "redacted"
# What every reader sees in place of a secret. A "sealed" shape, so a spec copied from a view and submitted
# again is refused (the gateway accepts no sealed value from a user) rather than run with the word "redacted".
REDACTED: dict[str, str] = {"sealed": REDACTED_TEXT}
SEALED_MAX = 200_000  # base64 of the largest EnvValue plus nonce and tag


class SecretValue(Model):
    """A value the user marks secret; it exists only in the request body and in the run's environment."""

    secret: EnvValue = Field(description="The value; encrypted by the gateway, shown to no reader")


class SealedValue(Model):
    """A secret value as it travels and is stored: its ciphertext (or :data:`REDACTED` where it is shown)."""

    sealed: str = Field(min_length=1, max_length=SEALED_MAX, pattern=r"^[A-Za-z0-9._-]+$",
                        description="Ciphertext bound to the job and the name (base64url)")


def is_secret_shape(value: Any) -> bool:
    """A ``{"secret": ...}`` or ``{"sealed": ...}`` object, as a model or as parsed JSON."""
    if isinstance(value, SecretValue | SealedValue):
        return True
    return isinstance(value, dict) and len(value) == 1 and ("secret" in value or "sealed" in value)


# The same shapes inside text that quotes JSON (a refused message's excerpt, a dead letter's payload).
_IN_TEXT = re.compile(r'("(?:secret|sealed)"\s*:\s*)"(?:[^"\\]|\\.)*"?')


def redact_text(text: str) -> str:
    """``text`` with the value of every ``"secret": "..."`` or ``"sealed": "..."`` it quotes replaced (also a
    value cut off by an excerpt's end)."""
    if '"secret"' not in text and '"sealed"' not in text:
        return text
    return _IN_TEXT.sub(lambda m: m.group(1) + '"' + REDACTED_TEXT + '"', text)


def redact(value: Any) -> Any:
    """``value`` (any JSON: a spec, an event's detail, a command payload) with every secret or sealed value
    replaced by :data:`REDACTED`, also where a string quotes one. Pure; the input is not changed."""
    if isinstance(value, str):
        return redact_text(value)
    if is_secret_shape(value):
        return dict(REDACTED)
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


_PLAIN = TypeAdapter(EnvValue)


def _one_shape(value: Any, handler: Any) -> Any:
    """Validate as exactly one of the shapes, so a refusal names the variable with one reason, not three."""
    if isinstance(value, SecretValue | SealedValue):
        return value
    try:
        if isinstance(value, str):
            return _PLAIN.validate_python(value)
        if isinstance(value, dict) and "secret" in value:
            return SecretValue.model_validate(value)
        if isinstance(value, dict) and "sealed" in value:
            return SealedValue.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise ValueError(f"{where + ': ' if where else ''}{first.get('msg', 'invalid')}") from None
    raise ValueError('an env value is a string, {"secret": "..."} or {"sealed": "..."}')


# One value of a command workload's env.
EnvEntry = Annotated[EnvValue | SecretValue | SealedValue, WrapValidator(_one_shape)]
