"""The gateway refuses, on the real NATS and PostgreSQL, what the bus or the database could not take: a body
over the limit derived from the server's max payload (413 naming it), a token actor with control characters,
a query filter with a NUL, an out-of-range cursor or time (422 naming the field, never 503 or 500). The
largest body it accepts is published and consumed like any other."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from libs.contracts.jobs import JobEvent
from services.gateway import auth
from services.gateway.domain.payload import body_limit
from tests.integration.test_gateway import HEALTH_BUDGET_DDL, gateway

pytestmark = pytest.mark.integration


def _body_of(size: int) -> bytes:
    """A command-workload spec padded with argv content to exactly ``size`` bytes."""
    head = b'{"name":"big","workload":{"kind":"command","command":["python"'
    tail = b"]}}"
    room = size - len(head) - len(tail)
    parts, chunk = [], 131072  # the contract bounds one argument (the kernel's MAX_ARG_STRLEN)
    while room > 0:
        take = min(chunk, room - 3)  # ,"..."
        if take < 0:
            break
        parts.append(b',"' + b"x" * take + b'"')
        room -= take + 3
    body = head + b"".join(parts) + tail
    return body + b" " * (size - len(body))


async def test_the_body_limit_comes_from_the_bus_and_413_names_it(env):
    async with gateway(env, stand_in=False) as gw:
        limit = gw.client._transport.app.state.max_body_bytes  # type: ignore[attr-defined]
        assert limit == body_limit(gw.rt.nc.max_payload, 1 << 20) < gw.rt.nc.max_payload
        h = {**gw.as_("submitter"), "content-type": "application/json"}
        resp = await gw.client.post("/v1/jobs", content=_body_of(limit + 1), headers=h)
        assert resp.status_code == 413, resp.text
        assert resp.json()["limit_bytes"] == limit and str(limit) in resp.json()["reason"]


async def test_the_largest_accepted_body_travels_to_the_queue_and_back_as_an_event(env):
    queue_app = pytest.importorskip("services.queue.app")
    from services.queue.settings import QueueSettings

    ready = asyncio.Event()
    queue = asyncio.create_task(queue_app.serve(env.settings(QueueSettings), ready=ready))
    try:
        await asyncio.wait_for(ready.wait(), 30)
        async with gateway(env, stand_in=False, timeout=15.0) as gw:
            events = await gw.rt.nc.subscribe(gw.rt.subjects.job_all)
            limit = gw.client._transport.app.state.max_body_bytes  # type: ignore[attr-defined]
            body = _body_of(limit)
            assert len(body) == limit
            h = {**gw.as_("operator"), "content-type": "application/json"}  # a command workload: finetune:command
            resp = await gw.client.post("/v1/jobs", content=body, headers=h)
            assert resp.status_code == 201, resp.text[:500]
            job_id = resp.json()["id"]
            # The submitted event embeds the whole spec: it was published, so it fit the bus.
            while True:
                msg = await events.next_msg(timeout=15)
                event = JobEvent.decode(msg.data)
                if event.job_id == job_id and event.event == "submitted":
                    break
            assert len(msg.data) <= gw.rt.nc.max_payload
            assert event.detail["spec"]["workload"]["command"] == json.loads(body)["workload"]["command"]
    finally:
        queue.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await queue


@pytest.mark.parametrize("actor", ["ali\x00ce", "ali\x1bce", "a\nb", "", " ", "x" * 201, "ali\x80ce", "ali\x9bce",
                                   "ali\x9fce"])
async def test_a_token_actor_the_contracts_refuse_is_422_over_the_api_and_refused_by_the_cli_rule(env, actor):
    async with gateway(env, stand_in=False) as gw:
        resp = await gw.client.post("/v1/tokens", json={"actor": actor, "role": "submitter"}, headers=gw.as_("admin"))
        assert resp.status_code == 422, resp.text
        assert "body.actor" in resp.json()["reason"]
    with pytest.raises(ValueError, match="actor"):  # teto tokens create goes through the same rule
        auth.issue_token(env.data_dir / "tokens.json", actor, "submitter")


@pytest.mark.parametrize("name", ["job\x07", "job\x80", "job\x85", "job\x9b[2J", "job\x9f"])
async def test_a_job_name_with_a_c0_or_c1_control_character_is_422_naming_the_field(env, name):
    async with gateway(env, stand_in=False) as gw:
        resp = await gw.client.post("/v1/jobs", json={"name": name, "workload": {"kind": "finetune"}},
                                    headers=gw.as_("submitter"))
        assert resp.status_code == 422, resp.text
        assert "name" in resp.json()["reason"] and "control" in resp.json()["reason"]


async def test_a_token_file_actor_written_by_hand_that_the_contracts_refuse_gives_no_access(env):
    async with gateway(env, stand_in=False) as gw:
        path = gw.client._transport.app.state.tokens.path  # type: ignore[attr-defined]
        secret = auth.create_token(path, "fine", "submitter")
        data = json.loads(path.read_text())
        data["tokens"][-1]["actor"] = "bad\x00actor"
        path.write_text(json.dumps(data))
        resp = await gw.client.get("/v1/whoami", headers={"Authorization": f"Bearer {secret}"})
        assert resp.status_code == 401


@pytest.mark.parametrize(("path", "field"), [
    ("/v1/jobs?owner=a%00b", "query.owner"),
    ("/v1/jobs?limit=99999999999999999999999", "query.limit"),
    ("/v1/jobs/j1/events?after_seq=2147483648", "query.after_seq"),
    ("/v1/jobs/j1/events?after_seq=-1", "query.after_seq"),
    ("/v1/audit?actor=a%00b", "query.actor"),
    ("/v1/audit?job_id=a%00b", "query.job_id"),
    ("/v1/audit?kind=a%00", "query.kind"),
    ("/v1/audit?after_seq=9223372036854775808", "query.after_seq"),
    ("/v1/audit?since=0001-01-01T00:00:00%2B01:00", "query.since"),
    ("/v1/audit?until=9999-12-31T23:59:59-05:00", "query.until"),
])
async def test_bad_query_input_is_422_naming_the_field_never_503(env, path, field):
    async with gateway(env) as gw:
        await gw.rt.pool.execute(HEALTH_BUDGET_DDL)
        await gw.client.post("/v1/jobs", json={"workload": {"kind": "finetune"}}, headers={
            **gw.as_("submitter"), "Idempotency-Key": "j1"})
        resp = await gw.client.get(path, headers=gw.as_("admin"))
        assert resp.status_code == 422, resp.text
        assert field in resp.json()["reason"]


@pytest.mark.parametrize("path", ["/v1/jobs/a%00b", "/v1/jobs/a%00b/events", "/v1/health-checks/a%00b",
                                  "/v1/jobs/" + "x" * 129])
async def test_an_id_no_object_can_have_is_404_without_asking_the_database(env, path):
    async with gateway(env, stand_in=False) as gw:
        # The read model is not asked: the answer comes before it. (The pool stays open: authentication itself
        # looks the token up in the gateway's schema since tokens moved there, issue 30.)
        gw.client._transport.app.state.reads = _NotAsked()  # type: ignore[attr-defined]
        resp = await gw.client.get(path, headers=gw.as_("viewer"))
        assert resp.status_code == 404, resp.text


class _NotAsked:
    def __getattr__(self, name: str):
        raise AssertionError(f"the read model was asked ({name}) for an id no object can have")


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_a_json_body_is_read_as_json_whatever_its_content_type(env, content_type):
    # curl -d sends form-urlencoded: the body is still the job spec.
    async with gateway(env) as gw:
        headers = {**gw.as_("submitter"), **({"Content-Type": content_type} if content_type else {})}
        resp = await gw.client.post("/v1/jobs", content=b'{"name": "plain", "workload": {"kind": "finetune"}}',
                                    headers=headers)
        assert resp.status_code in (201, 202), resp.text
