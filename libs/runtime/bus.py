"""NATS and JetStream at the edges: connect with retries, declare the streams, publish with a message id.

JetStream de-duplicates on the ``Nats-Msg-Id`` header within the stream's duplicate window, which is what
makes the outbox relay's "publish, then mark published" safe to repeat after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError, ServiceUnavailableError
from opentelemetry.trace import SpanKind

from libs.contracts.envelope import Envelope
from libs.contracts.subjects import Subjects

from . import natsauth, tracing

log = logging.getLogger(__name__)

DUPLICATE_WINDOW_SECONDS = 120.0


@dataclass(frozen=True)
class Credentials:
    """What one part presents to NATS: its user, password and inbox prefix (replies to it travel only there),
    and for TLS the CA that signs the server's certificate. Read from a 0600 JSON file, never from the
    environment, so that a child process's ``/proc/<pid>/environ`` holds no secret."""

    user: str
    password: str
    inbox_prefix: str | None = None
    ca_file: str | None = None

    @classmethod
    def load(cls, path: Path | str) -> Credentials:
        try:
            data = json.loads(Path(path).read_text())
            return cls(user=str(data["user"]), password=str(data["password"]),
                       inbox_prefix=data.get("inbox_prefix") or None, ca_file=data.get("ca_file") or None)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConnectionError(f"cannot read NATS credentials from {path}: {exc!r}") from None

    def options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"user": self.user, "password": self.password}
        if self.inbox_prefix:
            opts["inbox_prefix"] = self.inbox_prefix
        if self.ca_file:
            opts["tls"] = ssl.create_default_context(cafile=self.ca_file)
        return opts


async def _report_error(exc: Exception) -> None:
    """A refused publish or subscribe (permissions violation) comes back only here: make it visible."""
    if "permissions violation" in str(exc).lower():
        log.error("NATS refused: %s", exc)
    else:
        log.warning("NATS error: %r", exc)


class _Client(Client):
    """nats-py's client, made connected when the server's post-CONNECT INFO arrives before its PONG.

    nats-py 2.16 reads exactly one line after its connect PING and counts the connection made only if it is
    the PONG. nats-server 2.15 follows a CONNECT with an INFO (``connect_info``); when the CONNECT and the PING
    reach the server in two reads (a loaded machine: the password check alone takes seconds), that INFO comes
    first, and the client stays "connecting" for good: its flusher stops at once and no subscription, publish
    or request is ever sent. The server took the CONNECT (it answers a refused one with -ERR, which the read
    loop handles), so the connection is marked made here, before the flusher first looks
    (tests/integration/test_bus_connect_info.py; docs/reliability.md). Reconnections are marked by nats-py.
    """

    async def _process_connect_init(self) -> None:
        await super()._process_connect_init()
        if self._status == Client.CONNECTING:
            self._status = Client.CONNECTED
            if self._flusher_task is None or self._flusher_task.done():
                self._flusher_task = asyncio.get_running_loop().create_task(self._flusher())


async def connect(url: str, name: str, *, credentials_file: Path | str | None = None, connect_timeout: float = 5.0,
                  attempts: int = 30) -> Client:
    """Connect, retrying the first connection (services may start before the server is ready). With a
    credentials file, connect as that part's NATS user (libs/runtime/natsauth.py); without, anonymously."""
    creds = Credentials.load(credentials_file).options() if credentials_file else {}
    last: Exception | None = None
    for _ in range(attempts):
        try:
            nc = _Client()
            await nc.connect(
                servers=[u.strip() for u in url.split(",")],
                name=name,
                connect_timeout=connect_timeout,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                allow_reconnect=True,
                # A close must not hang on a pull subscription left open (the default drain waits 30 s).
                drain_timeout=5,
                error_cb=_report_error,
                **creds,
            )
            try:
                await nc.flush(timeout=connect_timeout)  # a round trip: the server took the CONNECT
            except BaseException:
                with contextlib.suppress(Exception):
                    await nc.close()
                raise
            return nc
        except Exception as exc:  # noqa: BLE001 - any failure to connect is retried, then reported
            last = exc
            await asyncio.sleep(0.5)
    raise ConnectionError(f"cannot connect to NATS at {url}: {last}")


# While a NATS cluster elects a stream's leader (a member lost, or all starting together), JetStream API calls time
# out or find no responder for some seconds (about 10 s measured, shared/PLATFORM.md): asked again, not fatal.
TRANSIENT_JS_ERRORS = (nats.errors.TimeoutError, nats.errors.NoRespondersError, ServiceUnavailableError,
                       asyncio.TimeoutError)


