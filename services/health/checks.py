"""Deep-check runs: registrations put nodes in runs, the check loop starts them, agents' reports become
verdicts, and verdicts move nodes (ready, or recovering with a reboot, or replaced through the provisioner).

How a run goes:
1. A joining node (new, back from a reboot, undrained) waits ``join_batch_seconds`` so nodes joining together
   are checked together; then a run (``join`` or ``recovery``) starts for the group's due nodes. An on-demand
   run (``run_health_check``) cordons busy nodes and starts the idle ones; a cordoned node starts when its
   executor reports no job (or at once with ``force``: the agent checkpoints and stops the job first).
2. The nodes started together are a wave: they get ranks and rank 0's address for the all-reduce, and the
   addresses of the group's other nodes for the connectivity test, in a ``check`` directive each.
3. Each final result is judged against the group (verdicts.py); a failed one is re-run once (for the
   all-reduce: on the whole wave). When every test of every node of the wave is final, each node passes or
   fails, and the node's transition is written with its events and directives in one transaction.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from libs.contracts.commands import CommandOutcome, DrainNode, RunHealthCheck, UndrainNode
from libs.contracts.envelope import new_id
from libs.contracts.nodes import (ALL_TESTS, CheckPeer, CheckReport, CheckStatus, CheckTest, NodeRegistered,
                                  NodeState, RunChecks)
from libs.runtime import outbox
from libs.runtime.service import Runtime

from . import nodes as store
from .domain import nodes as lc
from .domain.verdicts import FINAL, judge, node_outcome
from .settings import HealthSettings

log = logging.getLogger(__name__)
SERVICE = "health"
GROUP_TESTS = (CheckTest.ALLREDUCE,)


class Checks:
    def __init__(self, runtime: Runtime, settings: HealthSettings) -> None:
        self.runtime = runtime
        self.settings = settings
        self.policy = lc.Policy(settings.max_reboots)
        self.stale_reports = 0
        self.provisioned: list[dict[str, Any]] = []

    @property
    def s(self):
        return self.runtime.subjects

    # -- registrations -------------------------------------------------------------------------------------

    async def on_registration(self, conn: asyncpg.Connection, reg: NodeRegistered) -> None:
        now = self.runtime.clock.now()
        node, row = await store.load(conn, reg.node_id)
        t = lc.decide(node, lc.Registered(reg.node_id, reg.executor_id, reg.group, reg.boot_id), now, self.policy)
        assert isinstance(t, lc.Transition)  # registration is never refused
        extra = {"address": reg.address, "collective_port": reg.collective_port, "hostname": reg.hostname,
                 "gpus": [g.model_dump(mode="json") for g in reg.gpus], "registered_at": reg.time}
        schedule = any(isinstance(e, lc.ScheduleChecks) for e in t.effects)
        await store.save(conn, self.s, t, now, seq=row["event_seq"] if row else 0, extra=extra,
                         needs_check=True if schedule else None)

    # -- the check loop ------------------------------------------------------------------------------------

    async def tick(self) -> int:
        """Start what is due: joining nodes past their batch wait, cordoned or queued nodes now idle."""
        now = self.runtime.clock.now()
        started = 0
        async with self.runtime.pool.acquire() as conn, conn.transaction():
            batch_since = now - timedelta(seconds=self.settings.join_batch_seconds)
            due = await conn.fetch(
                "SELECT * FROM health.nodes WHERE needs_check AND state = 'joining' ORDER BY group_name, node_id"
                " FOR UPDATE")
            by_group: dict[str, list[asyncpg.Record]] = defaultdict(list)
            for row in due:
                by_group[row["group_name"]].append(row)
            for group, rows in by_group.items():
                # Wait until the youngest joiner has waited the batch time, so joiners are checked together.
                if max(r["since"] for r in rows) > batch_since:
                    continue
                kind = "recovery" if any(r["reboots"] for r in rows) else "join"
                run_id = new_id()
                await self._new_run(conn, run_id, kind, group, None, list(ALL_TESTS), False, now)
                await conn.executemany(
                    "INSERT INTO health.check_run_nodes (run_id, node_id, status) VALUES ($1, $2, 'waiting')",
                    [(run_id, r["node_id"]) for r in rows])
                await conn.execute("UPDATE health.nodes SET needs_check = false WHERE node_id = ANY($1::text[])",
                                   [r["node_id"] for r in rows])
            # Every waiting node that may start now, per run: idle (no job per its heartbeats), or forced.
            waiting = await conn.fetch(
                "SELECT rn.run_id, rn.node_id, r.force, r.tests FROM health.check_run_nodes rn"
                " JOIN health.check_runs r USING (run_id) JOIN health.nodes n USING (node_id)"
                " LEFT JOIN health.executors e ON e.executor_id = n.executor_id"
                " WHERE rn.status = 'waiting' AND r.state = 'running'"
                "   AND (r.force OR e.job_id IS NULL OR n.state = 'joining')"
                " ORDER BY rn.run_id, rn.node_id FOR UPDATE OF rn")
            runs: dict[str, list[asyncpg.Record]] = defaultdict(list)
            for w in waiting:
                runs[w["run_id"]].append(w)
            for run_id, members in runs.items():
                started += await self._start_wave(conn, run_id, [m["node_id"] for m in members],
                                                  [CheckTest(t) for t in members[0]["tests"]], members[0]["force"],
                                                  now)
        if started:
            self.kick()
        return started

    def kick(self) -> None:
        """Replaced by the app with the outbox relay's kick (directives should go out at once)."""

    async def _new_run(self, conn: asyncpg.Connection, run_id: str, kind: str, group: str | None,
                       actor: str | None, tests: list[CheckTest], force: bool, now: datetime) -> None:
        await conn.execute(
            "INSERT INTO health.check_runs (run_id, kind, group_name, requested_by, tests, force, created_at)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7)", run_id, kind, group, actor, [t.value for t in tests], force, now)

    async def _start_wave(self, conn: asyncpg.Connection, run_id: str, node_ids: list[str], tests: list[CheckTest],
                          force: bool, now: datetime) -> int:
        wave = await conn.fetchval("SELECT COALESCE(max(wave), 0) + 1 FROM health.check_run_nodes WHERE run_id = $1",
                                   run_id)
        members: list[tuple[lc.Node, asyncpg.Record]] = []
        for node_id in node_ids:
            node, row = await store.load(conn, node_id)
            t = lc.decide(node, lc.ChecksStarted(run_id), now, self.policy)
            if isinstance(t, lc.Refusal):
                await conn.execute("UPDATE health.check_run_nodes SET status = 'failed', reason = $3, finished_at = $4"
                                   " WHERE run_id = $1 AND node_id = $2", run_id, node_id,
                                   f"not checked: {t.reason}", now)
                continue
            await store.save(conn, self.s, t, now, seq=row["event_seq"])
            members.append((t.node, row))
        if not members:
            await self._maybe_finish_run(conn, run_id, now)
            return 0
        rank0 = members[0][1]
        host = (rank0["address"] or "127.0.0.1:0").rpartition(":")[0]
        rendezvous = f"{host}:{rank0['collective_port']}" if rank0["collective_port"] and len(members) > 1 else None
        world = len(members)
        for rank, (node, row) in enumerate(members):
            await conn.execute(
                "UPDATE health.check_run_nodes SET status = 'pending', wave = $3, rank = $4, world_size = $5,"
                " rendezvous = $6, started_at = $7 WHERE run_id = $1 AND node_id = $2",
                run_id, node.node_id, wave, rank, world, rendezvous, now)
            await conn.executemany(
                "INSERT INTO health.check_results (run_id, node_id, test, status) VALUES ($1, $2, $3, 'pending')"
                " ON CONFLICT (run_id, node_id, test) DO UPDATE SET status = 'pending', attempt = 1,"
                " figures = '{}'::jsonb, verdict = '{}'::jsonb, error = NULL, updated_at = now()",
                [(run_id, node.node_id, t.value) for t in tests])
            directive = RunChecks(run_id=run_id, node_id=node.node_id, executor_id=node.executor_id or "",
                                  tests=tests, force=force, peers=await self._peers(conn, node), rank=rank,
                                  world_size=world, rendezvous=rendezvous)
            await outbox.add(conn, SCHEMA, [(self.s.agent(node.executor_id or "", "check"), directive)])
        log.info("check run %s wave %d started on %s", run_id, wave, ", ".join(n.node_id for n, _ in members))
        return len(members)

    async def _peers(self, conn: asyncpg.Connection, node: lc.Node) -> list[CheckPeer]:
        rows = await conn.fetch(
            "SELECT node_id, address FROM health.nodes WHERE group_name = $1 AND node_id <> $2 AND address IS NOT"
            " NULL AND state IN ('joining', 'checking', 'ready') ORDER BY node_id", node.group, node.node_id)
        return [CheckPeer(node_id=r["node_id"], address=r["address"]) for r in rows]

    # -- reports -------------------------------------------------------------------------------------------

    async def on_report(self, conn: asyncpg.Connection, rep: CheckReport) -> list[dict[str, Any]]:
        """Apply one report; returns provisioner requests to make once the transaction has committed."""
        now = self.runtime.clock.now()
        member = await conn.fetchrow("SELECT * FROM health.check_run_nodes WHERE run_id = $1 AND node_id = $2"
                                     " FOR UPDATE", rep.run_id, rep.node_id)
        if member is None or member["status"] in ("passed", "failed", "waiting"):
            self.stale_reports += 1
            return []
        if rep.status == "busy":
            node, row = await store.load(conn, rep.node_id)
            t = lc.decide(node, lc.ChecksDeferred(rep.run_id), now, self.policy)
            if isinstance(t, lc.Transition) and t.changed:
                await store.save(conn, self.s, t, now, seq=row["event_seq"])
                await conn.execute("UPDATE health.check_run_nodes SET status = 'waiting', wave = NULL"
                                   " WHERE run_id = $1 AND node_id = $2", rep.run_id, rep.node_id)
            return []
        result = await conn.fetchrow("SELECT * FROM health.check_results WHERE run_id = $1 AND node_id = $2 AND"
                                     " test = $3 FOR UPDATE", rep.run_id, rep.node_id, rep.test and rep.test.value)
        if result is None or result["attempt"] != rep.attempt or CheckStatus(result["status"]) in FINAL:
            self.stale_reports += 1
            return []
        status = CheckStatus(rep.status)
        if status in (CheckStatus.RUNNING, CheckStatus.PENDING):
            await conn.execute("UPDATE health.check_results SET status = $4, updated_at = now() WHERE run_id = $1"
                               " AND node_id = $2 AND test = $3", rep.run_id, rep.node_id, rep.test.value, status.value)
            await conn.execute("UPDATE health.check_run_nodes SET status = 'running' WHERE run_id = $1 AND"
                               " node_id = $2 AND status = 'pending'", rep.run_id, rep.node_id)
            return []
        group = await conn.fetchval("SELECT group_name FROM health.nodes WHERE node_id = $1", rep.node_id)
        peers = [json.loads(r["f"]) for r in await conn.fetch(
            "SELECT figures -> $3 AS f FROM health.nodes WHERE group_name = $1 AND node_id <> $2 AND state = 'ready'"
            " AND figures ? $3", group, rep.node_id, rep.test.value)]
        verdict = judge(rep.test.value, status, rep.figures, peers, rep.attempt, baselines=self.settings.baselines,
                        min_ratio=self.settings.min_ratio, error=rep.error)
        verdict_json = json.dumps({**verdict.detail(), "attempt": rep.attempt, "rerun": verdict.rerun})
        await conn.execute(
            "UPDATE health.check_results SET status = $4, figures = $5::jsonb, detail = $6::jsonb, verdict = $7::jsonb,"
            " error = $8, seconds = $9, updated_at = now() WHERE run_id = $1 AND node_id = $2 AND test = $3",
            rep.run_id, rep.node_id, rep.test.value, verdict.status.value, json.dumps(rep.figures),
            json.dumps(rep.detail, default=str), verdict_json, verdict.reason, rep.seconds)
        if verdict.rerun:
            await self._rerun(conn, member, rep.test, rep.attempt + 1)
            return []
        return await self._maybe_finish_wave(conn, rep.run_id, member["wave"], now)

    async def _rerun(self, conn: asyncpg.Connection, member: asyncpg.Record, test: CheckTest, attempt: int) -> None:
        """A failed test runs once more; the all-reduce needs its whole wave, so all of it re-runs."""
        run_id = member["run_id"]
        if test in GROUP_TESTS:
            members = await conn.fetch("SELECT * FROM health.check_run_nodes WHERE run_id = $1 AND wave = $2",
                                       run_id, member["wave"])
        else:
            members = [member]
        force = await conn.fetchval("SELECT force FROM health.check_runs WHERE run_id = $1", run_id)
        for m in members:
            await conn.execute("UPDATE health.check_results SET status = 'pending', attempt = $4, updated_at = now()"
                               " WHERE run_id = $1 AND node_id = $2 AND test = $3", run_id, m["node_id"], test.value,
                               attempt)
            row = await conn.fetchrow("SELECT * FROM health.nodes WHERE node_id = $1", m["node_id"])
            node = store.node_of(row)
            directive = RunChecks(run_id=run_id, node_id=node.node_id, executor_id=node.executor_id or "",
                                  tests=[test], attempt=attempt, force=force, peers=await self._peers(conn, node),
                                  rank=m["rank"] or 0, world_size=m["world_size"] or 1, rendezvous=m["rendezvous"])
            await outbox.add(conn, SCHEMA, [(self.s.agent(node.executor_id or "", "check"), directive)])
        log.info("check run %s: %s failed on %s; re-running it once", run_id, test.value, member["node_id"])

    async def _maybe_finish_wave(self, conn: asyncpg.Connection, run_id: str, wave: int | None,
                                 now: datetime) -> list[dict[str, Any]]:
        rows = await conn.fetch(
            "SELECT rn.node_id, cr.test, cr.status, cr.verdict FROM health.check_run_nodes rn"
            " JOIN health.check_results cr USING (run_id, node_id) WHERE rn.run_id = $1 AND rn.wave = $2",
            run_id, wave)
        if not rows or any(CheckStatus(r["status"]) not in FINAL for r in rows):
            return []
        per_node: dict[str, list[asyncpg.Record]] = defaultdict(list)
        for r in rows:
            per_node[r["node_id"]].append(r)
        provision: list[dict[str, Any]] = []
        for node_id, results in per_node.items():
            outcome = node_outcome(CheckStatus(r["status"]) for r in results)
            node, row = await store.load(conn, node_id)
            if outcome is CheckStatus.PASSED:
                fact: lc.Fact = lc.ChecksPassed(run_id)
                figures = {r["test"]: json.loads(r["f"]) for r in await conn.fetch(
                    "SELECT test, figures AS f FROM health.check_results WHERE run_id = $1 AND node_id = $2"
                    " AND status = 'passed'", run_id, node_id)}
                extra: dict[str, Any] = {"figures": {**json.loads(row["figures"]), **figures}}
                reason = None
            else:
                failed = [f"{r['test']}: {json.loads(r['verdict']).get('reason') or 'failed'}"
                          for r in results if r["status"] == "failed"]
                reason = "; ".join(failed)[:1500]
                fact, extra = lc.ChecksFailed(run_id, reason), {}
            extra.update(last_check_run_id=run_id, last_check_at=now, last_check_outcome=outcome.value)
            t = lc.decide(node, fact, now, self.policy)
            if isinstance(t, lc.Transition):
                await store.save(conn, self.s, t, now, seq=row["event_seq"], extra=extra)
                for effect in t.effects:
                    if isinstance(effect, lc.Provision):
                        provision.append({"node_id": node_id, "group": t.node.group,
                                          "executor_id": t.node.executor_id or "", "reason": effect.reason})
            await conn.execute("UPDATE health.check_run_nodes SET status = $3, reason = $4, finished_at = $5"
                               " WHERE run_id = $1 AND node_id = $2", run_id, node_id, outcome.value, reason, now)
            log.info("node %s %s check run %s%s", node_id, outcome.value, run_id, f": {reason}" if reason else "")
        await self._maybe_finish_run(conn, run_id, now)
        return provision

    async def _maybe_finish_run(self, conn: asyncpg.Connection, run_id: str, now: datetime) -> None:
        await conn.execute(
            "UPDATE health.check_runs SET state = 'done', finished_at = $2 WHERE run_id = $1 AND state = 'running'"
            " AND NOT EXISTS (SELECT 1 FROM health.check_run_nodes WHERE run_id = $1"
            "                 AND status NOT IN ('passed', 'failed'))", run_id, now)

    # -- the provisioner hook ------------------------------------------------------------------------------

    async def provision(self, request: dict[str, Any]) -> None:
        """Ask for a fresh node in the group: a command (``{node_id}``, ``{group}``, ``{executor_id}`` filled in)
        or a webhook (POST of the request as JSON). At most once: a crash right after the commit loses it."""
        self.provisioned.append(request)
        cfg = self.settings
        try:
            if cfg.provisioner_command:
                argv = [a.format(**request) for a in shlex.split(cfg.provisioner_command)]
                proc = await asyncio.create_subprocess_exec(*argv)
                rc = await asyncio.wait_for(proc.wait(), 60)
                log.warning("node %s replaced: provisioner command exited %s", request["node_id"], rc)
            elif cfg.provisioner_url:
                import httpx

                async with httpx.AsyncClient(timeout=30) as client:
                    r = await client.post(cfg.provisioner_url, json=request)
                log.warning("node %s replaced: provisioner webhook answered %s", request["node_id"], r.status_code)
            else:
                log.error("node %s replaced but no provisioner is configured (TETO_PROVISIONER_COMMAND or "
                          "TETO_PROVISIONER_URL): add a node to group %s by hand", request["node_id"], request["group"])
        except Exception:  # noqa: BLE001 - a broken hook must not stop the health service
            log.exception("provisioner hook failed for node %s", request["node_id"])

    # -- commands ------------------------------------------------------------------------------------------

    async def on_command(self, cmd: RunHealthCheck | DrainNode | UndrainNode) -> CommandOutcome:
        now = self.runtime.clock.now()
        async with self.runtime.pool.acquire() as conn, conn.transaction():
            got = await conn.fetchval("INSERT INTO health.processed_commands (command_id, kind) VALUES ($1, $2)"
                                      " ON CONFLICT DO NOTHING RETURNING command_id", cmd.command_id, cmd.KIND)
            if got is None:
                prior = await conn.fetchval("SELECT outcome FROM health.processed_commands WHERE command_id = $1",
                                            cmd.command_id)
                again = CommandOutcome.model_validate({k: v for k, v in json.loads(prior).items()
                                                       if k not in ("id", "time")})
                await outbox.add(conn, SCHEMA, [(self.s.outcome(cmd.KIND, cmd.command_id), again)])
                return again
            if isinstance(cmd, RunHealthCheck):
                accepted, reason, detail = await self._run_command(conn, cmd, now)
            else:
                accepted, reason, detail = await self._drain_command(conn, cmd, now)
            outcome = CommandOutcome(command_id=cmd.command_id, kind=cmd.KIND, accepted=accepted, reason=reason,
                                     detail=detail, by=SERVICE)
            await conn.execute("UPDATE health.processed_commands SET outcome = $2::jsonb WHERE command_id = $1",
                               cmd.command_id, outcome.model_dump_json(by_alias=True))
            await outbox.add(conn, SCHEMA, [(self.s.outcome(cmd.KIND, cmd.command_id), outcome)])
        self.kick()
        return outcome

    async def _run_command(self, conn: asyncpg.Connection, cmd: RunHealthCheck,
                           now: datetime) -> tuple[bool, str | None, dict[str, Any]]:
        if bool(cmd.group) == bool(cmd.nodes):
            return False, "name a group or a list of nodes (not both)", {}
        if cmd.group:
            rows = await conn.fetch("SELECT * FROM health.nodes WHERE group_name = $1 ORDER BY node_id FOR UPDATE",
                                    cmd.group)
        else:
            rows = await conn.fetch("SELECT * FROM health.nodes WHERE node_id = ANY($1::text[]) ORDER BY node_id"
                                    " FOR UPDATE", cmd.nodes)
            unknown = sorted(set(cmd.nodes) - {r["node_id"] for r in rows})
            if unknown:
                return False, f"node(s) not found: {', '.join(unknown)}", {"unknown": unknown}
        targets = [r for r in rows if r["state"] == NodeState.READY and not r["cordoned"]]
        skipped = {r["node_id"]: (f"cordoned for run {r['run_id']}" if r["cordoned"] else r["state"])
                   for r in rows if r not in targets}
        if not targets:
            return False, "no ready node to check", {"skipped": skipped, "group": cmd.group}
        tests = cmd.tests or list(ALL_TESTS)
        await self._new_run(conn, cmd.run_id, "on_demand", cmd.group, cmd.actor, tests, cmd.force, now)
        busy_rows = {r["executor_id"] for r in await conn.fetch(
            "SELECT executor_id FROM health.executors WHERE executor_id = ANY($1::text[]) AND job_id IS NOT NULL",
            [r["executor_id"] for r in targets])}
        cordoned = []
        for row in targets:
            busy = row["executor_id"] in busy_rows and not cmd.force
            t = lc.decide(store.node_of(row), lc.CheckRequested(cmd.run_id, busy), now, self.policy)
            if isinstance(t, lc.Transition) and t.changed:
                await store.save(conn, self.s, t, now, seq=row["event_seq"])
                cordoned.append(row["node_id"])
            await conn.execute("INSERT INTO health.check_run_nodes (run_id, node_id, status) VALUES ($1, $2,"
                               " 'waiting')", cmd.run_id, row["node_id"])
        log.info("check run %s on %d node(s) (%d cordoned until their job ends)", cmd.run_id, len(targets),
                 len(cordoned))
        return True, None, {"run_id": cmd.run_id, "nodes": [r["node_id"] for r in targets], "cordoned": cordoned,
                            "skipped": skipped}

    async def _drain_command(self, conn: asyncpg.Connection, cmd: DrainNode | UndrainNode,
                             now: datetime) -> tuple[bool, str | None, dict[str, Any]]:
        node, row = await store.load(conn, cmd.node_id)
        fact = lc.Drain(cmd.reason) if isinstance(cmd, DrainNode) else lc.Undrain()
        t = lc.decide(node, fact, now, self.policy)
        if isinstance(t, lc.Refusal):
            return False, t.reason, {"node_id": cmd.node_id}
        if t.changed:
            schedule = any(isinstance(e, lc.ScheduleChecks) for e in t.effects)
            await store.save(conn, self.s, t, now, seq=row["event_seq"], needs_check=schedule)
        return True, None, {"node_id": cmd.node_id, "state": t.node.state.value}


SCHEMA = store.SCHEMA
