"""Secret env values: sealing round-trips only for the job and name it was made for, tampering is refused,
redaction hides every shape, the gateway refuses what it cannot seal and the executor opens into the env only."""

from __future__ import annotations

import base64

import pytest

from agents.executor.secrets import SecretUnavailable, open_env
from libs.contracts.jobs import JobSpec
from libs.contracts.secrets import REDACTED, SealedValue, SecretValue, redact, redact_text
from libs.runtime.sealing import SealingError, load_key, new_key, open_sealed, seal, write_key_file
from services.gateway.secret_env import SecretRefused, has_secrets, seal_spec

pytestmark = pytest.mark.unit

KEY = load_key(new_key())
PLAIN = "hf_TOPSECRET_value_123"


def test_round_trip_for_its_job_and_name():
    token = seal(KEY, PLAIN, job_id="j1", name="HF_TOKEN")
    assert PLAIN not in token and token.startswith("v1.")
    assert open_sealed(KEY, token, job_id="j1", name="HF_TOKEN") == PLAIN
    assert seal(KEY, PLAIN, job_id="j1", name="HF_TOKEN") != token  # a fresh nonce each time


@pytest.mark.parametrize(("job_id", "name"), [("j2", "HF_TOKEN"), ("j1", "OTHER")], ids=["other job", "other name"])
def test_a_sealed_value_does_not_open_elsewhere(job_id, name):
    token = seal(KEY, PLAIN, job_id="j1", name="HF_TOKEN")
    with pytest.raises(SealingError, match="does not open"):
        open_sealed(KEY, token, job_id=job_id, name=name)


def test_tampering_and_another_key_are_refused():
    token = seal(KEY, PLAIN, job_id="j1", name="A")
    raw = bytearray(base64.urlsafe_b64decode(token[3:] + "=" * (-len(token[3:]) % 4)))
    raw[-1] ^= 1
    tampered = "v1." + base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")
    for bad, key in ((tampered, KEY), (token, load_key(new_key())), ("v1.AAAA", KEY), ("redacted", KEY)):
        with pytest.raises(SealingError) as err:
            open_sealed(key, bad, job_id="j1", name="A")
        assert PLAIN not in str(err.value)


def test_key_from_a_file_or_the_value_and_bad_keys_named(tmp_path):
    path = write_key_file(tmp_path / "k" / "secrets.key")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert load_key(str(path)) == load_key(path.read_text())
    before = path.read_text()
    write_key_file(path)
    assert path.read_text() == before  # an existing key is kept: sealed jobs must still open
    assert len(load_key(base64.b64encode(b"x" * 32).decode())) == 32  # standard alphabet too
    for bad, why in (("short", "bytes"), ("!!!", "not base64"), ("/no/such/file", "no key file")):
        with pytest.raises(SealingError, match=why):
            load_key(bad if bad != "short" else base64.b64encode(b"x" * 16).decode())


def test_redaction_covers_models_json_and_quoted_text():
    spec = {"workload": {"env": {"A": "plain", "B": {"secret": PLAIN}, "C": {"sealed": "v1.xyz"}}}}
    shown = redact(spec)
    assert shown["workload"]["env"] == {"A": "plain", "B": REDACTED, "C": REDACTED}
    assert spec["workload"]["env"]["B"] == {"secret": PLAIN}  # the input is untouched
    assert redact([SecretValue(secret=PLAIN)]) == [REDACTED]
    text = '{"env": {"B": {"secret": "' + PLAIN + '"}, "C": {"sealed": "v1.abc\\"d'
    assert PLAIN not in redact_text(text) and "v1.abc" not in redact_text(text)
    assert redact_text('{"secret_sauce": 1}') == '{"secret_sauce": 1}'


def _command(env):
    return JobSpec.model_validate({"workload": {"kind": "command", "command": ["true"], "env": env}})


def test_gateway_seals_secrets_keeps_plain_values_and_refuses_what_it_cannot_seal():
    spec = _command({"A": "plain", "B": {"secret": PLAIN}})
    assert has_secrets(spec) and not has_secrets(_command({"A": "x"}))
    sealed = seal_spec(spec, job_id="j1", key=KEY)
    env = sealed.workload.env
    assert env["A"] == "plain" and isinstance(env["B"], SealedValue) and PLAIN not in sealed.model_dump_json()
    with pytest.raises(SecretRefused, match="TETO_SECRETS_KEY"):
        seal_spec(spec, job_id="j1", key=None)
    with pytest.raises(SecretRefused, match="sealed value cannot be submitted"):
        seal_spec(_command({"B": {"sealed": "v1.forged"}}), job_id="j1", key=KEY)
    assert seal_spec(_command({"A": "x"}), job_id="j1", key=None).workload.env == {"A": "x"}


def test_executor_opens_secrets_into_the_env_and_refuses_what_does_not_open(tmp_path):
    key_path = write_key_file(tmp_path / "secrets.key")
    key = load_key(str(key_path))
    env = seal_spec(_command({"A": "plain", "B": {"secret": PLAIN}}), job_id="j1", key=key).workload.env
    assert open_env(env, job_id="j1", key_setting=str(key_path)) == {"A": "plain", "B": PLAIN}
    for job_id, setting, why in (("j2", str(key_path), "does not open"), ("j1", None, "no TETO_SECRETS_KEY")):
        with pytest.raises(SecretUnavailable, match=why) as err:
            open_env(env, job_id=job_id, key_setting=setting)
        assert PLAIN not in str(err.value)
    with pytest.raises(SecretUnavailable, match="unsealed"):
        open_env({"B": SecretValue(secret=PLAIN)}, job_id="j1", key_setting=str(key_path))


def test_teto_up_gives_the_key_to_the_gateway_and_executors_only(tmp_path):
    from teto.stack.secret_key import give_secrets_key, key_file
    from teto.stack.up import part_env

    own = {name: {} for name in ("audit", "budget", "health", "queue", "gateway", "executor")}
    setting = give_secrets_key(own, tmp_path, {})
    assert setting == str(key_file(tmp_path).resolve()) and len(load_key(setting)) == 32
    assert oct(key_file(tmp_path).parent.stat().st_mode & 0o777) == "0o700"
    shared = {"TETO_SECRETS_KEY": "leaked-from-the-shell"}
    for part in own:
        got = part_env(shared, own, part).get("TETO_SECRETS_KEY")
        assert got == (setting if part in ("gateway", "executor") else None), part
    assert give_secrets_key(own, tmp_path, {"TETO_SECRETS_KEY": "/mine"}) == "/mine"  # the operator's wins


def test_a_spec_without_secrets_leaves_the_gateway_as_it_came():
    """Only a spec whose secrets were encrypted is measured again against the bus's limit (ciphertext is larger):
    the largest plain body the gateway accepts must still be accepted."""
    from libs.contracts.jobs import JobSpec
    from services.gateway.secret_env import seal_spec

    spec = JobSpec.model_validate({"workload": {"kind": "command", "command": ["true"], "env": {"A": "plain"}}})
    assert seal_spec(spec, job_id="j1", key=None) is spec
    assert seal_spec(spec, job_id="j1", key=b"k" * 32) is spec
