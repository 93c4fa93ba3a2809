"""Audit append through the real audit service against a raw ``COPY`` of the same rows into the same PostgreSQL,
measured in the same run (issue 12, item 5: target 0.5x, zero loss).

N commands (``SubmitJob``, as the gateway publishes them) are published on ``teto.cmd.submit`` first; then the
audit service (its own consumers, store and migrations, with an audit key as deployed, so each row carries its
mac) drains them into ``audit.log``: the figure is N over the time from the durable's first delivery to its last
acknowledgement. Afterwards the rows are counted and the whole chain verified (with the key), and every published
command id must be there once. The reference then copies exactly those rows (read back, untimed) with asyncpg's
``copy_records_to_table`` into a table made ``LIKE audit.log INCLUDING ALL`` (same columns, indexes and unique
key) in the same database, twice (the faster counts): the rate of COPY alone, with no hashing, no dedupe and no broker.

The note also gives the ceiling any consumer of the bus has here: a plain nats-py pull consumer (fetch a batch of
the service's size, ack each message, nothing else) draining the same stream, as a rate and against COPY; the
service cannot be faster than that, whatever its store does. And the load average, since the machine is shared,
and the CPU per row of the service's run and of one COPY (this process, PostgreSQL's postmaster with every backend,
NATS), which a loaded machine moves much less than the rates.

Run: .venv/bin/python -m bench.bench_audit [N] [--layers], or ``teto bench audit`` (``main``). ``--layers`` also
drains the stream with the edge (libs/runtime/edge.py) and a handler that does nothing, reading each message
first as bytes, then as the audit service reads it: with the plain consumer, the service and COPY this splits a
row's time into bus, edge, reader and store. ``--store [BATCH]`` instead times ``store.append`` alone, called
directly on N entries in batches of BATCH (default the service's), against COPY of the same rows, with the CPU
time per row of this process (what the audit service spends per row, least moved by a loaded machine).
``--reader`` times only the reader (``entries.from_command``) on N commands, CPU per row, without any server.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

from bench._cpu import parent, tree_cpu, tree_spent
from bench._drain import drained_by, reference, row, service_rate
from bench._servers import servers
from libs.contracts.commands import SubmitJob
from libs.runtime import db
from libs.runtime.edge import Consumer
from libs.runtime.service import Runtime
from libs.runtime.settings import CommonSettings
from services.audit.domain import entries
from services.audit.handlers import fallback_id
from services.audit.settings import AuditSettings
from services.audit.store import COLUMNS  # the columns the service writes, copied by the reference

PREFIX = "bench"


def commands(n: int) -> list[SubmitJob]:
    return [SubmitJob(actor=f"user-{i % 37}", spec={"workload": {"kind": "finetune"}})
            for i in range(n)]


async def copy_reference(conn: asyncpg.Connection, table: str) -> tuple[float, int]:
    """Seconds to COPY the audit log's rows into a new twin table (rows read back first, untimed); rows copied."""
    await conn.execute(f"DROP TABLE IF EXISTS public.{table};"
                       f" CREATE TABLE public.{table} (LIKE audit.log INCLUDING ALL)")
    records = [tuple(r[c] for c in COLUMNS) for r in await conn.fetch(
        f"SELECT {', '.join(COLUMNS)} FROM audit.log ORDER BY seq")]
    t0 = time.perf_counter()
    await conn.copy_records_to_table(table, schema_name="public", records=records, columns=COLUMNS)
    seconds = time.perf_counter() - t0
    return seconds, await conn.fetchval(f"SELECT count(*) FROM public.{table}")


async def edge_alone(rt: Runtime, durable: str, batch: int, read) -> float:
    """Seconds the edge takes to drain the command stream with a handler that does nothing (``read`` per message)."""
    async def nothing(_items: list) -> None:
        return None

    await rt.consume([Consumer(rt.subjects.cmd_all, "CMD", durable, None, nothing, batch=batch, read=read)])
    return await asyncio.wait_for(drained_by(rt.js, rt.subjects.stream_name("CMD"), durable), 900)


