"""The Python environment a ``command`` job names (issue 27): which interpreter runs it, and what it is told.

A job may name an environment (``JobSpec.environment``): an interpreter, or a venv/conda directory, prepared on
the nodes by the operator (``teto env create``) and offered by each agent (``TETO_ENVIRONMENTS``). The agent runs
the command with that interpreter: a leading ``python``/``python3``/``python3.X`` becomes it, and the
environment's ``bin`` comes first on PATH (with ``VIRTUAL_ENV``/``CONDA_PREFIX`` as activation sets them), so a
script the command starts finds the same interpreter. An environment this node does not offer, or that is gone,
cannot start (the run's error says which and what the node offers). Pure, but for ``resolve``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_PYTHON = re.compile(r"^python(?:3(?:\.\d+)?)?$")


@dataclass(frozen=True)
class PyEnv:
    """A resolved environment: its interpreter and the variables its activation sets."""

    python: str
    prefix: str | None  # the venv/conda directory (None: a bare interpreter)
    conda: bool = False

    @property
    def bin_dir(self) -> str:
        return os.path.dirname(self.python)


def parse(value: str) -> list[str]:
    """``TETO_ENVIRONMENTS``: comma-separated absolute paths (a trailing slash dropped); ValueError for any other.
    Pure."""
    found: list[str] = []
    for item in (v.strip() for v in value.split(",")):
        if not item:
            continue
        if not item.startswith("/") or any(ord(c) < 32 for c in item):
            raise ValueError(f"TETO_ENVIRONMENTS: {item[:200]!r} is not an absolute path")
        item = item.rstrip("/") or "/"
        if item not in found:
            found.append(item)
    return found


def refusal(environment: str, offered: Sequence[str]) -> str | None:
    """Why this node cannot run a job naming ``environment`` (None: it offers it). Pure."""
    if environment in offered:
        return None
    have = ", ".join(offered) if offered else "none"
    return f"the Python environment {environment} is not offered on this node (TETO_ENVIRONMENTS: {have})"


def of(environment: str, *, is_dir: bool, conda: bool = False) -> PyEnv:
    """The interpreter of an environment: a directory's ``bin/python``, else the path itself. Pure."""
    if is_dir:
        return PyEnv(python=os.path.join(environment, "bin", "python"), prefix=environment, conda=conda)
    return PyEnv(python=environment, prefix=None)


def argv(command: Sequence[str], env: PyEnv) -> list[str]:
    """The command with a leading bare ``python``/``python3``/``python3.X`` replaced by the environment's
    interpreter; any other program is run as given (found on the environment's PATH first). Pure."""
    if command and _PYTHON.match(command[0]):
        return [env.python, *command[1:]]
    return list(command)


def variables(env: PyEnv, run_env: Mapping[str, str]) -> dict[str, str]:
    """What activating the environment sets for the run: its ``bin`` first on PATH, and ``VIRTUAL_ENV`` (or
    ``CONDA_PREFIX``) for a directory. Pure."""
    path = run_env.get("PATH", "")
    out = {"PATH": os.pathsep.join(p for p in (env.bin_dir, path) if p)}
    if env.prefix is not None:
        out["CONDA_PREFIX" if env.conda else "VIRTUAL_ENV"] = env.prefix
    return out


def resolve(environment: str) -> PyEnv:
    """The environment as it lies on this node; FileNotFoundError saying what is missing."""
    is_dir = os.path.isdir(environment)
    env = of(environment, is_dir=is_dir, conda=is_dir and os.path.isdir(os.path.join(environment, "conda-meta")))
    if not os.access(env.python, os.X_OK):
        raise FileNotFoundError(f"the Python environment {environment} has no interpreter at {env.python}")
    return env