async def check_streams(js: JetStreamContext, names: list[str], *, patience: float = 90.0,
                        every: float = 1.0) -> None:
    """Under least privilege only the admin declares streams (``teto up``, ``teto secrets``' deployment does it
    once); a part only checks that the ones it uses exist, and says which is missing. A call that gets no answer
    (a leader election) is asked again for up to ``patience`` seconds."""
    deadline = asyncio.get_running_loop().time() + patience
    for name in names:
        while True:
            try:
                await js.stream_info(name)
                break
            except NotFoundError:
                raise RuntimeError(f"stream {name} does not exist: declare the streams as the NATS admin first "
                                   "(teto up does; see docs/security/bus.md)") from None
            except TRANSIENT_JS_ERRORS as exc:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                log.warning("stream %s: no answer yet (%r); asking again", name, exc)
                await asyncio.sleep(every)


async def prepare_streams(js: JetStreamContext, subjects: Subjects, *, authenticated: bool,
                          role: str, executor_id: str | None = None, node_id: str | None = None,
                          replicas: int = 1) -> None:
    """Declare the streams (with ``replicas``) when connected anonymously (a development server, the test
    fixtures); with a part's own credentials only check the ones that part uses (it may not declare them)."""
    if not authenticated:
        await ensure_streams(js, subjects, replicas=replicas)
        return
    perms = natsauth.permissions(role, subjects.prefix, executor_id=executor_id, node_id=node_id)
    await check_streams(js, natsauth.checked_streams(perms))


async def ensure_streams(js: JetStreamContext, subjects: Subjects, *, replicas: int = 1) -> None:
    """Create or update every Teto stream (idempotent; run by every service at start). ``replicas`` is the
    stream's replication on a NATS cluster (``stream_replicas``); an update may raise or lower it."""
    for spec in subjects.streams():
        config = StreamConfig(
            name=spec.name,
            subjects=list(spec.subjects),
            description=spec.description,
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            discard=DiscardPolicy.OLD,
            max_age=spec.max_age_seconds,
            max_msgs=spec.max_msgs if spec.max_msgs is not None else -1,
            max_msgs_per_subject=spec.max_msgs_per_subject if spec.max_msgs_per_subject is not None else -1,
            duplicate_window=DUPLICATE_WINDOW_SECONDS,
            num_replicas=replicas,
            deny_delete=spec.deny_delete,
            deny_purge=spec.deny_purge,
        )
        try:
            await js.add_stream(config)
        except BadRequestError:
            await js.update_stream(config)
    await refilter_durables(js, subjects)


async def refilter_durables(js: JetStreamContext, subjects: Subjects) -> None:
    """Point the services' durables at their current filter subject. A part binds an existing durable as it is
    (nats-py does not update it), so a durable made before a subject changed (``teto.progress.<job>`` became
    ``teto.progress.<job>.<executor>``) would silently match nothing; the declarer of the streams fixes them."""
    for role in natsauth.SERVICES:
        for durable in natsauth.durables(role, subjects):
            stream = subjects.stream_name(durable.stream)
            try:
                info = await js.consumer_info(stream, durable.name)
            except NotFoundError:
                continue
            if info.config.filter_subject not in (None, durable.filter):
                log.warning("durable %s on %s: filter %s -> %s", durable.name, stream, info.config.filter_subject,
                            durable.filter)
                await js.add_consumer(stream, config=info.config.evolve(filter_subject=durable.filter))


def trace_headers(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The current trace context (W3C ``traceparent``) as NATS headers, with ``extra``."""
    headers = tracing.carrier()
    if extra:
        headers.update(extra)
    return headers


async def publish(js: JetStreamContext, subject: str, msg: Envelope | bytes, *, msg_id: str | None = None,
                  timeout: float = 15.0) -> None:
    """Publish to a stream and wait for the server's ack; the message id de-duplicates retries."""
    data = msg.encode() if isinstance(msg, Envelope) else msg
    if msg_id is None and isinstance(msg, Envelope):
        msg_id = msg.id
    # Named by the subject's family (cmd, job, agent...): full subjects hold ids, and span names must stay few.
    family = subject.split(".")[1] if subject.count(".") else subject
    with tracing.child(f"publish {family}", kind=SpanKind.PRODUCER, **{"messaging.system": "nats",
                                                                       "messaging.destination.name": subject}):
        headers = trace_headers({"Nats-Msg-Id": msg_id} if msg_id else None)
        await js.publish(subject, data, headers=headers, timeout=timeout)