async def run(n: int, layers: bool = False) -> dict:
    from services.audit import store
    from services.audit.app import serve as audit
    from services.audit.keyfile import create_key_file, load_key

    with servers() as (nats_url, pg_url), tempfile.TemporaryDirectory(prefix="teto-bench-key-") as tmp:
        key_file = Path(tmp) / "audit.key"
        create_key_file(key_file)
        base = dict(nats_url=nats_url, database_url=pg_url, subject_prefix=PREFIX)
        rt = await Runtime.open("bench", CommonSettings.from_env(env={}, **base), schema=None, package=None)
        s, js = rt.subjects, rt.js
        sent = commands(n)
        for i in range(0, n, 500):
            await asyncio.gather(*(js.publish(s.cmd("submit"), c.encode()) for c in sent[i:i + 500]))
        settings = AuditSettings.from_env(env={}, audit_key_file=key_file, **base)
        probe = await asyncpg.connect(pg_url)
        postmaster = parent(await probe.fetchval("SELECT pg_backend_pid()"))
        await probe.close()
        cpu0 = stack_cpu(postmaster)
        (seconds,) = await service_rate(audit, settings, js, [(s.stream_name("CMD"), "audit-commands")])
        service_cpu = tree_spent(cpu0, stack_cpu(postmaster))
        bus_seconds = await reference(js, s.cmd_all, s.stream_name("CMD"), "bench-raw", n, batch=settings.batch_size)
        split = {}
        if layers:
            split["edge, bytes"] = await edge_alone(rt, "bench-edge", settings.batch_size, lambda m: m.data)
            split["edge + reader"] = await edge_alone(rt, "bench-reader", settings.batch_size, lambda m: (
                entries.from_command(m.subject, m.data, fallback_id("CMD", m), rt.clock.now())))

        conn = await asyncpg.connect(pg_url)
        stored = await conn.fetch("SELECT command_id FROM audit.log")
        ids = [r["command_id"] for r in stored]
        pool = await asyncpg.create_pool(pg_url, min_size=1, max_size=2)
        verified = await store.verify(pool, load_key(key_file))
        await pool.close()
        # Twice, each into a fresh table: on a shared machine one run can be disturbed; the faster counts.
        cpu0 = stack_cpu(postmaster)
        copies = [await copy_reference(conn, f"audit_copy_{i}") for i in (1, 2)]
        copy_cpu = {k: v / 2 for k, v in tree_spent(cpu0, stack_cpu(postmaster)).items()}  # one COPY's
        ref_seconds, copied = min(copies)
        await conn.close()
        await rt.close()
    lost = len({c.command_id for c in sent} - set(ids))
    whole = len(ids) == n and lost == 0 and len(set(ids)) == n and verified.ok and verified.checked == n
    result = row("audit append (service vs COPY)", n, seconds, ref_seconds, unit="rows/s")
    result["note"] = (f"{n} commands; rows {len(ids)}, lost {lost}, chain verified {verified.ok} "
                      f"({verified.checked} rows, {verified.macs_checked} macs); COPY reference copied {copied} "
                      f"(two runs {'/'.join(f'{n / t:.0f}' for t, _ in copies)} rows/s, the faster used); ceiling: a "
                      f"plain pull consumer of the same stream {n / bus_seconds:.0f} msg/s = "
                      f"{ref_seconds / bus_seconds:.2f}x COPY; batch {settings.batch_size}; load average "
                      f"{os.getloadavg()[0]:.1f}; {cpu_note(service_cpu, copy_cpu, n)}")
    if split:
        split.update({"plain consumer": bus_seconds, "audit service": seconds})
        result["note"] += "; per row: " + ", ".join(f"{k} {t / n * 1e6:.0f} us ({ref_seconds / t:.2f}x COPY)"
                                                     for k, t in sorted(split.items(), key=lambda kv: kv[1]))
    # Loss or a broken chain fails the benchmark whatever the speed.
    result["passed"] = bool(result["passed"]) and whole and copied == n
    return result


def stack_cpu(postmaster: int | None) -> dict[str, float]:
    """CPU seconds so far: this process (the service runs in it), the NATS server, and PostgreSQL (the postmaster
    with every backend, live or reaped)."""
    mine = tree_cpu()
    pg = sum(tree_cpu(postmaster).values()) if postmaster else 0.0
    return {"self": mine.get("self", 0.0), "nats-server": mine.get("nats-server", 0.0), "postgres": pg}


