"""A simulated fleet against the real services (issue 12, item 3): N executors as asyncio tasks in this process
(bench/_fleet.py: registration, heartbeats, lease renewals, step and usage reports on the real subjects), the
real queue, health and budget services each in its own process (bench/_fleet_service.py) on embedded NATS and
PostgreSQL. Default 10,000 executors at a 30 s heartbeat; ``--quick`` 200 at 2 s.

Heartbeats are spread evenly over the interval. A tenth of the executors get a job (submitted through
``teto.cmd.submit`` and granted by the queue) and then renew its lease and report steps and usage every interval.
After one interval of warm-up the bench measures for ``cycles`` intervals (at least 2); at the start of the
measurement 1 % of the executors are killed (they stop everything at once). Measured:

- ingest lag per consumer: each heartbeat and usage durable's backlog (pending + unacknowledged), sampled
  every second, as its maximum and as seconds of the fleet's message rate;
- signal evaluation lag: for a fixed sample of executors (``probes``), the time from a heartbeat's send to the
  end of the first pass of health's evaluator that began after the heartbeat was in health's table (polled
  every 200 ms, so up to 0.2 s is the poll's); p50, p99 and max; target p99 <= 2 s;
- the same lag in its parts (``breakdown``), from health's log of its heartbeat batches: the simulator sending
  after the heartbeat's place in the schedule, send to health's handler, the handler's transaction, commit to
  the start of the pass that judged it, and that pass; the figure itself is timed from the commit the log
  gives (the table poll remains for heartbeats the log does not name);
- which statements wait on which locks, sampled twice a second;
- false ``no_signal``: executors (and jobs of executors) alive all along that health ever marked no_signal
  (polled every second); target 0. A job whose grant the simulated executor gave up confirming (the queue did
  not answer in an interval) has no heartbeat naming it: counted apart, not as false;
- true positives: killed executors health marked no_signal before the end, and how long after the kill. Only
  executors that are up (a heartbeat sent) are killed; for any killed one never found, its trace (the
  simulator's side and health's row) is in the result.

Run: .venv/bin/python -m bench.bench_fleet [N ...] [--interval S] [--cycles C] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._fleet import Fleet
from bench._servers import servers
from libs.contracts.commands import SubmitJob
from libs.contracts.jobs import JobSpec
from libs.runtime.service import Runtime
from libs.runtime.settings import CommonSettings

PREFIX = "fleet"
DURABLES = [("HB", "queue-heartbeats"), ("HB", "health-heartbeats"), ("HB", "budget-usage"),
            ("USAGE", "budget-usage-reports"), ("NODE", "health-nodes")]


def _env(nats_url: str, pg_url: str, interval: float) -> dict[str, str]:
    return {**os.environ, "TETO_NATS_URL": nats_url, "TETO_DATABASE_URL": pg_url, "TETO_SUBJECT_PREFIX": PREFIX,
            "TETO_HEARTBEAT_SECONDS": str(interval), "TETO_LEASE_SECONDS": str(6 * interval),
            # Nodes take work before their checks (the check suite is not simulated) and no check is due soon.
            "TETO_REQUIRE_CHECKED_NODES": "false", "TETO_JOIN_BATCH_SECONDS": "3600",
            "TETO_NODE_GONE_SECONDS": str(max(300.0, 20 * interval))}


async def _ready(js, stream: str, durable: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            await js.consumer_info(stream, durable)
            return
        except Exception:  # noqa: BLE001 - not created yet
            if time.monotonic() > deadline:
                raise RuntimeError(f"{durable} never appeared") from None
            await asyncio.sleep(0.2)


_LOCK_WAITS = """
SELECT w.query AS waiting, b.query AS blocking FROM pg_stat_activity w
JOIN LATERAL unnest(pg_blocking_pids(w.pid)) AS bp(pid) ON true JOIN pg_stat_activity b ON b.pid = bp.pid
WHERE w.wait_event_type = 'Lock'
"""


def _sql_head(sql: str | None) -> str:
    """A statement's first words, enough to tell which one it is (the table it writes)."""
    words = " ".join((sql or "").split())
    return words[:70]


