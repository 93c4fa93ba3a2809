"""Stateful HTTP fuzz: sequences of calls against the real gateway and the real queue, where each call may
carry hostile values, checked against a model of what the API promises.

A hypothesis state machine submits jobs (sometimes again under the same Idempotency-Key, sometimes with a
hostile field), reads, lists, cancels and requeues them in any order and as any role. After every call: no 5xx,
the status is one the OpenAPI document lists for that operation, and the answer agrees with the model (a
retried submit returns the same job, a cancelled job cannot be cancelled again or requeued, a job only the
submitter's own role may cancel stays as it was, a job once seen is always found). Bounded so the whole run
stays well under a minute on a loaded machine.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

from tests.integration.test_gateway import gateway
from tests.support.services import running

pytestmark = pytest.mark.integration

HOSTILE = ["\x00", "a.b", "x" * 300, 2**63, -1, 1e400, "NaN", None, [], {}]
ROLES = ["viewer", "submitter", "operator", "admin"]


def spec_values() -> st.SearchStrategy[dict[str, Any]]:
    """A job spec: mostly valid, with one field sometimes replaced by a hostile value."""
    valid = st.fixed_dictionaries({
        "name": st.text(alphabet="abcdefgh-_ ", max_size=20),
        "workload": st.just({"kind": "finetune", "params": {"steps": 10}}),
        "gpu_ceiling_seconds": st.floats(min_value=1, max_value=10_000),
        "max_attempts": st.integers(min_value=1, max_value=5),
    })
    spoil = st.tuples(st.sampled_from(["name", "workload", "gpu_ceiling_seconds", "max_attempts", "workers"]),
                      st.sampled_from(HOSTILE))
    return st.one_of(valid, valid, st.tuples(valid, spoil).map(lambda p: {**p[0], p[1][0]: p[1][1]}))


def _json(value: Any) -> bytes:
    """As a hostile client sends it: infinities as the non-JSON ``Infinity`` the server must refuse."""
    return json.dumps(value, allow_nan=True).encode()


class Api(RuleBasedStateMachine):
    """Calls go from hypothesis's thread to the test's event loop (``call``); the model is plain dicts."""

    jobs = Bundle("jobs")
    client: httpx.AsyncClient
    tokens: dict[str, str]  # role -> secret
    loop: asyncio.AbstractEventLoop
    doc: dict[str, Any]
    statuses: dict[int, int]

    def __init__(self) -> None:
        super().__init__()
        self.by_key: dict[tuple[str, str], str] = {}  # (role, Idempotency-Key) -> job id: keys are per actor
        self.owner: dict[str, str] = {}  # job id -> the role whose actor submitted it
        self.cancelled: set[str] = set()
        self.known: set[str] = set()

    def call(self, method: str, path: str, template: str, role: str = "admin", **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[role]}", **kw.pop("headers", {})}
        future = asyncio.run_coroutine_threadsafe(self.client.request(method, path, headers=headers, **kw), self.loop)
        resp = future.result(timeout=60)
        self.statuses[resp.status_code] = self.statuses.get(resp.status_code, 0) + 1
        op = self.doc["paths"][template][method.lower()]
        where = f"{method} {path} as {role}"
        assert resp.status_code < 500, f"{where} -> {resp.status_code} {resp.text[:300]}"
        assert str(resp.status_code) in op["responses"], f"{where} -> undocumented {resp.status_code}"
        return resp

    @initialize(target=jobs)
    def first(self) -> str:
        resp = self.call("POST", "/v1/jobs", "/v1/jobs", "submitter", json={"workload": {"kind": "finetune"}})
        assert resp.status_code in (201, 202), resp.text
        self.known.add(resp.json()["id"])
        self.owner[resp.json()["id"]] = "submitter"
        return resp.json()["id"]

    def sees(self, role: str, job: str) -> bool:
        """Tenant scoping: viewers and submitters see their own jobs only (operator and admin: read:all)."""
        return role in ("operator", "admin", "auditor") or self.owner.get(job) == role

    @rule(target=jobs, spec=spec_values(), key=st.one_of(st.none(), st.sampled_from(["k1", "k2", "k3"])),
          role=st.sampled_from(ROLES))
    def submit(self, spec: dict[str, Any], key: str | None, role: str) -> str:
        headers = {"Idempotency-Key": key} if key else {}
        resp = self.call("POST", "/v1/jobs", "/v1/jobs", role, content=_json(spec), headers=headers)
        if resp.status_code in (201, 202):
            job_id = resp.json().get("id") or resp.json().get("job_id")
            if key is not None and (role, key) in self.by_key:
                assert job_id == self.by_key[(role, key)], "a retried submit must name the same job"
            elif key is not None:
                assert job_id not in self.known, "another actor's key must not name their job"
                self.by_key[(role, key)] = job_id
            self.known.add(job_id)
            self.owner.setdefault(job_id, role)
            return job_id
        assert resp.status_code in (403, 409, 413, 422), resp.text
        if role == "viewer":
            assert resp.status_code in (403, 422)
        return next(iter(self.known))

    @rule(job=jobs, role=st.sampled_from(ROLES))
    def get(self, job: str, role: str) -> None:
        resp = self.call("GET", f"/v1/jobs/{job}", "/v1/jobs/{job_id}", role)
        if not self.sees(role, job):
            assert resp.status_code == 404, resp.text
            return
        assert resp.status_code == 200, resp.text
        if job in self.cancelled:
            assert resp.json()["state"] == "cancelled"

    @rule(job=jobs, role=st.sampled_from(ROLES))
    def cancel(self, job: str, role: str) -> None:
        resp = self.call("POST", f"/v1/jobs/{job}/cancel", "/v1/jobs/{job_id}/cancel", role)
        if role != "viewer" and not self.sees(role, job):
            assert resp.status_code == 404, resp.text
        elif job in self.cancelled:
            assert resp.status_code in (403, 409), resp.text
        elif resp.status_code == 200:
            assert resp.json()["state"] == "cancelled"
            self.cancelled.add(job)

    @rule(job=jobs, ceiling=st.one_of(st.floats(min_value=0, max_value=1e6), st.sampled_from(HOSTILE)))
    def requeue(self, job: str, ceiling: Any) -> None:
        resp = self.call("POST", f"/v1/jobs/{job}/requeue", "/v1/jobs/{job_id}/requeue", "operator",
                         content=_json({"gpu_ceiling_seconds": ceiling}))
        # No job here is ever interrupted: a requeue is refused (with the reason), never accepted.
        assert resp.status_code in (409, 422), resp.text

    @rule(state=st.one_of(st.sampled_from(["queued", "cancelled", "running"]), st.sampled_from(HOSTILE)),
          limit=st.one_of(st.integers(min_value=-5, max_value=2000), st.sampled_from(HOSTILE)))
    def list_jobs(self, state: Any, limit: Any) -> None:
        resp = self.call("GET", "/v1/jobs", "/v1/jobs", "viewer", params={"state": str(state), "limit": str(limit)})
        assert resp.status_code in (200, 422), resp.text

    @rule(job=jobs)
    def events(self, job: str) -> None:
        resp = self.call("GET", f"/v1/jobs/{job}/events", "/v1/jobs/{job_id}/events", "auditor")
        assert resp.status_code == 200 and resp.json()[0]["event"] == "submitted", resp.text

    @invariant()
    def no_cancelled_job_comes_back(self) -> None:
        for job in list(self.cancelled)[:3]:
            resp = self.call("GET", f"/v1/jobs/{job}", "/v1/jobs/{job_id}", "auditor")
            assert resp.json()["state"] == "cancelled"


async def test_sequences_of_calls_with_hostile_values_keep_every_promise(env):
    from services.budget.app import serve as budget_serve
    from services.budget.settings import BudgetSettings
    from services.queue.app import serve as queue_serve
    from services.queue.settings import QueueSettings

    async with running(queue_serve, env.settings(QueueSettings)), running(budget_serve, env.settings(BudgetSettings)):
        async with gateway(env, stand_in=False, timeout=10.0) as gw:
            doc = (await gw.client.get("/openapi.json")).json()

            class Run(Api):
                pass

            Run.client, Run.tokens, Run.loop, Run.doc = gw.client, gw.tokens, asyncio.get_running_loop(), doc
            Run.statuses = {}
            machine = Run.TestCase
            machine.settings = settings(max_examples=20, stateful_step_count=15, deadline=None, database=None,
                                        derandomize=True, suppress_health_check=list(HealthCheck))
            await asyncio.to_thread(machine().runTest)
            print(f"\nstateful HTTP fuzz: {sum(Run.statuses.values())} calls, statuses {dict(sorted(Run.statuses.items()))}")
            # It really ran sequences that were accepted, refused and invalid.
            assert sum(Run.statuses.values()) >= 40 and {200, 409, 422} <= set(Run.statuses), Run.statuses
            # The queue answered everything it was sent: a fresh submit still goes through at once.
            ok = await gw.client.post("/v1/jobs", json={"name": f"after-{uuid.uuid4().hex[:6]}",
                                                        "workload": {"kind": "finetune"}},
                                      headers=gw.as_("submitter"))
            assert ok.status_code == 201, ok.text
