"""``teto up``: the whole stack on one machine, as separate processes.

Starts embedded NATS (JetStream) and PostgreSQL under ``--data-dir`` unless ``TETO_NATS_URL`` /
``TETO_DATABASE_URL`` point elsewhere, applies every service's migrations and declares the streams, starts the
five services and N executor agents, makes a local admin token, writes ``<data-dir>/stack.json`` and, with
``--demo``, submits the demo fine-tune and follows it. Ctrl-C stops everything in order; running it again on the
same data directory comes back with every job and event where it was.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

from libs.runtime.dbroles import redact_url
from libs.runtime.ports import port_is_free
from teto.stack import isolation as jobs_isolation
from teto.stack import busauth, cluster, seaweed
from teto.stack.identities import Identities
from teto.stack.demo import follow_demo
from teto.stack.observe import MetricsPorts
from teto.stack.provisioner import executor_parts, provisioner_command, replace_nodes
from teto.stack.servers import PostgresWatch
from teto.stack.supervisor import Part, Supervisor

log = logging.getLogger("teto.up")

SERVICE_ORDER = ["audit", "budget", "health", "queue", "gateway"]  # consumers of commands first, gateway last


@dataclass
class UpOptions:
    data_dir: Path
    http_port: int = 8080
    executors: int = 2
    group: str = "local"
    demo: bool = False
    exit_after_demo: bool = False
    lease_seconds: float | None = None
    heartbeat_seconds: float | None = None
    log_level: str = "INFO"
    demo_spec: dict | None = None
    nats_cluster: int = 1  # embedded NATS members (3: a cluster with R3 streams; teto/stack/cluster.py)
    replicas: int = 1  # processes of each service
    checkpoint_store: str | None = None  # "s3": a store (embedded SeaweedFS unless configured); docs/checkpoint-store.md


class _Stop(Exception):
    pass


def _prepare_schema(nats_url: str, database_url: str, prefix: str, *, migrate: bool = True,
                    nats_credentials: Path | None = None, stream_replicas: int = 1) -> None:
    """Apply every service's migrations (unless done already, as the owners) and declare the streams (as the
    bus's admin) before anything starts."""
    from libs.contracts.subjects import Subjects
    from libs.runtime import bus, db

    async def go() -> None:
        if migrate:
            pool = await db.create_pool(database_url, max_size=2)
            try:
                for name in SERVICE_ORDER:
                    await db.migrate(pool, name, f"services.{name}")
            finally:
                await db.close_pool(pool)
        nc = await bus.connect(nats_url, "teto-up", credentials_file=nats_credentials)
        try:
            await bus.ensure_streams(nc.jetstream(), Subjects(prefix), replicas=stream_replicas)
        finally:
            await nc.close()

    asyncio.run(go())


def _admin_token(data_dir: Path, tokens_file: Path, database_url: str | None = None) -> str:
    """Reuse the local admin token of an earlier run while it is still valid (in the tokens file, and in the
    gateway's database, where an admin may have revoked it through the API since); otherwise make one."""
    from services.gateway.auth import Role, TokenStore, create_token

    stack = data_dir / "stack.json"
    if stack.exists() and tokens_file.exists():
        secret = json.loads(stack.read_text()).get("admin_token")
        found = TokenStore(tokens_file).authenticate(secret) if secret else None
        if found is not None and found.role is Role.ADMIN and not _ended_in_database(database_url, secret):
            return secret
    return create_token(tokens_file, "local-admin", "admin")


def _ended_in_database(database_url: str | None, secret: str) -> bool:
    """Whether the gateway's database holds this token revoked or expired (tokens live there, issue 30)."""
    if not database_url:
        return False
    import asyncpg

    from services.gateway.auth import hash_secret

    async def ask() -> bool:
        conn = await asyncpg.connect(database_url)
        try:
            return bool(await conn.fetchval(
                "SELECT revoked_at IS NOT NULL OR (expires_at IS NOT NULL AND expires_at <= now())"
                " FROM gateway.tokens WHERE sha256 = $1", hash_secret(secret)))
        except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError):
            return False  # a database from before the identity tables: the file is the truth
        finally:
            await conn.close()

    return asyncio.run(ask())


