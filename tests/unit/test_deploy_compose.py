"""deploy/compose.yml, checked without Docker: every command it runs is one the CLI accepts, every secret it mounts
is one `teto secrets deploy` writes, and each part is given only its own secrets (least privilege, as teto up)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from teto.cli import build_parser

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "compose.yml"
SERVICES = ("queue", "budget", "health", "audit", "gateway")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _teto_argv(service: dict) -> list[str] | None:
    """The teto arguments a service runs (the image's entrypoint is `teto`; a shell entrypoint ends in `exec teto`)."""
    entry = service.get("entrypoint")
    if entry:
        script = entry[-1]
        return shlex.split(script.rsplit("exec teto", 1)[1]) if "exec teto" in script else None
    if "build" in service:
        return list(service["command"])
    return None


def _secrets(service: dict) -> dict[str, str]:
    return {s["target"]: s["source"] for s in service.get("secrets", [])}


def test_every_command_the_deployment_runs_is_one_the_cli_accepts(compose):
    parser = build_parser()
    ran = {}
    for name, service in compose["services"].items():
        argv = _teto_argv(service)
        if argv is None:
            continue
        args = parser.parse_args(argv)  # exits (SystemExit) on an unknown command or option
        ran[name] = args.command
    assert {ran[s] for s in SERVICES} == {"service"}
    assert ran["bus-init"] == "bus" and ran["db-init"] == "db" and ran["db-secret"] == "db"
    assert [n for n, c in ran.items() if c == "executor"] == ["executor-1", "executor-2"]


def test_every_secret_mounted_is_one_teto_secrets_deploy_writes(compose, tmp_path):
    out = tmp_path / "secrets"
    args = build_parser().parse_args(["secrets", "deploy", "--out", str(out), "--executor", "executor-1=node-1",
                                      "--executor", "executor-2=node-2"])
    assert args.func(args) == 0
    for name, spec in compose["secrets"].items():
        relative = Path(spec["file"]).relative_to("secrets")
        assert (out / relative).is_file(), f"secret {name}: {spec['file']} is not written by teto secrets deploy"
    for mount in compose["services"]["nats"]["volumes"]:
        source = mount.split(":")[0]
        if source.startswith("./secrets/"):
            assert (out / Path(source).relative_to("secrets")).exists(), source
    conf = (out / "nats" / "nats.conf").read_text()
    for executor in ("executor-1", "executor-2"):
        assert f'"executor-{executor}"' in conf  # each executor is its own NATS user


def test_each_part_gets_only_its_own_secrets(compose):
    services = compose["services"]
    for name in SERVICES:
        mounted = _secrets(services[name])
        assert mounted["/run/teto/nats.json"] == f"nats-{name}", name
        env = services[name]["environment"]
        assert env["TETO_NATS_CREDENTIALS_FILE"] == "/run/teto/nats.json"
        assert env["TETO_NATS_URL"].startswith("tls://")
        assert env.get("TETO_DATABASE_URL_FILE") == "/run/teto/db/database.url"
        assert f"db-{name}:/run/teto/db:ro" in services[name]["volumes"]
        assert not any(v.startswith("db-") and not v.startswith(f"db-{name}:") for v in services[name]["volumes"])
    for name in ("executor-1", "executor-2"):
        mounted, env = _secrets(services[name]), services[name]["environment"]
        assert mounted["/run/teto/nats.json"] == f"nats-{name}"
        assert "TETO_DATABASE_URL" not in env and "TETO_DATABASE_URL_FILE" not in env  # executors: no database
        assert not any(v.startswith("db-") for v in services[name].get("volumes", []))
        assert env["TETO_WORKLOAD_UID_RANGE"]
    holders = {n for n, s in services.items() if "secrets-key" in _secrets(s).values()}
    assert holders == {"gateway", "executor-1", "executor-2"}
    assert {n for n, s in services.items() if "gateway-key" in _secrets(s).values()} == {"gateway"}
    assert {n for n, s in services.items() if "nats-admin" in _secrets(s).values()} == {"bus-init"}
    assert {n for n, s in services.items() if any("audit-key" in v for v in s.get("volumes", []))} == {"audit"}
    gateway = services["gateway"]["environment"]
    assert gateway["TETO_TLS_CERT_FILE"] and gateway["TETO_TLS_KEY_FILE"]  # tokens never in clear text
