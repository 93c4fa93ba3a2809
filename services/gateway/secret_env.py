"""Sealing a ``command`` workload's secret env values before the command leaves the gateway.

The user sends ``{"secret": "..."}``; the bus, the queue, events and grants carry ``{"sealed": "<ciphertext>"}``
(libs/runtime/sealing.py, bound to the job id and the variable name); every reader sees
``libs.contracts.secrets.REDACTED``. The gateway refuses a sealed value from a user (only it makes them) and a
secret when no key is configured, naming the setting, rather than let a secret travel in clear.
"""

from __future__ import annotations

from libs.contracts.jobs import CommandWorkload, JobSpec
from libs.contracts.secrets import SealedValue, SecretValue
from libs.runtime.sealing import KEY_SETTING, seal


class SecretRefused(ValueError):
    """A spec whose secrets cannot be accepted (the reason names the variable or the missing setting)."""


def has_secrets(spec: JobSpec) -> bool:
    workload = spec.workload
    return isinstance(workload, CommandWorkload) and any(
        isinstance(v, SecretValue | SealedValue) for v in workload.env.values())


def seal_spec(spec: JobSpec, *, job_id: str, key: bytes | None) -> JobSpec:
    """The spec with every secret value replaced by its ciphertext for ``job_id``; plain values unchanged; the same
    object when it holds no secret."""
    workload = spec.workload
    if not isinstance(workload, CommandWorkload):
        return spec
    env: dict[str, str | SecretValue | SealedValue] = {}
    sealed = False
    for name, value in workload.env.items():
        if isinstance(value, SealedValue):
            raise SecretRefused(f"workload.env.{name}: a sealed value cannot be submitted (secrets are not "
                                'copied from a job view); give the value again as {"secret": "..."}')
        if isinstance(value, SecretValue):
            if key is None:
                raise SecretRefused(f"workload.env.{name} is a secret, but this gateway has no {KEY_SETTING} "
                                    "configured to encrypt it; ask the operator to set it, or do not mark it secret")
            value = SealedValue(sealed=seal(key, value.secret, job_id=job_id, name=name))
            sealed = True
        env[name] = value
    if not sealed:
        return spec  # the very object: a spec without secrets leaves as it came (and is not measured again)
    return spec.model_copy(update={"workload": workload.model_copy(update={"env": env})})