def cpu_note(service: dict[str, float], copy: dict[str, float], n: int) -> str:
    """CPU per row of the service's run and of one COPY (this process, PostgreSQL, NATS), and their ratio: what a
    loaded machine moves least (the COPY's own part includes reading nothing: its rows were read untimed)."""
    def parts(cpu: dict[str, float]) -> tuple[float, str]:
        us = {k: v / n * 1e6 for k, v in cpu.items() if k in ("self", "postgres", "nats-server")}
        return sum(us.values()), ", ".join(f"{k} {v:.0f}" for k, v in sorted(us.items(), key=lambda kv: -kv[1]))
    (total, split), (ref, ref_split) = parts(service), parts(copy)
    return (f"CPU per row: service {total:.0f} us ({split}), COPY {ref:.0f} us ({ref_split}), CPU ratio "
            f"{ref / total if total else 0:.2f}")


async def store_alone(n: int, batch: int) -> str:
    from services.audit import store

    key = b"k" * 32
    with servers() as (_, pg_url):
        pool = await db.create_pool(pg_url, max_size=2)
        await db.migrate(pool, store.SCHEMA, "services.audit")
        now = datetime.now(UTC)
        found = [entries.from_command("bench.cmd.submit", c.encode(), f"CMD-{i}", now)
                 for i, c in enumerate(commands(n))]
        async with pool.acquire() as conn:
            role = await store.writer_role(conn, None)
            t0, cpu0 = time.perf_counter(), time.process_time()
            for i in range(0, n, batch):
                await store.append(conn, found[i:i + batch], role=role, now=now, key=key)
            seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            ref_seconds = min([(await copy_reference(conn, f"audit_copy_{i}"))[0] for i in (1, 2)])
        verified = await store.verify(pool, key)
        await pool.close()
    return (f"store.append alone, batches of {batch}: {n / seconds:.0f} rows/s, COPY {n / ref_seconds:.0f} rows/s, "
            f"ratio {ref_seconds / seconds:.3f}; CPU {cpu / n * 1e6:.0f} us/row; verified {verified.ok} "
            f"({verified.checked} rows); load average {os.getloadavg()[0]:.1f}")


def reader_alone(n: int, batch: int, rounds: int = 3) -> str:
    """CPU per row of the audit's reader alone (``entries.from_command`` of each command, in batches held as the
    service holds them, the collector tuned as the service tunes it, then its thresholds restored and, where
    nothing was frozen before, nothing frozen), no servers: the best of ``rounds``."""
    import gc

    from libs.runtime.gctune import tune_for_batches

    datas, now = [c.encode() for c in commands(n)], datetime.now(UTC)
    frozen = gc.get_freeze_count()  # a service in this process may have frozen its start-up already
    before, best = tune_for_batches(), float("inf")
    try:
        for _ in range(rounds):
            cpu0 = time.process_time()
            for i in range(0, n, batch):
                _held = [entries.from_command("bench.cmd.submit", d, f"CMD-{j}", now)
                         for j, d in enumerate(datas[i:i + batch], i)]
            best = min(best, time.process_time() - cpu0)
    finally:
        gc.set_threshold(*before)
        if not frozen:
            gc.unfreeze()
    return (f"reader alone (entries.from_command), {n} commands in batches of {batch}: CPU {best / n * 1e6:.1f} "
            f"us/row (best of {rounds}); load average {os.getloadavg()[0]:.1f}")


def main(quick: bool = False) -> dict:
    return asyncio.run(run(1_000 if quick else 20_000))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if "--reader" in sys.argv:  # N
        print(reader_alone(int(args[0]) if args else 20_000, AuditSettings.model_fields["batch_size"].default))
        sys.exit(0)
    if "--store" in sys.argv:  # N [BATCH]
        print(asyncio.run(store_alone(int(args[0]) if args else 10_000, int(args[1]) if len(args) > 1 else
                                      AuditSettings.model_fields["batch_size"].default)))
        sys.exit(0)
    r = asyncio.run(run(int(args[0]) if args else 20_000, layers="--layers" in sys.argv))
    print(f"audit service {r['figure']:.0f} rows/s, COPY {r['reference']:.0f} rows/s, ratio {r['ratio']:.3f} "
          f"(target 0.5): {'pass' if r['passed'] else 'short'}\n{r['note']}")
