"""Failed sign-ins and bad tokens (issue 26, item 6): the limiter's rule (domain/attempts.py) over its whole
space, then the gateway's edge with fakes and a clock the test moves: each failure is counted per source and per
actor, logged and audited (``authenticate`` / ``sign_in``, the CSRF-refused session's actor named) up to the
block, and a blocked source or actor is 429 with Retry-After without its token being looked at."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.gateway import auth
from services.gateway.api import create_app
from services.gateway.domain.attempts import Attempts, Limit, Scope
from services.gateway.settings import GatewaySettings
from tests.unit.test_auth import FakeReads

pytestmark = pytest.mark.unit

LIMITS = {Scope.SOURCE: Limit(3, window_seconds=60, block_seconds=30),
          Scope.ACTOR: Limit(2, window_seconds=60, block_seconds=30)}
SRC: tuple[Scope, str] = (Scope.SOURCE, "10.0.0.9")
ANN: tuple[Scope, str] = (Scope.ACTOR, "ann")


def test_the_last_allowed_failure_starts_the_block_and_only_those_are_recorded():
    attempts = Attempts(LIMITS)
    verdicts = [attempts.on_failure(SRC, now=float(t)) for t in range(3)]
    assert [(v.record, v.failures, v.blocked_for) for v in verdicts] == [(True, 1, None), (True, 2, None),
                                                                          (True, 3, 30)]
    assert attempts.blocked_for(SRC, now=3.0) == pytest.approx(29.0)
    assert attempts.on_failure(SRC, now=4.0).record is False  # while blocked: counted on the block, not recorded
    assert attempts.blocked_for(SRC, now=10.0) == pytest.approx(22.0)
    assert attempts.refused_while_blocked(SRC) == 2


def test_a_block_ends_on_its_own_and_the_count_starts_again():
    attempts = Attempts(LIMITS)
    for t in range(3):
        attempts.on_failure(SRC, now=float(t))
    assert attempts.blocked_for(SRC, now=32.0) is None
    assert attempts.on_failure(SRC, now=33.0).failures == 1


def test_failures_older_than_the_window_do_not_count():
    attempts = Attempts(LIMITS)
    attempts.on_failure(SRC, now=0.0)
    attempts.on_failure(SRC, now=1.0)
    later = attempts.on_failure(SRC, now=61.5)
    assert (later.failures, later.blocked_for) == (1, None)


@pytest.mark.parametrize(("key", "limit"), [(SRC, 3), (ANN, 2)], ids=["source", "actor"])
def test_each_scope_has_its_own_limit(key, limit):
    attempts = Attempts(LIMITS)
    verdicts = [attempts.on_failure(key, now=0.0) for _ in range(limit)]
    assert verdicts[-1].blocked_for == 30 and all(v.blocked_for is None for v in verdicts[:-1])


def test_keys_are_counted_apart():
    attempts = Attempts(LIMITS)
    for _ in range(3):
        attempts.on_failure(SRC, now=0.0)
    assert attempts.blocked_for((Scope.SOURCE, "10.0.0.10"), now=0.0) is None
    assert attempts.blocked_for((Scope.ACTOR, "10.0.0.9"), now=0.0) is None


def test_memory_is_bounded_and_blocked_keys_are_forgotten_last():
    attempts = Attempts(LIMITS, max_keys=4)
    for _ in range(3):
        attempts.on_failure(SRC, now=0.0)
    for i in range(10):
        attempts.on_failure((Scope.SOURCE, f"10.1.0.{i}"), now=1.0)
    assert len(attempts) == 4
    assert attempts.blocked_for(SRC, now=2.0) is not None


# -- the edge ----------------------------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.refused: list[tuple[str, str | None, str, dict[str, Any]]] = []

    async def refuse(self, kind: str, actor: str | None, reason: str, **kw: Any) -> str:
        self.refused.append((kind, actor, reason, kw.get("detail") or {}))
        return "x"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def gateway(tmp_path):
    settings = GatewaySettings.from_env(env={}, data_dir=tmp_path).model_copy(update={
        "auth_failures_per_source": 5, "auth_failures_per_actor": 3, "auth_block_seconds": 30.0})
    path = settings.effective_tokens_file
    secrets = {"ann": auth.create_token(path, "ann", "submitter"), "olga": auth.create_token(path, "olga", "operator")}
    old_id, old = auth.issue_token(path, "rita", "submitter")
    auth.revoke_token(path, old_id)
    secrets["rita-revoked"] = old
    secrets["rita"] = auth.create_token(path, "rita", "submitter")
    recorder, clock = Recorder(), Clock()
    app = create_app(settings, reads=FakeReads(), commands=recorder)
    app.state.monotonic = clock
    with TestClient(app, base_url="https://panel.test") as client:
        yield client, secrets, recorder, clock


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def test_bad_bearer_tokens_are_counted_audited_and_then_refused_unread(gateway):
    client, secrets, recorder, clock = gateway
    codes = [client.get("/v1/jobs", headers=bearer(f"teto_guess{i}")).status_code for i in range(12)]
    assert codes == [401] * 5 + [429] * 7
    assert [(k, a) for k, a, _, _ in recorder.refused] == [("authenticate", None)] * 5  # the block's, not each 429
    assert recorder.refused[-1][3]["blocked_seconds"] == {"source": 30.0}
    assert {d["source"] for *_, d in recorder.refused} == {"testclient"}
    assert recorder.refused[0][3]["failure"] == "unknown_token" and recorder.refused[0][3]["path"] == "/v1/jobs"
    answer = client.get("/v1/jobs", headers=bearer(secrets["ann"]))  # a valid token is not even looked at
    assert answer.status_code == 429 and int(answer.headers["Retry-After"]) == 30
    assert answer.json()["error"] == "too_many_attempts"
    clock.now += 31
    assert client.get("/v1/jobs", headers=bearer(secrets["ann"])).status_code == 200


def test_a_revoked_token_names_its_actor_and_blocks_that_actor(gateway):
    client, secrets, recorder, clock = gateway
    for _ in range(3):
        assert client.get("/v1/jobs", headers=bearer(secrets["rita-revoked"])).status_code == 401
    assert [(k, a, d["failure"]) for k, a, _, d in recorder.refused] == [("authenticate", "rita", "revoked_token")] * 3
    assert recorder.refused[-1][3]["blocked_seconds"] == {"actor": 30.0}
    assert client.get("/v1/jobs", headers=bearer(secrets["rita"])).status_code == 429  # rita, blocked
    assert client.get("/v1/jobs", headers=bearer(secrets["ann"])).status_code == 200  # the source is not


def sign_in(client: TestClient, secret: str) -> tuple[int, str]:
    form = client.get("/signin")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
    answer = client.post("/signin", data={"token": secret, "csrf": csrf, "next": "/jobs"}, follow_redirects=False)
    return answer.status_code, answer.text


def test_failed_sign_ins_are_counted_audited_and_then_refused_with_the_form(gateway):
    client, secrets, recorder, clock = gateway
    results = [sign_in(client, f"teto_wrong{i}") for i in range(7)]
    assert [code for code, _ in results] == [401] * 5 + [429] * 2
    assert "Too many failed sign-ins" in results[-1][1]
    assert [(k, d["failure"]) for k, _, _, d in recorder.refused] == [("sign_in", "sign_in")] * 5
    assert sign_in(client, secrets["ann"])[0] == 429  # the right token too, while the source is blocked
    clock.now += 31
    assert sign_in(client, secrets["ann"])[0] == 303


def test_a_csrf_refused_request_is_audited_under_its_sessions_actor(gateway):
    client, secrets, recorder, _ = gateway
    assert sign_in(client, secrets["ann"])[0] == 303
    answer = client.post("/v1/jobs/j1/cancel")  # the session cookie, no X-CSRF-Token
    assert answer.status_code == 403 and "CSRF" in answer.json()["reason"]
    ((kind, actor, reason, detail),) = recorder.refused
    assert (kind, actor, detail["failure"], detail["path"]) == ("authenticate", "ann", "csrf", "/v1/jobs/j1/cancel")
    assert "CSRF" in reason


def test_a_missing_token_is_not_a_failed_attempt(gateway):
    client, _, recorder, _ = gateway
    assert all(client.get("/v1/jobs").status_code == 401 for _ in range(10))
    assert recorder.refused == []
