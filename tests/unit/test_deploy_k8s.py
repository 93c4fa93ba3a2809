"""deploy/k8s/, checked without a cluster: every manifest validates against the Kubernetes schemas (strict: an
unknown field is an error), every container runs a command the CLI accepts with variables that are settings of
that part, the topology is the one promised (each service a Deployment of two replicas with a disruption budget,
the gateway behind a Service, executors a DaemonSet on GPU nodes requesting ``nvidia.com/gpu``), and every
Secret a pod mounts is one `teto secrets k8s` makes, with the keys the pod reads, mounted only where it belongs."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from libs.runtime import natsauth
from teto.cli import build_parser
from tests.support.deploycheck import parse, setting_problems, settings_class

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
KUBERNETES = "1.37.0"
SERVICES = natsauth.SERVICES


def _documents() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


@pytest.fixture(scope="module")
def manifests() -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for _, d in _documents()}


def _pod(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def _workloads(manifests) -> dict[str, dict]:
    return {name: d for (kind, name), d in manifests.items() if kind in ("Deployment", "DaemonSet", "Job")}


def _env(container: dict, manifests) -> dict[str, str]:
    env = {}
    for source in container.get("envFrom", []):
        env.update(manifests[("ConfigMap", source["configMapRef"]["name"])]["data"])
    for item in container.get("env", []):
        env[item["name"]] = item.get("value", "$(FROM_API)")
    return env


@pytest.mark.parametrize("where,doc", _documents(), ids=lambda v: v if isinstance(v, str) else v["metadata"]["name"])
def test_each_manifest_is_valid_against_the_kubernetes_schemas(where, doc):
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)  # raises, naming the field, when it is not


def test_the_validator_refuses_a_wrong_manifest():
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
           "spec": {"replicas": "two", "selector": {}, "template": {}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES, strict=True)


def test_every_container_runs_a_cli_command_with_real_settings(manifests, tmp_path):
    ran = {}
    for name, workload in _workloads(manifests).items():
        for container in _pod(workload)["containers"]:
            args = parse(container["args"])  # SystemExit on an unknown command or option
            env = {k: v for k, v in _env(container, manifests).items() if v != "$(FROM_API)"}
            problems = setting_problems(settings_class(args), env, tmp_path)
            assert not problems, f"{name}: {problems}"
            ran[name] = args
    assert {ran[f"teto-{s}"].name for s in SERVICES} == set(SERVICES)
    assert ran["teto-executor"].command == "executor" and ran["teto-bus-init"].replicas == 3


def test_services_are_deployments_of_two_replicas_that_roll_one_at_a_time(manifests):
    for service in SERVICES:
        deployment = manifests[("Deployment", f"teto-{service}")]
        assert deployment["spec"]["replicas"] == 2
        assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
        budget = manifests[("PodDisruptionBudget", f"teto-{service}")]
        assert budget["spec"]["minAvailable"] == 1
        assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    gateway = manifests[("Service", "teto-gateway")]
    pod_labels = manifests[("Deployment", "teto-gateway")]["spec"]["template"]["metadata"]["labels"]
    assert gateway["spec"]["selector"].items() <= pod_labels.items()
    ports = _pod(manifests[("Deployment", "teto-gateway")])["containers"][0]["ports"]
    assert gateway["spec"]["ports"][0]["targetPort"] in {p["name"] for p in ports}


def test_executors_are_a_daemonset_on_gpu_nodes_holding_their_gpus(manifests):
    executor = manifests[("DaemonSet", "teto-executor")]
    pod = _pod(executor)
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "$(NODE_NAME)" in env["TETO_NATS_CREDENTIALS_FILE"]["value"]  # each executor its own NATS user
    assert "TETO_DATABASE_URL_FILE" not in env  # executors have no database
    assert env["TETO_WORKLOAD_UID_RANGE"]["value"]


def test_nats_and_postgres_are_external_with_documented_values(manifests):
    assert not any(kind in ("StatefulSet",) for kind, _ in manifests)  # their upstream charts run them
    url = manifests[("ConfigMap", "teto-config")]["data"]["TETO_NATS_URL"]
    assert url.startswith("tls://nats.teto.svc")
    for values in ("nats-values.yaml", "postgresql-values.yaml"):
        assert yaml.safe_load((K8S / "external" / values).read_text())
    nats = yaml.safe_load((K8S / "external" / "nats-values.yaml").read_text())
    assert nats["config"]["cluster"]["replicas"] == 3 and nats["config"]["jetstream"]["enabled"]


@pytest.fixture(scope="module")
def made_secrets(tmp_path_factory) -> dict[str, dict]:
    """What `teto secrets deploy` + `teto db provision` (its URL files) + `teto secrets k8s` produce."""
    root = tmp_path_factory.mktemp("k8s-secrets")
    src, out = root / "secrets", root / "k8s.json"
    parser = build_parser()
    args = parser.parse_args(["secrets", "deploy", "--out", str(src), "--executor", "gpu-node-1=gpu-node-1",
                              "--nats-host", "nats.teto.svc.cluster.local"])
    assert args.func(args) == 0
    args = parser.parse_args(["secrets", "k8s", "--from", str(src), "--out", str(out)])
    assert args.func(args) == 2  # the database URLs are not there yet: refused, naming teto db provision
    for service in SERVICES:  # what teto db provision --out <src>/db writes
        (src / "db" / service).mkdir(parents=True)
        (src / "db" / service / "database.url").write_text(f"postgresql://{service}:pw@postgresql:5432/teto\n")
    assert args.func(args) == 0
    assert out.stat().st_mode & 0o077 == 0
    listed = json.loads(out.read_text())
    assert listed["kind"] == "List"
    for item in listed["items"]:
        kubernetes_validate.validate(item, KUBERNETES, strict=True)
    return {s["metadata"]["name"]: s for s in listed["items"]}


def _secret_mounts(pod: dict) -> dict[str, tuple[str, set[str]]]:
    """volume name -> (secret name, keys the containers read from it: subPath, or every key when mounted whole)."""
    volumes = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    found: dict[str, tuple[str, set[str]]] = {}
    for container in pod["containers"]:
        for mount in container.get("volumeMounts", []):
            if mount["name"] in volumes:
                keys = found.setdefault(mount["name"], (volumes[mount["name"]], set()))[1]
                keys.add(mount.get("subPath", "*"))
    return found


def test_every_secret_mounted_is_made_by_teto_secrets_k8s_with_the_keys_read(manifests, made_secrets):
    for name, workload in _workloads(manifests).items():
        for secret_name, keys in _secret_mounts(_pod(workload)).values():
            assert secret_name in made_secrets, f"{name} mounts {secret_name}, which teto secrets k8s does not make"
            data = made_secrets[secret_name]["data"]
            assert all(k == "*" or k in data for k in keys), (name, secret_name, keys, sorted(data))
    assert "executor-gpu-node-1.json" in made_secrets["teto-nats-executors"]["data"]
    auth = json.loads(base64.b64decode(made_secrets["teto-nats-auth"]["data"]["auth.conf"]))
    assert {u["user"] for u in auth["authorization"]["users"]} >= {*SERVICES, "admin", "executor-gpu-node-1"}


def test_each_pod_gets_only_its_own_secrets(manifests):
    holders: dict[str, set[str]] = {}
    for name, workload in _workloads(manifests).items():
        for secret_name, _ in _secret_mounts(_pod(workload)).values():
            holders.setdefault(secret_name, set()).add(name)
    for service in SERVICES:
        assert holders[f"teto-nats-{service}"] == {f"teto-{service}"}
        assert holders[f"teto-db-{service}"] == {f"teto-{service}"}
    assert holders["teto-nats-admin"] == {"teto-bus-init"}
    assert holders["teto-secrets-key"] == {"teto-gateway", "teto-executor"}
    assert holders["teto-gateway-tls"] == {"teto-gateway"}
    assert holders["teto-audit-key"] == {"teto-audit"}
    assert holders["teto-nats-executors"] == {"teto-executor"}
