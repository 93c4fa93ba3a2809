"""What the deployment tests check of every container a manifest runs (deploy/compose.yml, deploy/k8s/): its
arguments are a command the CLI accepts, and every variable it sets is a real setting of that part (or a standard
OpenTelemetry variable) whose value the part's settings class accepts."""

from __future__ import annotations

import re
from pathlib import Path

from agents.executor.settings import ExecutorSettings
from libs.runtime.settings import CommonSettings, Settings
from services.audit.settings import AuditSettings
from services.budget.settings import BudgetSettings
from services.gateway.settings import GatewaySettings
from services.health.settings import HealthSettings
from services.queue.settings import QueueSettings
from teto.cli import build_parser

SERVICE_SETTINGS: dict[str, type[Settings]] = {
    "queue": QueueSettings, "budget": BudgetSettings, "health": HealthSettings, "audit": AuditSettings,
    "gateway": GatewaySettings,
}
# Read by libs/runtime/tracing.py (the OpenTelemetry SDK's own names).
OTEL_VARIABLES = {"OTEL_SERVICE_NAME", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                  "OTEL_TRACES_EXPORTER", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"}
CLI_VARIABLES = {"TETO_LOG_LEVEL"}  # read by the CLI itself (teto/cli_stack.py), not a setting
K8S_HELPERS = {"NODE_NAME"}  # set from the downward API only to be referenced by others: $(NODE_NAME)
# A Kubernetes dependent variable, $(NAME), or a compose one, ${NAME...}: validated with a value one may take.
_REFERENCE = re.compile(r"\$\(([A-Z_]+)\)|\$\{[A-Z_]+[^}]*\}")
SAMPLE_REFERENCE = "gpu-node-1"


def parse(argv: list[str]):
    """The CLI's reading of ``teto <argv>`` (SystemExit on an unknown command or option)."""
    return build_parser().parse_args([_REFERENCE.sub(SAMPLE_REFERENCE, a) for a in argv])


def settings_class(args) -> type[Settings]:
    if args.command == "service":
        return SERVICE_SETTINGS[args.name]
    if args.command == "executor":
        return ExecutorSettings
    return CommonSettings


def setting_problems(cls: type[Settings], env: dict[str, str], tmp: Path) -> list[str]:
    """Names that are no setting of ``cls``, and values its settings refuse (a ``*_FILE`` variable is read
    from a stand-in file, as the part would read the mounted secret)."""
    problems, values = [], {}
    for key, raw in env.items():
        value = _REFERENCE.sub(SAMPLE_REFERENCE, str(raw))
        if key in OTEL_VARIABLES | CLI_VARIABLES | K8S_HELPERS:
            continue
        field = key.removeprefix("TETO_").lower()
        if not key.startswith("TETO_"):
            problems.append(f"{key}: neither a TETO_ setting nor a standard OTEL_ variable")
        elif field in cls.model_fields:
            values[key] = value
        elif field.endswith("_file") and field.removesuffix("_file") in cls.model_fields:
            stand_in = tmp / f"{field}.txt"
            stand_in.write_text("postgresql://part:secret@postgres:5432/teto\n")
            values[key] = str(stand_in)
        else:
            problems.append(f"{key}: not a setting of {cls.__name__}")
    try:
        cls.from_env(values)
    except Exception as exc:  # noqa: BLE001 - reported with the part's name by the caller
        problems.append(f"{cls.__name__} refuses the values: {exc}")
    return problems