def _write_private(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _wait_http(url: str, timeout: float, sup: Supervisor) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        sup.check()
        time.sleep(0.2)
    raise RuntimeError(f"the gateway did not answer at {url} within {timeout:.0f}s; see {sup.logs}/gateway.log")


def up(opts: UpOptions) -> int:
    logging.basicConfig(level=getattr(logging, opts.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    lease_env = {}
    if opts.lease_seconds is not None:
        lease_env["TETO_LEASE_SECONDS"] = str(opts.lease_seconds)
    if opts.heartbeat_seconds is not None:
        lease_env["TETO_HEARTBEAT_SECONDS"] = str(opts.heartbeat_seconds)
    _check_settings({**os.environ, **lease_env})  # refuse an unsafe lease contract before starting anything
    try:
        cluster.check_topology(opts.nats_cluster, opts.replicas)
        if opts.nats_cluster > 1 and os.environ.get("TETO_NATS_URL"):
            raise cluster.TopologyError("--nats-cluster starts embedded servers: unset TETO_NATS_URL (with an "
                                        "external cluster, set TETO_STREAM_REPLICAS instead)")
    except cluster.TopologyError as exc:
        print(f"teto up: {exc}", file=sys.stderr)
        return 2
    busy = [port for port in cluster.gateway_ports(opts.http_port, opts.replicas) if not port_is_free(port)]
    if busy:  # refused up front: a gateway replica could never bind it and would restart until given up
        others = f" and its other replicas on the {opts.replicas - 1} port(s) after it" if opts.replicas > 1 else ""
        print(f"teto up: port {', '.join(map(str, busy))} is in use (the gateway listens on --http-port "
              f"{opts.http_port}{others}); choose another --http-port", file=sys.stderr)
        return 2
    data_dir = opts.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    jobs_isolation.harden_data_dir(data_dir)
    lock = open(data_dir / "up.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"another `teto up` is running on {data_dir}", file=sys.stderr)
        return 2

    def on_signal(signum, frame):  # noqa: ARG001
        raise _Stop()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    nats = pg = None
    sup = Supervisor(data_dir)
    # A /metrics port per process (docs/observability.md), never one the gateway replicas will bind.
    metrics_ports = MetricsPorts(data_dir, reserved=cluster.gateway_ports(opts.http_port, opts.replicas))
    started = time.monotonic()
    try:
        nats_url = os.environ.get("TETO_NATS_URL")
        database_url = os.environ.get("TETO_DATABASE_URL")
        from teto.stack.embedded import EmbeddedPostgres

        prefix = os.environ.get("TETO_SUBJECT_PREFIX", "teto")
        bus_auth = None  # an external NATS is used with the credentials its operator configured
        nats_admin = Path(os.environ["TETO_NATS_CREDENTIALS_FILE"]) if os.environ.get(
            "TETO_NATS_CREDENTIALS_FILE") else None
        if not nats_url:
            bus_auth, nats = busauth.start_embedded(data_dir / "nats", prefix, members=opts.nats_cluster,
                                                  sup=sup)
            nats_url, nats_admin = nats.url, bus_auth.admin_creds
            log.info("embedded NATS (JetStream) at %s, every part with its own credentials", nats_url)
        stream_replicas = (cluster.stream_replicas(opts.nats_cluster) if opts.nats_cluster > 1
                           else int(os.environ.get("TETO_STREAM_REPLICAS") or 1))
        if not database_url:
            pg = EmbeddedPostgres(data_dir / "postgres").start()
            sup.watches.append(PostgresWatch(pg))
            database_url = pg.url
            log.info("embedded PostgreSQL at %s", redact_url(database_url))
        # What each part alone may hold (its credentials and keys), on top of ``env``: see ``part_env``.
        own: dict[str, dict[str, str]] = {name: {} for name in [*SERVICE_ORDER, "executor"]}
        from teto.stack import dbsetup

        least = dbsetup.setup(database_url, data_dir, own, own_cluster=pg is not None)
        _prepare_schema(nats_url, database_url, prefix, migrate=not least, nats_credentials=nats_admin,
                        stream_replicas=stream_replicas)

        tokens_file = data_dir / "tokens.json"
        token = _admin_token(data_dir, tokens_file, database_url)
        env = dict(os.environ)
        env.update(TETO_NATS_URL=nats_url, TETO_DATABASE_URL=database_url, TETO_DATA_DIR=str(data_dir),
                   TETO_HTTP_PORT=str(opts.http_port), TETO_TOKENS_FILE=str(tokens_file),
                   TETO_SUBJECT_PREFIX=prefix, TETO_STREAM_REPLICAS=str(stream_replicas), PYTHONUNBUFFERED="1")
        env.update(lease_env)
        # The local provisioner: a replaced node becomes a request file the loop below turns into a fresh agent.
        env.setdefault("TETO_PROVISIONER_COMMAND", provisioner_command(data_dir))
        from teto.stack.secret_key import give_secrets_key

        give_secrets_key(own, data_dir, env)  # job secrets: the gateway seals, executors open
        from teto.stack.audit_key import audit_key_env

        own["audit"].update(audit_key_env(data_dir))  # the audit log's HMAC key: the audit service alone
        isolation_env, isolation_lines = jobs_isolation.executor_env(env)  # workloads' uids (docs/security/jobs.md)
        own["executor"].update(isolation_env)
        if own["executor"].get("TETO_WORKLOAD_UID_RANGE") or os.environ.get("TETO_WORKLOAD_UID_RANGE"):
            isolation_lines += jobs_isolation.place_run_dirs(data_dir)  # reachable by the runs' uids
        store_line = _checkpoint_store(opts, data_dir, sup, own)
        prepare_executor = busauth.give_credentials(bus_auth, own,
                                                    lambda: [p.executor_id for p in sup.parts.values()])
        py = [sys.executable, "-m", "teto.cli"]
        ports = cluster.gateway_ports(opts.http_port, opts.replicas)
        for name in SERVICE_ORDER:
            for i, part in enumerate(cluster.replica_names(name, opts.replicas)):
                part_vars = {**part_env(env, own, name), "TETO_HTTP_PORT": str(ports[i]), "TETO_INSTANCE": part}
                sup.add(Part(part, [*py, "service", name, "--log-level", opts.log_level],
                             metrics_ports.env(part, part_vars)))

        identities = Identities(data_dir)

        def add_executor(name: str, group: str) -> None:
            def new_id() -> str:
                return identities.take(name, lambda: f"{group}-{name.rsplit('-', 1)[-1]}-{uuid.uuid4().hex[:6]}")

            sup.add(Part(name, [*py, "executor", "--group", group, "--executor-id", "{executor_id}",
                                "--log-level", opts.log_level],
                         metrics_ports.env(name, part_env(env, own, "executor")),
                         new_executor_id=new_id, prepare=prepare_executor))

        for name in executor_parts(opts.executors, identities):
            add_executor(name, opts.group)
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        url = urls[0]
        for gateway in urls:
            _wait_http(f"{gateway}/healthz", 90.0, sup)
        _write_private(data_dir / "stack.json", {"gateway_url": url, "gateway_urls": urls, "admin_token": token,
                                                 "nats_url": nats_url, "stream_replicas": stream_replicas,
                                                 "database_url": database_url, "data_dir": str(data_dir),
                                                 "subject_prefix": prefix,
                                                 "nats_credentials_file": str(nats_admin) if nats_admin else None})
        jobs_isolation.harden_data_dir(data_dir)  # runs enter it, never read what is not theirs
        print(f"\nTeto is up in {time.monotonic() - started:.1f}s\n  gateway:     {', '.join(urls)}  "
              f"(OpenAPI: {url}/docs)\n"
              f"  admin token: {token}\n  NATS:        {nats_url}{busauth.note(bus_auth, nats_admin)}"
              f"{cluster.note(nats, stream_replicas)}\n"
              f"  PostgreSQL:  {redact_url(database_url)}\n"
              f"  checkpoints: {store_line}\n"
              f"  stack file:  {data_dir / 'stack.json'}\n  logs:        {sup.logs}/\n"
              f"  metrics:     {metrics_ports.summary()}\n"
              f"Try: teto jobs --data-dir {opts.data_dir}   (Ctrl-C stops everything)\n", flush=True)
        for line in [*isolation_lines, *filter(None, [jobs_isolation.cgroup_line()]),
                     *jobs_isolation.confinement_lines()]:
            print(f"  job isolation: {line}", flush=True)
        rc = 0
        if opts.demo:
            rc = follow_demo(url, token, sup, opts.demo_spec)
            if opts.exit_after_demo:
                return rc
        while True:
            sup.check()
            replace_nodes(sup, data_dir, add_executor, identities)
            time.sleep(0.5)
    except _Stop:
        print("\nstopping Teto ...", flush=True)
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sup.stop([n for n in sup.parts if n.startswith("executor")])
        sup.stop([p for name in reversed(SERVICE_ORDER) for p in cluster.replica_names(name, opts.replicas)])
        sup.stop([seaweed.PART])
        if pg is not None:
            pg.stop()
        if nats is not None:
            nats.stop()
        lock.close()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _checkpoint_store(opts: UpOptions, data_dir: Path, sup: Supervisor, own: dict[str, dict[str, str]]) -> str:
    """Where checkpoints go, said in one line: with ``--checkpoint-store s3`` the store configured
    (TETO_CHECKPOINT_STORE_URL) or an embedded SeaweedFS, and each executor its own local directory (its work
    directory's ``checkpoints``: nothing is shared but the store); otherwise the shared directory."""
    url = os.environ.get("TETO_CHECKPOINT_STORE_URL")
    if opts.checkpoint_store == "s3" and not url:
        store = seaweed.start(data_dir, sup)
        own["executor"].update(store.executor_env())
        log.info("embedded SeaweedFS S3 at %s, bucket %s", store.endpoint, store.bucket)
        return (f"{store.url} at {store.endpoint} (embedded SeaweedFS, keys in {store.root}, 0600); each executor "
                f"uploads from its own local directory")
    if url:
        where = os.environ.get("TETO_CHECKPOINT_STORE_ENDPOINT") or "AWS S3"
        return f"{url} at {where}; each executor uploads from its own local directory"
    return f"{os.environ.get('TETO_CHECKPOINT_DIR') or data_dir / 'checkpoints'} (one directory every executor shares)"


def part_env(env: dict[str, str], own: dict[str, dict[str, str]], part: str) -> dict[str, str]:
    """The environment of one part: what every part gets, plus what is that part's alone (credentials, keys).
    A value of None in ``own`` removes a variable every other part gets (an executor has no database URL)."""
    out = dict(env)
    for key, value in own.get(part, {}).items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def _check_settings(env: dict[str, str]) -> None:
    """Refuse an unsafe lease contract before starting anything (each part would refuse it anyway)."""
    from libs.runtime.settings import CommonSettings

    CommonSettings.from_env(env=env)
