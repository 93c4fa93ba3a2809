"""``teto env create``: prepare a shared Python environment a job can name (issue 27: ``JobSpec.environment``).

A ``command`` job runs as its own uid, so its interpreter and libraries must be reachable by that uid. This makes a
virtual environment at ``--path`` (default /opt/teto/env) from an interpreter every user can run, gives it Teto's
SDK and this installation's packages (a ``.pth`` file: the installed torch is reused, never fetched again), installs
the requirements of the extras asked for (``--extras hf,lightning``: what ``pip install 'teto[hf]'`` would add,
with torch constrained to the installed version), and opens it to every user (a+rX). Run it on each node, then list
the path in the node's ``TETO_ENVIRONMENTS``; jobs name it in their spec (``teto submit --environment PATH``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

DEFAULT_PATH = Path("/opt/teto/env")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
_SELF = re.compile(r"^teto\s*\[([^\]]*)\]\s*$", re.IGNORECASE)  # an extra naming Teto's own extras


class EnvError(Exception):
    pass


def extras_requirements(requires: Iterable[str], extras: Iterable[str]) -> list[str]:
    """The requirements the named extras add (their markers dropped); an extra that names Teto's own others
    (``teto[hf,lightning]`` in ``dev``) adds theirs, never a package called teto from an index. EnvError for an
    extra the project lacks. Pure."""
    wanted = [e.strip() for e in extras if e.strip()]
    by_extra: dict[str, list[str]] = {}
    for req in requires:
        m = _EXTRA.search(req)
        if m:
            by_extra.setdefault(m.group(1), []).append(req.split(";", 1)[0].strip())
    missing = [e for e in wanted if e not in by_extra]
    if missing:
        raise EnvError(f"teto has no extra {', '.join(missing)} (it has: {', '.join(sorted(by_extra)) or 'none'})")
    out: list[str] = []
    seen: set[str] = set()

    def add(extra: str) -> None:
        if extra in seen:
            return
        seen.add(extra)
        for req in by_extra.get(extra, []):
            own = _SELF.match(req)
            if own:
                for name in own.group(1).split(","):
                    add(name.strip())
            else:
                out.append(req)

    for extra in wanted:
        add(extra)
    return list(dict.fromkeys(out))


def pth_lines(project_root: Path, packages: Iterable[Path]) -> list[str]:
    """The ``.pth`` lines that give the environment Teto's SDK and this installation's packages, after its own.
    Pure."""
    return list(dict.fromkeys([str(project_root), *(str(p) for p in packages)]))


def base_interpreter() -> str:
    """An interpreter of this Python version every user can run (a venv made from one under /root cannot be)."""
    from teto.stack.isolation import workload_python

    python, problems = workload_python()
    if python is None:
        raise EnvError("no interpreter of this Python version that other users can run: " + "; ".join(problems))
    return python or os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise EnvError(f"{what} failed ({done.returncode}): {(done.stderr or done.stdout)[-2000:]}")


def _site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def _open_to_all(root: Path) -> None:
    """a+rX on the environment (and a+x on its ancestors' search bit is the operator's: they are reported)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames, ""]:
            p = os.path.join(dirpath, name) if name else dirpath
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                continue
            extra = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
            if stat.S_ISDIR(st.st_mode) or st.st_mode & stat.S_IXUSR:
                extra |= stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
            os.chmod(p, st.st_mode | extra)


def create(path: Path, extras: list[str], *, python: str | None = None) -> list[str]:
    """Make (or update) the environment at ``path``; the lines to print."""
    from agents.executor.isolation import reach_problems
    from agents.executor.launch import PROJECT_ROOT, packages

    path = path.absolute()
    requirements = extras_requirements(importlib.metadata.requires("teto") or [], extras)
    base = python or base_interpreter()
    if not (path / "bin" / "python").exists():
        _run([base, "-m", "venv", "--without-pip", str(path)], f"{base} -m venv {path}")
    env_python = path / "bin" / "python"
    site = _site_packages(env_python)
    (site / "teto-installation.pth").write_text("\n".join(pth_lines(PROJECT_ROOT, packages())) + "\n")
    lines = [f"environment {path}: {env_python} with Teto's SDK and the packages of {sys.prefix}"]
    if requirements:
        # The installed torch's version: the constraint that keeps pip from fetching another.
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(f"torch=={importlib.metadata.version('torch')}\n")
            constraints = f.name
        try:
            # The agent's pip, run for the environment's interpreter: it sees the installed packages through the
            # .pth file, so only what is missing is installed, into the environment.
            _run([sys.executable, "-m", "pip", "--python", str(env_python), "install", "-q", "-c", constraints,
                  *requirements], "pip install " + " ".join(requirements))
        finally:
            os.unlink(constraints)
        lines.append(f"installed for the extras {', '.join(extras)}: {' '.join(requirements)}")
    _open_to_all(path)
    _run([str(env_python), "-c", "import teto.sdk"], "importing teto.sdk in the environment")
    problems = reach_problems(Path(os.path.realpath(env_python)), PROJECT_ROOT, [*packages(), site])
    if problems:
        lines.append("WARNING: a job's own uid cannot use it: " + "; ".join(problems))
    lines.append(f"offer it on this node: TETO_ENVIRONMENTS={path} (comma-separated with others); a job names it "
                 f"with \"environment\": \"{path}\" (teto submit --environment {path})")
    return lines


def cmd_env_create(args: argparse.Namespace) -> int:
    try:
        for line in create(args.path, [e for e in (args.extras or "").split(",") if e], python=args.python):
            print(line)
    except (EnvError, OSError) as exc:
        print(f"teto env create: {exc}", file=sys.stderr)
        return 1
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    env = sub.add_parser("env", help="Python environments jobs can name (prepared on each node)")
    esub = env.add_subparsers(dest="env_command", required=True)
    p = esub.add_parser("create", help="make a shared venv with Teto's SDK and extras, reachable by job uids")
    p.add_argument("--path", type=Path, default=DEFAULT_PATH, help=f"where (default {DEFAULT_PATH})")
    p.add_argument("--extras", default="", help="comma-separated extras of teto to install, e.g. hf,lightning")
    p.add_argument("--python", help="the base interpreter (default: this version's, one every user can run)")
    p.set_defaults(func=cmd_env_create)

