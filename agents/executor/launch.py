"""How a grant becomes a process: argv, the ``TETO_*`` environment, working and log paths (pure).

The contract with the training process is the environment documented in docs/workloads.md. A run inherits only
an allow-list of the agent's environment (``isolation.scrub_env``: never its configuration or credentials), then
the user's ``env``, then Teto's variables and the devices granted, so neither the agent's settings nor the user
can confuse or override what the process is told about its job, or which GPUs it may use.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

from libs.contracts.agents import RunJob
from libs.contracts.jobs import CommandWorkload
from libs.contracts.telemetry import GpuInfo
from libs.runtime import tracing

from . import ckpt_quota, distenv, isolation, pyenv
from .process import Launch
from .secrets import open_env
from .settings import ExecutorSettings

FINETUNE_MODULE = "agents.executor.workloads.finetune"
# The installation this agent runs from, so that any python the user's command runs finds the SDK under its
# public name, `teto.sdk` (which re-exports agents.executor.sdk).
PROJECT_ROOT = Path(__file__).resolve().parents[2]
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class CannotStart(Exception):
    """The grant cannot become a process (its reason is what the job's attempt shows)."""


def check_env(env: Mapping[str, str]) -> None:
    """Refuse, by name, what ``execve`` would refuse with a bare "illegal environment variable name"."""
    for name, value in env.items():
        if not ENV_NAME.fullmatch(name):
            raise CannotStart(f"environment variable name {name[:200]!r} is not valid "
                              "(letters, digits and _, not starting with a digit)")
        if "\0" in value:
            raise CannotStart(f"environment variable {name!r} contains a NUL character")


def cannot_start(grant: RunJob, exc: BaseException) -> str:
    """The error a run that could not start reports: what was being started, and why not."""
    if isinstance(exc, CannotStart):
        return f"cannot start the run: {exc}"
    workload = grant.spec.workload
    program = workload.command[0] if isinstance(workload, CommandWorkload) and workload.command else argv(grant)[0]
    return f"cannot start {program!r}: {type(exc).__name__}: {exc}"


def device(gpus: list[GpuInfo]) -> str:
    return "cuda" if gpus else "cpu"


def devices_held(grant: RunJob, gpus: list[GpuInfo]) -> int:
    """Devices charged to the job: the GPUs the worker holds, or 1 for a CPU-only worker."""
    if not gpus:
        return 1
    return max(1, min(grant.spec.gpus_per_worker, len(gpus)))


def interpreter(settings: ExecutorSettings | None = None) -> str:
    return (settings.workload_python if settings else "") or sys.executable


def packages() -> list[Path]:
    """Where the agent's installed packages are (a run started with another interpreter needs them)."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(Path(paths[k]) for k in ("purelib", "platlib")))


def argv(grant: RunJob, settings: ExecutorSettings | None = None, environment: pyenv.PyEnv | None = None
         ) -> list[str]:
    workload = grant.spec.workload
    if isinstance(workload, CommandWorkload):
        # Started by the agent's guard (``Launch.guarded``), so that whatever it starts dies with the agent.
        return pyenv.argv(workload.command, environment) if environment else list(workload.command)
    return [interpreter(settings), "-m", FINETUNE_MODULE]


def environment_of(grant: RunJob, settings: ExecutorSettings) -> pyenv.PyEnv | None:
    """The Python environment a command job named, as it lies on this node (None: none named); CannotStart when
    this node does not offer it or it is gone."""
    name = grant.spec.environment
    if name is None or not isinstance(grant.spec.workload, CommandWorkload):
        return None
    why = pyenv.refusal(name, settings.environment_list)
    if why is not None:
        raise CannotStart(why)
    try:
        return pyenv.resolve(name)
    except FileNotFoundError as exc:
        raise CannotStart(str(exc)) from None


def job_dir(settings: ExecutorSettings, job_id: str) -> Path:
    return settings.effective_work_dir / "jobs" / job_id


def stop_file(settings: ExecutorSettings, grant: RunJob) -> Path:
    return job_dir(settings, grant.job_id) / f"epoch-{grant.epoch}.stop.json"


def confirmed_file(settings: ExecutorSettings, grant: RunJob) -> Path:
    """Where the agent writes the last checkpoint step whose report the bus took (ckpt_fence.confirm)."""
    return job_dir(settings, grant.job_id) / f"epoch-{grant.epoch}.confirmed"


def checkpoint_dir(settings: ExecutorSettings, job_id: str) -> Path:
    return settings.effective_checkpoint_dir / job_id


def granted_indices(grant: RunJob, gpus: list[GpuInfo]) -> list[int]:
    """The GPUs a run may see: exactly those it is charged for (``devices_held``)."""
    return [g.index for g in gpus[:devices_held(grant, gpus)]] if gpus else []


def build(grant: RunJob, settings: ExecutorSettings, gpus: list[GpuInfo], *, resume_from: Path | None,
          base_env: Mapping[str, str]) -> Launch:
    workload = grant.spec.workload
    work = job_dir(settings, grant.job_id)
    env = isolation.scrub_env(base_env, isolation.parse_allow(settings.workload_env_allow))
    environment = environment_of(grant, settings)
    if isinstance(workload, CommandWorkload):
        user_env = open_env(workload.env, job_id=grant.job_id, key_setting=settings.secrets_key)  # secrets.py
        check_env(user_env)
        env.update(user_env)
        params = "{}"
    else:
        params = workload.params.model_dump_json()
    if environment is not None:
        env.update(pyenv.variables(environment, env))
    env.update(isolation.device_env(granted_indices(grant, gpus)))  # after the user's: theirs never wins
    env.update(trace_env(base_env, tracing.carrier()))
    imports = [str(PROJECT_ROOT)]
    # The agent's own packages only for its own interpreter run elsewhere: ahead of an environment's own
    # site-packages (PYTHONPATH comes first) they would shadow its libraries.
    if settings.workload_python and environment is None:
        imports += [str(p) for p in packages()]
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*imports, env.get("PYTHONPATH", "")) if p)
    # Absolute paths from the roots resolved once per agent (``absolute``): below a root only the agent makes
    # directories, never through a link (sandbox.private_dir refuses one), so resolving each again per run
    # (six realpath walks of a dozen lstat calls) would find the same paths.
    home = absolute(settings.effective_work_dir) / "jobs" / grant.job_id
    env.update(HOME=str(home), TMPDIR=str(tmp_dir(home)))
    env.update(
        TETO_JOB_ID=grant.job_id, TETO_EPOCH=str(grant.epoch), TETO_ATTEMPT=str(grant.attempt),
        TETO_EXECUTOR_ID=settings.executor_id,
        TETO_CHECKPOINT_DIR=str(absolute(settings.effective_checkpoint_dir) / grant.job_id),
        TETO_RESUME_FROM=str(resume_from.resolve()) if resume_from else "", TETO_RANK=str(grant.rank),
        TETO_WORLD_SIZE=str(grant.world_size), TETO_RENDEZVOUS=grant.rendezvous or "",
        TETO_READY_TIMEOUT=f"{grant.ready_timeout_seconds:g}" if grant.ready_timeout_seconds else "",
        TETO_CHECKPOINT_EVERY=str(grant.spec.checkpoint_every_steps), TETO_DEVICE=device(gpus),
        TETO_CHECKPOINT_QUOTA_BYTES=str(ckpt_quota.quota_of(grant.spec.checkpoint_quota_bytes,
                                                            grant.checkpoint_quota_bytes)),
        TETO_CHECKPOINTS_KEPT=str(settings.checkpoints_kept if grant.spec.checkpoints_kept is None
                                  else grant.spec.checkpoints_kept),
        TETO_PARAMS=params, TETO_WORK_DIR=str(home), TETO_STOP_FILE=str(home / stop_file(settings, grant).name),
        TETO_CHECKPOINT_CONFIRMED=str(home / confirmed_file(settings, grant).name),
        TETO_BASE_DIR=str(absolute(settings.effective_base_model_dir)), PYTHONUNBUFFERED="1")
    env.update(distenv.torch_env(grant))  # a gang worker: torchrun's variables, after the user's (distenv.py)
    env["TETO_PROGRESS_INTERVAL"] = f"{settings.progress_interval_seconds:g}"  # the callbacks' report pace
    if settings.torch_threads:
        env["TETO_TORCH_THREADS"] = str(settings.torch_threads)
    # Every run works in its own job directory: the agent's working directory may hold its configuration.
    # Every run is started by the agent's guard: it dies with the agent, and the guard ends it by itself when the
    # agent stops extending its deadline (a frozen agent is alive: no parent-death signal would fire).
    return Launch(argv=argv(grant, settings, environment), env=env, log_path=work / f"epoch-{grant.epoch}.log", cwd=work,
                  guarded=True)


@functools.lru_cache(maxsize=64)
def absolute(root: Path) -> Path:
    """A root directory of the agent's (work, checkpoints, base model) resolved, once per agent and root."""
    return root.resolve()


def trace_env(agent_env: Mapping[str, str], context: Mapping[str, str]) -> dict[str, str]:
    """What a run needs to continue the job's trace: ``TRACEPARENT`` (and ``TRACESTATE``) of the agent's run span,
    and where its spans go (the agent's own OTEL_* endpoint and exporter choice; never the exporter's headers, which
    may hold a collector's credentials). Empty when the run is not traced."""
    if not context.get("traceparent"):
        return {}
    env = {k: v for k, v in agent_env.items() if k in tracing.CHILD_VARIABLES}
    env.update(TRACEPARENT=context["traceparent"], OTEL_SERVICE_NAME="teto-training")
    if context.get("tracestate"):
        env["TRACESTATE"] = context["tracestate"]
    return env


def tmp_dir(work: Path) -> Path:
    return work / "tmp"


def run_dirs(settings: ExecutorSettings, grant: RunJob) -> list[Path]:
    """The directories a run owns while it runs (and only then): its work dir, its temp dir, and, for rank 0 (the
    only rank that writes checkpoints), the job's checkpoint directory; another rank is handed a copy of the
    checkpoint it resumes from instead (``sandbox.hand_over``), as the directory belongs to rank 0's uid."""
    work = job_dir(settings, grant.job_id)
    return [work, tmp_dir(work)] + ([checkpoint_dir(settings, grant.job_id)] if grant.rank == 0 else [])