class Watch:
    """What the bench observes while the fleet runs (one task each, stopped together)."""

    def __init__(self, rt, pool, fleet: Fleet) -> None:
        self.rt, self.pool, self.fleet = rt, pool, fleet
        self.pending: dict[str, int] = {d: 0 for _, d in DURABLES}
        self.no_signal: dict[str, float] = {}  # executor -> first seen
        self.job_no_signal: dict[str, str] = {}  # job -> its executor
        self.job_first: dict[str, tuple] = {}  # job -> (first seen no_signal, its epoch, its last contact) then
        self.stuck: set[str] = set()
        self.lock_waits: dict[str, int] = {}  # "waiting statement <- blocking statement" -> samples seen

    async def locks(self) -> None:
        """Which statements wait on a lock and which hold it, sampled twice a second (pg_stat_activity)."""
        while True:
            for r in await self.pool.fetch(_LOCK_WAITS):
                key = f"{_sql_head(r['waiting'])} <- {_sql_head(r['blocking'])}"
                self.lock_waits[key] = self.lock_waits.get(key, 0) + 1
            await asyncio.sleep(0.5)

    async def backlog(self) -> None:
        while True:
            for stream, durable in DURABLES:
                info = await self.rt.js.consumer_info(self.rt.subjects.stream_name(stream), durable)
                self.pending[durable] = max(self.pending[durable], info.num_pending + info.num_ack_pending)
            await asyncio.sleep(1.0)

    async def signals(self) -> None:
        while True:
            now = time.time()
            # Only the few rows not ok: reading all 10,000 each second starved the simulator's own event loop.
            for r in await self.pool.fetch("SELECT executor_id, signal FROM health.executors"
                                           " WHERE signal IN ('no_signal', 'stuck')"):
                if r["signal"] == "no_signal":
                    self.no_signal.setdefault(r["executor_id"], now)
                elif r["signal"] == "stuck":
                    self.stuck.add(r["executor_id"])
            for r in await self.pool.fetch("SELECT job_id, executor_id, state, epoch, extract(epoch FROM"
                                           " last_contact_at) AS contact FROM health.jobs WHERE signal = 'no_signal'"):
                self.job_no_signal.setdefault(r["job_id"], f"{r['executor_id']} {r['state']}")
                self.job_first.setdefault(r["job_id"], (now, r["epoch"], float(r["contact"] or 0)))
            await asyncio.sleep(1.0)

    async def ingestion(self) -> None:
        """When each probe heartbeat first shows in health's table."""
        while True:
            waiting = [p for p in self.fleet.probe_log if p.ingested is None]
            if waiting:
                rows = await self.pool.fetch("SELECT executor_id, last_heartbeat FROM health.executors"
                                             " WHERE executor_id = ANY($1::text[])",
                                             sorted({p.executor_id for p in waiting}))
                seen = {r["executor_id"]: r["last_heartbeat"] for r in rows}
                now = time.time()
                for p in waiting:
                    if seen.get(p.executor_id) is not None and seen[p.executor_id] >= p.sent_at:
                        p.ingested = now
            await asyncio.sleep(0.2)


def read_batches(lines: list[str]) -> dict[tuple[str, str], tuple[float, float, float]]:
    """Health's heartbeat batches as ``bench._fleet_service`` logs them (``start end id:sent_at:in_stream ...``):
    for each heartbeat (executor, send time to the microsecond), when JetStream stored it, when its batch's
    handler began and when it had committed (the first time, should a batch be handled again)."""
    out: dict[tuple[str, str], tuple[float, float, float]] = {}
    for line in lines:
        start, end, *beats = line.split()
        for beat in beats:
            executor, sent_at, streamed = beat.split(":")
            out.setdefault((executor, sent_at), (float(streamed), float(start), float(end)))
    return out


def mark_stored(probes, batches: dict[tuple[str, str], tuple[float, float, float]]) -> None:
    """Each probe's time in the stream, arrival at health's handler and commit, from the batch log; its
    ``ingested`` becomes the commit (exact) instead of the table poll's first sight (up to 0.2 s late)."""
    for p in probes:
        seen = batches.get((p.executor_id, f"{p.sent_at.timestamp():.6f}"))
        if seen is not None:
            p.streamed, p.received, p.ingested = seen


PARTS = ("late", "to_stream", "in_stream", "write", "wait", "pass", "lag", "lag_from_due")


def breakdown(probes, passes: list[tuple[float, float]], since: float, until: float) -> dict[str, list[float]]:
    """A probe heartbeat's signal lag in its parts, each in seconds: ``late`` the simulator sending after the
    heartbeat's place in the schedule; ``to_stream`` from the send to JetStream's storing it (the simulator's
    own publish, in its busy event loop, and the broker); ``in_stream`` from there to health's handler (the
    stream's backlog, the edge's fetch and decode); ``write`` the handler's transaction; ``wait`` from the commit to the
    start of the evaluator pass that judged it; ``pass`` that pass; ``lag`` (send to the pass's end: the figure)
    and ``lag_from_due`` (the same from the schedule). Only probes sent in [since, until) with a logged batch,
    a due time and a pass after them."""
    starts = [s for s, _ in passes]
    out: dict[str, list[float]] = {k: [] for k in PARTS}
    for p in probes:
        received = p.received
        if received is None or p.ingested is None or p.due is None or not since <= p.sent < until:
            continue
        i = bisect.bisect_left(starts, p.ingested)
        if i == len(passes):
            continue
        start, end = passes[i]
        values = (p.sent - p.due, p.streamed - p.sent, received - p.streamed, p.ingested - received,
                  start - p.ingested, end - start, end - p.sent, end - p.due)
        for key, value in zip(PARTS, values):
            out[key].append(value)
    return out


