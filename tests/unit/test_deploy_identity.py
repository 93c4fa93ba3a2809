"""deploy/ carries the identity settings (issue 30): the gateway of compose and of Kubernetes reads its OpenID
Connect providers and claim mapping from a providers file, each provider's client secret from a private file
(a Kubernetes Secret made by `teto secrets k8s`, a directory `teto secrets deploy` makes for compose), and its
public address; it no longer needs a volume for the tokens file (tokens are in its PostgreSQL schema)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import yaml

from services.gateway.oidc import load_providers
from teto.cli import build_parser

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SECRETS_DIR = Path("/run/teto/oidc")  # where both deployments mount the client secrets
PROVIDERS_FILE = "/etc/teto/oidc/providers.json"


def _k8s() -> dict[tuple[str, str], dict]:
    docs = [d for p in sorted((DEPLOY / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def _gateway_pod() -> dict:
    return _k8s()[("Deployment", "teto-gateway")]["spec"]["template"]["spec"]


def test_the_example_mapping_parses_and_names_its_client_secret_where_the_deployments_mount_it():
    providers = load_providers(None, DEPLOY / "oidc" / "providers.example.json")
    assert providers, "the example names no provider"
    for name, provider in providers.items():
        assert provider.client_secret is None  # never inline in a file that is not secret
        assert provider.client_secret_file == SECRETS_DIR / name
        assert provider.roles and provider.issuer.startswith("https://")


def test_compose_gives_the_gateway_its_providers_its_client_secrets_and_no_tokens_volume(tmp_path):
    compose = yaml.safe_load((DEPLOY / "compose.yml").read_text())
    gateway = compose["services"]["gateway"]
    env = gateway["environment"]
    assert "TETO_TOKENS_FILE" not in env
    assert env["TETO_OIDC_PROVIDERS_FILE"] == PROVIDERS_FILE and env["TETO_PUBLIC_URL"].startswith("${TETO_PUBLIC_URL")
    mounts = {target: source for source, target, *_ in (v.split(":") for v in gateway["volumes"])}
    # Only its own database URL volume and read-only files: nothing the replicas would have to share.
    named = {s for s in mounts.values() if not s.startswith("./")}
    assert named == {"db-gateway"}, mounts
    assert "teto-data" not in compose["volumes"]
    assert load_providers(None, DEPLOY / Path(mounts[PROVIDERS_FILE])) == {}  # shipped: API tokens only
    assert mounts[str(SECRETS_DIR)] == "./secrets/oidc"
    others = {n for n, s in compose["services"].items() if n != "gateway"
              and any("oidc" in v for v in s.get("volumes", []) if isinstance(v, str))}
    assert not others, others
    out = tmp_path / "secrets"  # teto secrets deploy makes the client secrets' directory, private
    args = build_parser().parse_args(["secrets", "deploy", "--out", str(out), "--executor", "executor-1=node-1"])
    assert args.func(args) == 0
    assert (out / "oidc").is_dir() and (out / "oidc").stat().st_mode & 0o077 == 0


def test_kubernetes_gives_the_gateway_a_providers_configmap_and_a_client_secret_and_no_shared_claim():
    manifests = _k8s()
    assert ("PersistentVolumeClaim", "teto-gateway-data") not in manifests
    pod = _gateway_pod()
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert not any("persistentVolumeClaim" in v for v in volumes.values()), volumes
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "TETO_TOKENS_FILE" not in env and env["TETO_PUBLIC_URL"].startswith("https://")
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    providers_dir, providers_key = env["TETO_OIDC_PROVIDERS_FILE"].rsplit("/", 1)
    config = mounts[providers_dir]["configMap"]["name"]
    assert json.loads(manifests[("ConfigMap", config)]["data"][providers_key]) == []
    assert mounts[str(SECRETS_DIR)]["secret"]["secretName"] == "teto-oidc"
    holders = {n for (kind, n), d in manifests.items() if kind in ("Deployment", "DaemonSet", "Job")
               and any(v.get("secret", {}).get("secretName") == "teto-oidc" or v.get("configMap", {}).get("name")
                       == config for v in d["spec"]["template"]["spec"]["volumes"])}
    assert holders == {"teto-gateway"}


def _k8s_secrets(src: Path, out: Path) -> dict[str, dict]:
    parser = build_parser()
    args = parser.parse_args(["secrets", "deploy", "--out", str(src), "--executor", "gpu-1=gpu-1"])
    assert args.func(args) == 0
    for service in ("queue", "budget", "health", "audit", "gateway"):
        (src / "db" / service).mkdir(parents=True)
        (src / "db" / service / "database.url").write_text(f"postgresql://{service}:pw@postgresql:5432/teto\n")
    args = parser.parse_args(["secrets", "k8s", "--from", str(src), "--out", str(out)])
    assert args.func(args) == 0
    return {s["metadata"]["name"]: s for s in json.loads(out.read_text())["items"]}


def test_teto_secrets_k8s_makes_the_client_secrets_secret_from_the_oidc_directory(tmp_path):
    empty = _k8s_secrets(tmp_path / "a", tmp_path / "a.json")
    assert empty["teto-oidc"]["data"] == {}  # the gateway's mount exists before any provider is configured
    src = tmp_path / "b"
    src.mkdir()
    (src / "oidc").mkdir()
    (src / "oidc" / "hospital").write_text("s3cret-of-the-panel-client\n")
    (src / "oidc" / "entra").write_text("another")
    made = _k8s_secrets(src, tmp_path / "b.json")["teto-oidc"]["data"]
    assert {k: base64.b64decode(v).decode() for k, v in made.items()} == {
        "hospital": "s3cret-of-the-panel-client", "entra": "another"}
