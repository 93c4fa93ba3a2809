"""The checkpoint store in the deployments: the GPU node's compose override gives its executor settings it accepts
(and the secret key by file), the Kubernetes executors read it from env and the optional Secret that
`teto secrets k8s` makes from <secrets>/checkpoint-store/."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
import yaml

from agents.executor.settings import ExecutorSettings
from teto import k8s_secrets
from tests.support.deploycheck import setting_problems

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
EXAMPLE = {"TETO_CHECKPOINT_STORE_URL": "s3://teto-checkpoints/site-a", "TETO_CHECKPOINT_STORE_ENDPOINT":
           "https://minio.example:9000", "TETO_CHECKPOINT_STORE_ACCESS_KEY_ID": "teto"}


def _substituted(value: str) -> str:
    return re.sub(r"\$\{(\w+)(:[?-][^}]*)?\}", lambda m: EXAMPLE.get(m.group(1), ""), value)


def test_the_compose_override_gives_the_executor_a_store_it_accepts(tmp_path):
    override = yaml.safe_load((DEPLOY / "checkpoint-store.compose.yml").read_text())
    node = yaml.safe_load((DEPLOY / "gpu-node.compose.yml").read_text())
    env = {**node["services"]["executor"]["environment"], **override["services"]["executor"]["environment"]}
    env = {k: _substituted(str(v)) for k, v in env.items()}
    assert not setting_problems(ExecutorSettings, env, tmp_path)
    (secret,) = override["services"]["executor"]["secrets"]
    assert secret["target"] == env["TETO_CHECKPOINT_STORE_SECRET_ACCESS_KEY_FILE"]
    assert override["secrets"][secret["source"]]["file"] == "./secrets/checkpoint-store/secret_access_key"
    (tmp_path / "key").write_text("s3cr3t\n")
    settings = ExecutorSettings.from_env({**env, "TETO_CHECKPOINT_STORE_SECRET_ACCESS_KEY_FILE": str(tmp_path / "key"),
                                          "TETO_EXECUTOR_ID": "gpu-3"})
    assert settings.checkpoint_store_secret_access_key == "s3cr3t"
    assert "s3cr3t" not in repr(settings)


def test_k8s_executors_read_the_optional_secret_that_teto_secrets_k8s_makes(tmp_path):
    docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "executors.yaml").read_text()))
    (container,) = [d for d in docs if d and d["kind"] == "DaemonSet"][0]["spec"]["template"]["spec"]["containers"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e
            and "secretKeyRef" in e["valueFrom"]}
    assert {r["name"] for r in refs.values()} == {k8s_secrets.STORE_SECRET}
    assert all(r["optional"] for r in refs.values())  # without a store, no Secret needed
    assert k8s_secrets.store_secret(tmp_path, "teto") is None
    store = tmp_path / "checkpoint-store"
    store.mkdir()
    (store / "access_key_id").write_text("teto\n")
    with pytest.raises(k8s_secrets.MissingSecret):
        k8s_secrets.store_secret(tmp_path, "teto")
    (store / "secret_access_key").write_text("s3cr3t\n")
    made = k8s_secrets.store_secret(tmp_path, "teto")
    assert made["metadata"]["name"] == k8s_secrets.STORE_SECRET
    assert {r["key"] for r in refs.values()} == set(made["data"])
    assert base64.b64decode(made["data"]["secret_access_key"]) == b"s3cr3t"
