"""The pilot directory: what ``teto slurm provision`` leaves for every later pilot of the same kind (the health
service's replacements submit from it too): the request (``pilot.json``), the batch script and the agents'
settings file, the directory 0700 and the settings 0600, written atomically; the pilots' Slurm output lands
there as well (``pilot-<job id>.out``).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from . import commands
from .pilot import REQUEST, SCRIPT, SETTINGS, PilotRequest, batch_script, sbatch_args, settings_file


def _write(path: Path, text: str, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)  # before a byte is written: never readable by others, even for an instant
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write(pilot_dir: Path, request: PilotRequest, settings: Mapping[str, str], python: str) -> None:
    request.check()
    pilot_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(pilot_dir, 0o700)
    _write(pilot_dir / SETTINGS, settings_file(settings), 0o600)
    _write(pilot_dir / SCRIPT, batch_script(python, pilot_dir), 0o700)
    _write(pilot_dir / REQUEST, json.dumps(request.as_dict(), indent=2), 0o600)


def read_request(pilot_dir: Path) -> PilotRequest:
    return PilotRequest.from_dict(json.loads((pilot_dir / REQUEST).read_text()))


def submit(pilot_dir: Path, request: PilotRequest, env: Mapping[str, str] | None = None) -> str:
    """sbatch one pilot; its Slurm job id."""
    return commands.run(sbatch_args(request, pilot_dir), env).strip().split(";")[0]


async def asubmit(pilot_dir: Path, exclude: tuple[str, ...] = (), env: Mapping[str, str] | None = None) -> str:
    """A pilot like the directory's others, kept off ``exclude`` (the node it replaces)."""
    request = read_request(pilot_dir)
    request = replace(request, exclude=tuple(sorted({*request.exclude, *exclude})))
    out = await commands.arun(sbatch_args(request, pilot_dir), env)
    return out.strip().split(";")[0]
