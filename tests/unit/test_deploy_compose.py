"""deploy/compose.yml, checked without Docker: every command it runs is one the CLI accepts, every variable it sets
is a setting of the part that reads it (with a value the part accepts), every secret it mounts is one `teto secrets
deploy` writes, each part is given only its own secrets (least privilege, as teto up), and the topology is the
clustered one: three NATS nodes routing to each other, streams declared R3, two replicas of every service.
With Docker on the machine, `docker compose config` accepts the file too."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from teto.cli import build_parser
from tests.support.deploycheck import parse, setting_problems, settings_class

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "compose.yml"
SERVICES = ("queue", "budget", "health", "audit", "gateway")
NATS_NODES = ("nats-1", "nats-2", "nats-3")


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
    for node in NATS_NODES:
        for mount in compose["services"][node]["volumes"]:
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


def test_every_variable_set_is_a_setting_the_part_accepts(compose, tmp_path):
    checked = set()
    for name, service in compose["services"].items():
        argv = _teto_argv(service)
        if argv is None:
            continue
        problems = setting_problems(settings_class(parse(argv)), service.get("environment", {}), tmp_path)
        assert not problems, f"{name}: {problems}"
        checked.add(name)
    assert {*SERVICES, "executor-1", "executor-2", "bus-init"} <= checked


def test_three_nats_nodes_each_with_its_own_config_routing_to_the_others(compose, tmp_path):
    services = compose["services"]
    assert [n for n in services if n.startswith("nats")] == list(NATS_NODES)
    out = tmp_path / "secrets"
    args = build_parser().parse_args(["secrets", "deploy", "--out", str(out)])
    assert args.func(args) == 0
    configs, stores = {}, set()
    for node in NATS_NODES:
        mounts = dict(m.split(":")[:2] for m in services[node]["volumes"])
        conf_source = next(src for src, dst in mounts.items() if dst == "/etc/nats/nats.conf")
        assert conf_source == f"./secrets/nats/nodes/{node}.conf"
        configs[node] = json.loads((out / Path(conf_source).relative_to("secrets")).read_text())
        stores.add(next(src for src, dst in mounts.items() if dst == "/data"))
        assert "-js" in services[node]["command"] and services[node]["command"][services[node]["command"].index("-c") + 1] == "/etc/nats/nats.conf"
    assert len(stores) == 3  # each node its own JetStream store
    for node, conf in configs.items():
        assert conf["server_name"] == node
        routed = {r.rsplit("@", 1)[1].split(":")[0] for r in conf["cluster"]["routes"]}
        assert routed == set(NATS_NODES) - {node}
        assert conf["cluster"]["tls"] and conf["tls"]  # routes and clients over TLS
    # The parts know all three servers (a client reconnects to another when its server goes).
    for name in (*SERVICES, "executor-1", "bus-init"):
        urls = services[name]["environment"]["TETO_NATS_URL"].split(",")
        assert sorted(u.split("//")[1].split(":")[0] for u in urls) == list(NATS_NODES), name
    assert parse(services["bus-init"]["command"]).replicas == 3  # every stream R3
    for node in NATS_NODES:
        assert services["bus-init"]["depends_on"][node] == {"condition": "service_healthy"}


def test_two_replicas_of_every_service(compose):
    services = compose["services"]
    for name in SERVICES:
        assert services[name]["deploy"]["replicas"] == 2, name
    # Two gateways cannot share one host port: one each.
    (ports,) = services["gateway"]["ports"]
    host, container = ports.split(":")
    first, last = (int(p) for p in host.split("-"))
    assert last - first + 1 == 2 and container == "8443"


def _compose_cli() -> list[str] | None:
    """``docker compose`` (v2), else a standalone ``docker-compose``; None when neither is here."""
    for argv in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(argv[0]) is None:
            continue
        try:
            if subprocess.run([*argv, "version"], capture_output=True, timeout=30).returncode == 0:
                return argv
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


@pytest.mark.skipif(_compose_cli() is None, reason="no Docker Compose on this machine (docker compose config)")
@pytest.mark.parametrize("name", ["compose.yml", "gpu-node.compose.yml"])
def test_docker_compose_accepts_the_file(name, tmp_path):
    """Checked in a copy of deploy/ with a fresh secrets directory (compose resolves the secret files)."""
    deploy = tmp_path / "deploy"
    shutil.copytree(COMPOSE.parent, deploy, ignore=shutil.ignore_patterns("secrets"))
    args = build_parser().parse_args(["secrets", "deploy", "--out", str(deploy / "secrets"), "--executor",
                                      "executor-1=node-1", "--executor", "executor-2=node-2", "--executor", "gpu-3"])
    assert args.func(args) == 0
    env = {**os.environ, "TETO_EXECUTOR_ID": "gpu-3", "TETO_NATS_URL": "tls://nats-1:4222"}
    done = subprocess.run([*_compose_cli(), "-f", str(deploy / name), "config", "--quiet"], capture_output=True,
                          text=True, timeout=120, env=env, cwd=deploy)
    assert done.returncode == 0, done.stderr


def test_the_settings_check_refuses_unknown_names_and_refused_values(tmp_path):
    from services.queue.settings import QueueSettings

    assert setting_problems(QueueSettings, {"TETO_LEASE_SECONDS": "180"}, tmp_path) == []
    assert setting_problems(QueueSettings, {"TETO_TOKENS_FILE": "/data/t.json"}, tmp_path) == [
        "TETO_TOKENS_FILE: not a setting of QueueSettings"]
    assert setting_problems(QueueSettings, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, tmp_path) == []
    assert setting_problems(QueueSettings, {"NATS_URL": "x"}, tmp_path)
    (refused,) = setting_problems(QueueSettings, {"TETO_LEASE_SECONDS": "10", "TETO_HEARTBEAT_SECONDS": "30"}, tmp_path)
    assert "refuses" in refused


def test_a_gpu_node_runs_its_executor_with_the_nvidia_runtime_and_its_own_credentials(tmp_path):
    node = yaml.safe_load((COMPOSE.parent / "gpu-node.compose.yml").read_text())
    (executor,) = node["services"].values()
    args = parse(executor["command"])
    assert args.command == "executor"
    assert not setting_problems(settings_class(args), executor["environment"], tmp_path)
    (devices,) = executor["deploy"]["resources"]["reservations"]["devices"]
    assert devices["driver"] == "nvidia" and devices["capabilities"] == ["gpu"]
    assert "TETO_DATABASE_URL_FILE" not in executor["environment"]  # executors: no database
    # Its credentials are the file `teto secrets deploy --executor ID=ID` writes for that id.
    out = tmp_path / "secrets"
    made = build_parser().parse_args(["secrets", "deploy", "--out", str(out), "--executor", "gpu-3=gpu-3"])
    assert made.func(made) == 0
    for name, spec in node["secrets"].items():
        path = spec["file"].replace("${TETO_EXECUTOR_ID:?set TETO_EXECUTOR_ID}", "gpu-3")
        assert (out / Path(path).relative_to("secrets")).is_file(), name
    assert {s["source"]: s["target"] for s in executor["secrets"]}["nats-executor"] == \
        executor["environment"]["TETO_NATS_CREDENTIALS_FILE"]