def evaluation_lags(probes, passes: list[tuple[float, float]], since: float, until: float) -> list[float]:
    """Seconds from each probe heartbeat's send to the end of the first evaluator pass that began after it was
    stored; probes sent outside [since, until) or never stored are left out (counted separately)."""
    lags = []
    for p in probes:
        if p.ingested is None or not since <= p.sent < until:
            continue
        end = next((e for s, e in passes if s >= p.ingested), None)
        if end is not None:
            lags.append(end - p.sent)
    return lags


def _say(text: str) -> None:
    print(f"[fleet {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(n: int, interval: float, cycles: float = 2, busy: float = 0.1, kill: float = 0.01) -> dict:
    import asyncpg

    cycles = max(2.0, cycles)
    tmp = tempfile.mkdtemp(prefix="teto-fleet-")  # the services' logs stay there for a look afterwards
    with servers() as (nats_url, pg_url):
        _say(f"servers up; logs in {tmp}")
        rt = await Runtime.open("bench", CommonSettings.from_env(env={}, nats_url=nats_url, database_url=pg_url,
                                                                subject_prefix=PREFIX), schema=None, package=None)
        passes_file = Path(tmp) / "passes"
        procs = [subprocess.Popen([sys.executable, "-m", "bench._fleet_service", name, str(passes_file)],
                                  env=_env(nats_url, pg_url, interval), stdout=open(Path(tmp) / f"{name}.log", "w"),
                                  stderr=subprocess.STDOUT) for name in ("queue", "health", "budget")]
        pool = None
        fleet = Fleet(rt.nc, rt.js, rt.subjects, n, interval)
        tasks: list[asyncio.Task] = []
        try:
            for stream, durable in DURABLES:
                await _ready(rt.js, rt.subjects.stream_name(stream), durable)
            _say("services ready")
            pool = await asyncpg.create_pool(pg_url, min_size=1, max_size=5)
            jobs = int(n * busy)
            for _ in range(jobs):
                await rt.js.publish(rt.subjects.cmd(SubmitJob.KIND), SubmitJob(
                    actor="fleet", spec=JobSpec(workload={"kind": "finetune"})).encode())
            _say(f"{jobs} jobs submitted; {n} executors starting over {interval:g} s")
            await fleet.start()
            watch = Watch(rt, pool, fleet)
            tasks = [asyncio.create_task(c()) for c in (watch.backlog, watch.signals, watch.ingestion,
                                                               watch.locks)]
            # Warm-up: one interval, and until every executor has sent its first heartbeat (a loaded simulator
            # starts its last ones late), at most three intervals in all.
            started = time.monotonic()
            await asyncio.sleep(interval)
            while fleet.up < n and time.monotonic() - started < 3 * interval:
                await asyncio.sleep(0.5)
            warmup = time.monotonic() - started
            since = time.time()
            # Every hundredth executor, among those up (registered and heard): one whose start the simulator has
            # not reached yet is not part of the fleet health knows (counted as kill_skipped).
            killed, kill_skipped = choose_killed(fleet.executors, max(1, int(n * kill)))
            fleet.kill(killed)
            _say(f"measuring after {warmup:.0f} s of warm-up ({fleet.up} up); killed {len(killed)}"
                 f" ({kill_skipped} not up yet)")
            # Measure at least `cycles` intervals, and long enough for the killed ones' silence to be judged.
            await asyncio.sleep(max(cycles * interval, 2 * interval + max(5.0, interval / 2)))
            until = time.time() - interval  # probes sent in the last interval may not be judged yet
            await asyncio.sleep(0)
            busy_now = fleet.busy
            false_rows = [dict(r) for r in await pool.fetch(
                "SELECT j.job_id, j.state, j.epoch, j.executor_id, extract(epoch FROM j.last_contact_at) AS contact,"
                " extract(epoch FROM j.signal_since) AS since, e.job_id AS executor_job FROM health.jobs j"
                " LEFT JOIN health.executors e USING (executor_id) WHERE j.signal = 'no_signal'"
                " AND j.executor_id <> ALL($1::text[]) LIMIT 5", killed)]
            read_at = time.time()
            killed_rows = {r["executor_id"]: dict(r) for r in await pool.fetch(
                "SELECT executor_id, signal, signal_since, last_heartbeat, registered_at FROM health.executors"
                " WHERE executor_id = ANY($1::text[])", killed)}
        finally:
            for t in tasks:
                t.cancel()
            # Bounded: a run must end with its figures even when the machine is too slow for a clean stop.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(fleet.stop(), 60)
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
            if pool is not None:
                pool.terminate()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(rt.close(), 30)
        passes = sorted(tuple(map(float, line.split())) for line in passes_file.read_text().splitlines()
                        if line.strip())
        pass_seconds = [e - s for s, e in passes]
        batches_file = Path(f"{passes_file}.batches")
        if batches_file.exists():
            mark_stored(fleet.probe_log, read_batches(batches_file.read_text().splitlines()))
    alive_killed = set(killed)
    probes = [p for p in fleet.probe_log if p.executor_id not in alive_killed]
    lags = evaluation_lags(probes, passes, since, until)
    false_exec, false_jobs, abandoned_no_signal = false_no_signal(watch.no_signal, watch.job_no_signal,
                                                                  alive_killed, fleet.abandoned | fleet.dropped)
    seen = found_at(killed, watch.no_signal, {k: r["signal"] for k, r in killed_rows.items()}, read_at)
    found = [t - since for t in seen.values()]
    parts = breakdown(probes, passes, since, until)
    missing = [killed_trace(fleet.by_id(k), killed_rows.get(k), since) for k in killed if k not in seen]
    rate = n / interval
    return {"executors": n, "interval": interval, "jobs": jobs, "busy_at_end": busy_now,
            "measured_s": until - since + interval, "lag_p50": percentile(lags, 0.5), "lag_p99": percentile(lags, 0.99),
            "lag_max": max(lags) if lags else float("nan"), "probes_timed": len(lags),
            "probes_unstored": sum(1 for p in probes if p.ingested is None and since <= p.sent < until),
            "pass_p50": percentile(pass_seconds, 0.5), "pass_max": max(pass_seconds, default=float("nan")),
            "passes": len(passes), "false_no_signal": len(false_exec) + len(false_jobs),
            "false_examples": (false_exec + false_jobs)[:5], "killed": len(killed), "killed_found": len(found),
            "found_after_p50": percentile(found, 0.5), "found_after_max": max(found, default=float("nan")),
            "warmup_s": warmup, "kill_skipped": kill_skipped, "killed_missing": missing, "jobs_abandoned": len(fleet.abandoned),
            "jobs_dropped": len(fleet.dropped), "false_job_rows": false_rows,
            "grant_delay": (percentile(fleet.grant_delays, 0.5), percentile(fleet.grant_delays, 0.99),
                            max(fleet.grant_delays, default=float("nan"))),
            "false_job_first": [(j, getattr(fleet.executor(watch.job_no_signal[j].split()[0]), "job_id", None),
                                 *[round(v - since, 2) if isinstance(v, float) else v for v in watch.job_first[j]])
                                for j in sorted(watch.job_first)[:5] if j in {f.split()[1] for f in false_jobs}],
            "abandoned_no_signal": abandoned_no_signal,
            "parts": {k: (percentile(v, 0.5), percentile(v, 0.99), max(v, default=float("nan")))
                      for k, v in parts.items()}, "parts_n": len(parts["lag"]),
            "stuck": len(watch.stuck), "pending_max": dict(watch.pending),
            "lock_waits": dict(sorted(watch.lock_waits.items(), key=lambda kv: -kv[1])[:8]),
            "pending_seconds": {d: v / rate for d, v in watch.pending.items()},
            "counters": vars(fleet.counters)}


def choose_killed(executors, count: int) -> tuple[list[str], int]:
    """Every hundredth executor (from the 51st) up to ``count``, among those up (a heartbeat sent): one whose start
    the simulator has not reached is no machine health has heard of. Also how many of the chosen were skipped."""
    stride = executors[50::100][:count]
    killed = [e.id for e in stride if e.beats]
    return killed, len(stride) - len(killed)


def false_no_signal(executors: dict, jobs: dict[str, str], killed: set[str],
                    abandoned: set[str]) -> tuple[list[str], list[str], int]:
    """The executors and jobs health marked no_signal though alive (not killed), and how many jobs were left out
    as abandoned (their grant never confirmed: no executor heartbeats about them). ``jobs`` maps a job to
    "executor state"."""
    false_exec = sorted(set(executors) - killed)
    false_jobs = sorted(f"job {j} ({ex})" for j, ex in jobs.items()
                        if ex.split()[0] not in killed and j not in abandoned)
    return false_exec, false_jobs, sum(1 for j in jobs if j in abandoned)


def found_at(killed: list[str], polled: dict[str, float], final: dict[str, str | None],
             read_at: float) -> dict[str, float]:
    """When each killed executor was seen no_signal: the poll's first sight, or, for one the poll missed (it
    runs in the simulator's busy event loop), the final read of its row after the window (an upper bound)."""
    return {k: polled[k] if k in polled else read_at for k in killed
            if k in polled or final.get(k) == "no_signal"}


def killed_trace(e, row: dict | None, since: float) -> dict:
    """What is known of a killed executor health never judged no_signal: the simulator's side (registered,
    heartbeats sent, the last one relative to the kill) and health's row at the end of the run."""
    rel = (lambda t: None if t is None else round(t - since, 3))
    return {"id": e.id, "registered": rel(e.registered), "beats": e.beats, "last_beat": rel(e.last_beat),
            "killed": rel(e.killed), "job": e.job_id,
            "row": None if row is None else {k: (v.timestamp() - since if hasattr(v, "timestamp") else v)
                                             for k, v in row.items()}}


def holds(r: dict) -> bool:
    """The issue's bar: signals judged within 2 s (p99), no false no_signal, every killed executor found."""
    return r["lag_p99"] <= 2.0 and r["false_no_signal"] == 0 and r["killed_found"] == r["killed"]


def rows(results: list[dict]) -> list[dict]:
    out = []
    for r in results:
        note = (f"{r['executors']} executors at {r['interval']:g} s, {r['jobs']} jobs, {r['probes_timed']} probe "
                f"heartbeats timed (p50 {r['lag_p50']:.2f} s, max {r['lag_max']:.2f} s), evaluator pass p50 "
                f"{r['pass_p50']:.2f} s; killed {r['killed']}, found {r['killed_found']} "
                f"(p50 {r['found_after_p50']:.1f} s after the kill; {r['kill_skipped']} of the chosen not up yet); "
                f"{r['jobs_abandoned']} grants never confirmed (renewal unanswered) and {r['jobs_dropped']} to a busy "
                f"executor, {r['abandoned_no_signal']} of those jobs rightly no_signal, not counted as false; "
                f"max backlog "
                + ", ".join(f"{d} {v}" for d, v in r["pending_max"].items())
                + "; lag parts p50/p99 (s): " + ", ".join(f"{k} {a:.2f}/{b:.2f}" for k, (a, b, _) in r["parts"].items()))
        base = {"reference": None, "ratio": None, "note": note}
        out.append({**base, "name": f"fleet {r['executors']}: signal evaluation lag p99", "figure": r["lag_p99"],
                    "target": 2.0, "unit": "s", "passed": r["lag_p99"] <= 2.0})
        out.append({**base, "name": f"fleet {r['executors']}: false no_signal", "figure": r["false_no_signal"],
                    "target": 0, "unit": "count", "passed": r["false_no_signal"] == 0})
        out.append({**base, "name": f"fleet {r['executors']}: killed found", "figure": r["killed_found"],
                    "target": r["killed"], "unit": "count", "passed": r["killed_found"] == r["killed"]})
    holding = [r["executors"] for r in results if holds(r)]
    out.append({"name": "fleet: largest that holds", "figure": max(holding, default=0), "reference": None,
                "ratio": None, "target": 10_000, "unit": "executors", "passed": max(holding, default=0) >= 10_000,
                "note": "sizes tried: " + ", ".join(str(r["executors"]) for r in results)})
    return out


def main(quick: bool = False) -> list[dict]:
    sizes, interval = ([200], 2.0) if quick else ([10_000], 30.0)
    return rows([asyncio.run(run(n, interval)) for n in sizes])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sizes", nargs="*", type=int, default=[10_000])
    ap.add_argument("--interval", type=float, default=30.0)
    ap.add_argument("--cycles", type=float, default=2.0)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    sizes, interval = ([200], 2.0) if a.quick else (a.sizes, a.interval)
    results = []
    for size in sizes:
        results.append(asyncio.run(run(size, interval, a.cycles)))
        print({k: v for k, v in results[-1].items()}, flush=True)
    for r in rows(results):
        print(f"{r['name']:44} {r['figure']!s:>10} {r['unit']:9} target {r['target']!s:>6}  "
              f"{'pass' if r['passed'] else 'short'}")
        print(f"    {r['note']}" if r.get("note") else "", end="\n" if r.get("note") else "")
