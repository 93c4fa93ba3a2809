"""Deep-check runs: registrations put nodes in runs, the check loop starts them, agents' reports become
verdicts, and verdicts move nodes (ready, or recovering with a reboot, or replaced through the provisioner).

How a run goes:
1. A joining node (new, back from a reboot, undrained) waits ``join_batch_seconds`` so nodes joining together
   are checked together; then a run (``join`` or ``recovery``) starts for the group's due nodes. An on-demand
   run (``run_health_check``) cordons busy nodes and starts the idle ones; a cordoned node starts when its
   executor reports no job (or at once with ``force``: the agent checkpoints and stops the job first).
2. The nodes started together are a wave: they get ranks and rank 0's address for the all-reduce, and the
   addresses of the group's other nodes for the connectivity test, in a ``check`` directive each.
3. Each final result is judged against the group (verdicts.py) and applied by the run rules (domain/runs.py):
   a failure re-runs once (the all-reduce: the whole wave); a report missing at the deadline fails. When the
   wave is final, each node's transition is written with its events and directives in one transaction.
4. A node that would be replaced goes through its group's breaker first (domain/breaker.py).
The tick starts each node in a savepoint: one that cannot be checked never stops the others.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from libs.contracts.commands import CommandOutcome
from libs.contracts.envelope import new_id
from libs.contracts.nodes import (ALL_TESTS, CheckPeer, CheckReport, CheckStatus, CheckTest, NodeRegistered,
                                  NodeState, RunChecks)
from libs.runtime import outbox
from libs.runtime.service import Runtime

from . import commands, guards, provisioner
from . import nodes as store
from .domain import breaker
from .domain import nodes as lc
from .domain import runs
from .domain.provisioning import Action, Request, requests_for
from .domain.verdicts import Verdict, judge
from .settings import HealthSettings

log = logging.getLogger(__name__)
SERVICE = "health"


class Checks:
    def __init__(self, runtime: Runtime, settings: HealthSettings) -> None:
        self.runtime = runtime
        self.settings = settings
        self.policy = lc.Policy(settings.max_reboots)
        self.stale_reports = 0
        self.overdue_reports = 0
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
                 "gpus": [g.model_dump(mode="json") for g in reg.gpus], "registered_at": reg.time,
                 "slurm_job_id": reg.slurm_job_id}
        if row is None or row["joined_at"] is None:
            extra["joined_at"] = now  # the service's clock, like the breaker's replacement times
        schedule = any(isinstance(e, lc.ScheduleChecks) for e in t.effects)
        await store.save(conn, self.s, t, now, seq=row["event_seq"] if row else 0, extra=extra,
                         needs_check=True if schedule else None)

    # -- the check loop ------------------------------------------------------------------------------------

    async def tick(self) -> int:
        """Start what is due (joining nodes past their batch wait, cordoned or queued nodes now idle), fail the
        members whose report is overdue, and mark gone the nodes no heartbeat followed."""
        now = self.runtime.clock.now()
        started = 0
        async with self.runtime.pool.acquire() as conn, conn.transaction():
            provision = await self._fail_overdue(conn, now)
            await store.mark_gone(conn, self.s, now, self.settings.node_gone_seconds)
            # Joining nodes are read unlocked, and a group's locked only once its join run is due (and judged
            # again on the locked rows): locking every joining node each tick made every registration wait for
            # the tick, and a fleet registering at once fell tens of seconds behind (issue 12).
            due = await conn.fetch(
                "SELECT group_name, since FROM health.nodes WHERE needs_check AND state = 'joining'")
            joined: dict[str, list] = defaultdict(list)
            for row in due:
                joined[row["group_name"]].append(row["since"])
            for group in sorted(g for g, since in joined.items()
                                if runs.join_run_due(since, now, self.settings.join_batch_seconds)):
                rows = await conn.fetch(
                    "SELECT * FROM health.nodes WHERE needs_check AND state = 'joining' AND group_name = $1"
                    " ORDER BY node_id FOR UPDATE", group)
                if not runs.join_run_due([r["since"] for r in rows], now, self.settings.join_batch_seconds):
                    continue
                kind = runs.run_kind([r["reboots"] for r in rows])
                run_id = new_id()
                await self.new_run(conn, run_id, kind, group, None, list(ALL_TESTS), False, now)
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
            by_run: dict[str, list[asyncpg.Record]] = defaultdict(list)
            for w in waiting:
                by_run[w["run_id"]].append(w)
            for run_id, members in by_run.items():
                started += await self._start_wave(conn, run_id, [m["node_id"] for m in members],
                                                  [CheckTest(t) for t in members[0]["tests"]], members[0]["force"],
                                                  now)
        if started or provision:
            self.kick()
        for request in provision:
            await self.provision(request)
        return started

    def kick(self) -> None:
        """Replaced by the app with the outbox relay's kick (directives should go out at once)."""

    async def new_run(self, conn: asyncpg.Connection, run_id: str, kind: str, group: str | None,
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
            try:
                async with conn.transaction():  # a savepoint: one node that cannot start never stops the others
                    node, row = await store.load(conn, node_id)
                    t = lc.decide(node, lc.ChecksStarted(run_id), now, self.policy)
                    if isinstance(t, lc.Refusal):
                        await self._member_failed(conn, run_id, node_id, f"not checked: {t.reason}", now)
                        continue
                    self.s.agent(t.node.executor_id or "", "check")  # its directive must be addressable
                    await store.save(conn, self.s, t, now, seq=row["event_seq"])
                    members.append((t.node, row))
            except Exception as exc:  # noqa: BLE001 - isolated: this node is flagged, the others go on
                await self._unaddressable(conn, run_id, node_id, f"cannot be checked: {exc}", now)
        if not members:
            await self._maybe_finish_run(conn, run_id, now)
            return 0
        rank0 = members[0][1]
        host = (rank0["address"] or "127.0.0.1:0").rpartition(":")[0]
        rendezvous = f"{host}:{rank0['collective_port']}" if rank0["collective_port"] and len(members) > 1 else None
        world = len(members)
        for rank, (node, row) in enumerate(members):
            member = runs.started(runs.Member(run_id, node.node_id, runs.MemberStatus.WAITING), wave, now,
                                  self.settings.check_deadline_seconds)
            await conn.execute(
                "UPDATE health.check_run_nodes SET status = $8, wave = $3, rank = $4, world_size = $5,"
                " rendezvous = $6, started_at = $7, deadline_at = $9 WHERE run_id = $1 AND node_id = $2",
                run_id, node.node_id, wave, rank, world, rendezvous, now, member.status.value, member.deadline)
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
        """The group's other nodes whose agents are alive now (a dead node's listener would fail the
        connectivity test of every node that joins after it)."""
        rows = await store.live_peers(conn, node.group, node.node_id, self.runtime.clock.now(),
                                      timedelta(seconds=self.settings.effective_signal_timeout))
        return [CheckPeer(node_id=r["node_id"], address=r["address"]) for r in rows]

    # -- reports -------------------------------------------------------------------------------------------

    async def on_report(self, conn: asyncpg.Connection, rep: CheckReport) -> list[Request]:
        """Apply one report; returns provisioner requests to make once the transaction has committed."""
        now = self.runtime.clock.now()
        owner = await conn.fetchval("SELECT executor_id FROM health.nodes WHERE node_id = $1", rep.node_id)
        if owner is not None and owner != rep.executor_id:
            # The bus binds the sender's id, not the node: another node's verdict is not this executor's to give.
            await self.runtime.reject(self.s.check(rep.run_id, rep.status, rep.executor_id), rep.encode(),
                                      f"executor {rep.executor_id} reported on node {rep.node_id}, which is "
                                      f"executor {owner}'s")
            return []
        member = _member(await conn.fetchrow("SELECT * FROM health.check_run_nodes WHERE run_id = $1 AND"
                                             " node_id = $2 FOR UPDATE", rep.run_id, rep.node_id))
        result = _result(await conn.fetchrow("SELECT * FROM health.check_results WHERE run_id = $1 AND node_id = $2"
                                             " AND test = $3 FOR UPDATE", rep.run_id, rep.node_id,
                                             rep.test and rep.test.value))
        fact: runs.Fact
        if rep.status == "busy":
            fact = runs.Busy()
        elif rep.status in (CheckStatus.RUNNING, CheckStatus.PENDING):
            fact = runs.Progress(rep.test.value, rep.attempt, CheckStatus(rep.status))
        elif runs.stale_report(member, result, rep.attempt) is not None:  # before judging: no peers to load
            self.stale_reports += 1
            return []
        else:
            fact = runs.Judged(rep.test.value, rep.attempt, await self._judge(conn, rep))
        step = runs.decide(member, result, fact, now, deadline_seconds=self.settings.check_deadline_seconds)
        if step is None or step.ignored is not None:
            self.stale_reports += 1
            return []
        if isinstance(fact, runs.Judged):  # the attempt's figures and verdict are kept, even when it re-runs
            v = fact.verdict
            await conn.execute(
                "UPDATE health.check_results SET figures = $4::jsonb, detail = $5::jsonb, verdict = $6::jsonb,"
                " error = $7, seconds = $8, suite_version = $9 WHERE run_id = $1 AND node_id = $2 AND test = $3",
                rep.run_id, rep.node_id, fact.test, json.dumps(rep.figures), json.dumps(rep.detail, default=str),
                json.dumps({**v.detail(), "attempt": rep.attempt, "rerun": v.rerun}), v.reason, rep.seconds,
                rep.suite_version)
        return await self._apply(conn, step, now)

    async def _judge(self, conn: asyncpg.Connection, rep: CheckReport) -> Verdict:
        """Judged against the group's median over the nodes that may speak for it now (liveness.median_sample)."""
        peers = await store.median_samples(conn, rep.node_id, rep.test.value, self.runtime.clock.now(),
                                           self.settings.sample_rule(rep.suite_version))
        return judge(rep.test.value, CheckStatus(rep.status), rep.figures, peers, rep.attempt,
                     baselines=self.settings.baselines, min_ratio=self.settings.min_ratio, error=rep.error)

    async def _apply(self, conn: asyncpg.Connection, step: runs.Step, now: datetime) -> list[Request]:
        """Write a member's step (its status, results) and carry out its effects."""
        m = step.member
        await conn.execute("UPDATE health.check_run_nodes SET status = $3, wave = $4, deadline_at = $5"
                           " WHERE run_id = $1 AND node_id = $2", m.run_id, m.node_id, m.status.value, m.wave,
                           m.deadline)
        for r in step.results:
            await conn.execute("UPDATE health.check_results SET status = $4, attempt = $5, updated_at = now()"
                               " WHERE run_id = $1 AND node_id = $2 AND test = $3", m.run_id, m.node_id, r.test,
                               r.status.value, r.attempt)
        for effect in step.effects:
            if isinstance(effect, runs.Deferred):
                node, row = await store.load(conn, m.node_id)
                t = lc.decide(node, lc.ChecksDeferred(m.run_id), now, self.policy)
                if isinstance(t, lc.Transition) and t.changed:
                    await store.save(conn, self.s, t, now, seq=row["event_seq"])
            elif isinstance(effect, runs.Rerun):
                await self._rerun(conn, m, CheckTest(effect.test), effect.attempt, effect.whole_wave, now)
            elif isinstance(effect, runs.FinishWave):
                return await self._maybe_finish_wave(conn, m.run_id, m.wave, now)
        return []

    async def _rerun(self, conn: asyncpg.Connection, member: runs.Member, test: CheckTest, attempt: int,
                     whole_wave: bool, now: datetime) -> None:
        """A failed test runs once more; the all-reduce needs its whole wave, so all of it re-runs (each node's
        deadline re-armed)."""
        run_id = member.run_id
        members = await conn.fetch("SELECT * FROM health.check_run_nodes WHERE run_id = $1 AND (node_id = $2 OR"
                                   " ($3 AND wave = $4))", run_id, member.node_id, whole_wave, member.wave)
        force = await conn.fetchval("SELECT force FROM health.check_runs WHERE run_id = $1", run_id)
        deadline = now + timedelta(seconds=self.settings.check_deadline_seconds)
        for m in members:
            await conn.execute("UPDATE health.check_run_nodes SET deadline_at = $3 WHERE run_id = $1 AND"
                               " node_id = $2", run_id, m["node_id"], deadline)
            await conn.execute("UPDATE health.check_results SET status = 'pending', attempt = $4, updated_at = now()"
                               " WHERE run_id = $1 AND node_id = $2 AND test = $3", run_id, m["node_id"], test.value,
                               attempt)
            node = store.node_of(await conn.fetchrow("SELECT * FROM health.nodes WHERE node_id = $1", m["node_id"]))
            directive = RunChecks(run_id=run_id, node_id=node.node_id, executor_id=node.executor_id or "",
                                  tests=[test], attempt=attempt, force=force, peers=await self._peers(conn, node),
                                  rank=m["rank"] or 0, world_size=m["world_size"] or 1, rendezvous=m["rendezvous"])
            await outbox.add(conn, SCHEMA, [(self.s.agent(node.executor_id or "", "check"), directive)])
        log.info("check run %s: %s failed on %s; re-running it once", run_id, test.value, member.node_id)

    async def _maybe_finish_wave(self, conn: asyncpg.Connection, run_id: str, wave: int | None,
                                 now: datetime) -> list[Request]:
        rows = await conn.fetch(
            "SELECT rn.node_id, cr.test, cr.status, cr.attempt, cr.verdict FROM health.check_run_nodes rn"
            " JOIN health.check_results cr USING (run_id, node_id) WHERE rn.run_id = $1 AND rn.wave = $2"
            " ORDER BY rn.node_id, cr.test", run_id, wave)
        per_node: dict[str, list[runs.Result]] = defaultdict(list)
        for r in rows:
            per_node[r["node_id"]].append(runs.Result(r["test"], CheckStatus(r["status"]), r["attempt"],
                                                      json.loads(r["verdict"]).get("reason")))
        outcomes = runs.wave_outcomes(per_node)
        if outcomes is None:
            return []
        failed_verdicts: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
        for r in rows:  # what a drain's reason says: each failed test's verdict (its figures against the bar)
            if r["status"] == CheckStatus.FAILED.value:
                failed_verdicts[r["node_id"]].append((r["test"], json.loads(r["verdict"] or "{}")))
        provision: list[Request] = []
        for node_id, outcome in outcomes.items():
            node, row = await store.load(conn, node_id)
            if outcome.status is CheckStatus.PASSED:
                fact: lc.Fact = lc.ChecksPassed(run_id)
                passed = await conn.fetch(
                    "SELECT test, figures AS f, suite_version FROM health.check_results WHERE run_id = $1 AND"
                    " node_id = $2 AND status = 'passed'", run_id, node_id)
                extra: dict[str, Any] = store.figures_after_pass(row, passed)
            else:
                fact, extra = await self._failed_fact(conn, node, row, run_id, outcome, now), {}
            extra.update(last_check_run_id=run_id, last_check_at=now, last_check_outcome=outcome.status.value)
            t = lc.decide(node, fact, now, self.policy)
            if isinstance(t, lc.Transition):
                await store.save(conn, self.s, t, now, seq=row["event_seq"], extra=extra)
                provision += requests_for(t, failed=failed_verdicts.get(node_id, ()), hostname=row["hostname"],
                                          slurm_job_id=row["slurm_job_id"])
                if outcome.status is CheckStatus.PASSED and node is not None:
                    alert = await guards.alert(conn, node.group)
                    if alert is not None:  # a node passing in a held group is held too
                        await guards.apply_to_group(conn, self.s, node.group, lc.Hold(alert.reason), now)
            await conn.execute("UPDATE health.check_run_nodes SET status = $3, reason = $4, finished_at = $5"
                               " WHERE run_id = $1 AND node_id = $2", run_id, node_id, outcome.status.value,
                               outcome.reason, now)
            log.info("node %s %s check run %s%s", node_id, outcome.status.value, run_id,
                     f": {outcome.reason}" if outcome.reason else "")
        await self._maybe_finish_run(conn, run_id, now)
        return provision

    async def _failed_fact(self, conn: asyncpg.Connection, node: lc.Node | None, row: asyncpg.Record | None,
                           run_id: str, outcome: runs.Outcome, now: datetime) -> lc.Fact:
        """A node failed for good: its group's breaker says whether the usual reboot/replace path may go on."""
        reason = outcome.reason or "failed"
        if node is None or row is None or node.state is not NodeState.CHECKING or node.run_id != run_id:
            return lc.ChecksFailed(run_id, reason)  # old news for the node: the lifecycle ignores it
        guard = await guards.load(conn, node.group)
        d = breaker.decide(guard, breaker.NodeFailed(node.node_id, outcome.failed_tests,
                                                     node.reboots >= self.policy.max_reboots, row["joined_at"]),
                           now, self.settings.breaker)
        assert isinstance(d, breaker.Decision)  # a failure is never refused
        if d.guard != guard:
            await guards.save(conn, d.guard)
        if d.verdict is breaker.Verdict.PROCEED:
            return lc.ChecksFailed(run_id, reason)
        assert d.guard.alert is not None
        if d.verdict is breaker.Verdict.TRIP:
            log.error("ALERT group %s: %s. Nothing in the group is rebooted or replaced and its nodes are held out"
                      " of scheduling until an operator clears it (teto clear-alert %s)", node.group,
                      d.guard.alert.reason, node.group)
            held = await guards.apply_to_group(conn, self.s, node.group, lc.Hold(d.guard.alert.reason), now,
                                               but=node.node_id)  # this one is held by its own failure below
            log.warning("group %s: held %s", node.group, ", ".join(held) or "no other node")
        return lc.ChecksFailed(run_id, reason, hold=d.guard.alert.reason)

    async def _fail_overdue(self, conn: asyncpg.Connection, now: datetime) -> list[Request]:
        """Members whose report missed its deadline fail their unfinished tests (SKIP LOCKED: not overdue yet)."""
        provision: list[Request] = []
        seconds = self.settings.check_deadline_seconds
        for row in await conn.fetch("SELECT * FROM health.check_run_nodes WHERE status IN ('pending', 'running')"
                                    " AND deadline_at <= $1 ORDER BY run_id, node_id FOR UPDATE SKIP LOCKED", now):
            results = [runs.Result(r["test"], CheckStatus(r["status"]), r["attempt"]) for r in await conn.fetch(
                "SELECT test, status, attempt FROM health.check_results WHERE run_id = $1 AND node_id = $2"
                " FOR UPDATE", row["run_id"], row["node_id"])]
            step = runs.decide(_member(row), None, runs.DeadlinePassed(seconds), now, deadline_seconds=seconds,
                               results=results)
            if step is None or step.ignored is not None:
                continue
            for r in step.results:
                await conn.execute(
                    "UPDATE health.check_results SET error = $4, verdict = $5::jsonb WHERE run_id = $1 AND"
                    " node_id = $2 AND test = $3", row["run_id"], row["node_id"], r.test, r.reason,
                    json.dumps({"reason": r.reason, "attempt": r.attempt, "rerun": False, "overdue": True}))
            if step.results:
                self.overdue_reports += 1
                log.warning("check run %s: no report from node %s by its deadline (%gs): %s failed", row["run_id"],
                            row["node_id"], seconds, ", ".join(r.test for r in step.results))
            provision += await self._apply(conn, step, now)
        return provision

    async def _member_failed(self, conn: asyncpg.Connection, run_id: str, node_id: str, reason: str,
                             now: datetime) -> None:
        await conn.execute("UPDATE health.check_run_nodes SET status = 'failed', reason = $3, finished_at = $4"
                           " WHERE run_id = $1 AND node_id = $2", run_id, node_id, reason, now)

    async def _unaddressable(self, conn: asyncpg.Connection, run_id: str, node_id: str, reason: str,
                             now: datetime) -> None:
        """Flag a node that cannot be checked: failed with the reason (logged once: it is not due again)."""
        log.error("node %s %s; the other nodes are checked as usual", node_id, reason)
        await self._member_failed(conn, run_id, node_id, reason, now)
        await store.flag_unaddressable(conn, self.s, node_id, reason, now)

    async def _maybe_finish_run(self, conn: asyncpg.Connection, run_id: str, now: datetime) -> None:
        await conn.execute(
            "UPDATE health.check_runs SET state = 'done', finished_at = $2 WHERE run_id = $1 AND state = 'running'"
            " AND NOT EXISTS (SELECT 1 FROM health.check_run_nodes WHERE run_id = $1"
            "                 AND status NOT IN ('passed', 'failed'))", run_id, now)

    # -- the provisioner hook ------------------------------------------------------------------------------

    async def provision(self, request: Request) -> None:
        """After the commit: the provisioner's part, audited (provisioner.py)."""
        if request.action is Action.REPLACE:  # the replacements asked for (a pass or a drain is no news to keep)
            self.provisioned.append(request.as_dict())
        if await provisioner.carry_out(self.runtime, self.settings, request):
            self.kick()

    # -- commands ------------------------------------------------------------------------------------------

    async def on_command(self, cmd: commands.HealthCommand) -> CommandOutcome:
        return await commands.apply(self, cmd)


def _member(row: asyncpg.Record | None) -> runs.Member | None:
    return None if row is None else runs.Member(row["run_id"], row["node_id"], runs.MemberStatus(row["status"]),
                                                row["wave"], row["deadline_at"])


def _result(row: asyncpg.Record | None) -> runs.Result | None:
    return None if row is None else runs.Result(row["test"], CheckStatus(row["status"]), row["attempt"])


SCHEMA = store.SCHEMA
