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

This module only orchestrates: the rows are read and written by the store (store/nodes.py, check_runs.py,
guards.py), every decision is a pure rule (domain/runs.py, nodes.py, breaker.py, verdicts.py).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from libs.contracts.commands import CommandOutcome
from libs.contracts.envelope import new_id
from libs.contracts.nodes import ALL_TESTS, CheckPeer, CheckReport, CheckStatus, CheckTest, NodeRegistered, RunChecks
from libs.runtime.service import Runtime

from . import commands, provisioner
from .domain import breaker
from .domain import nodes as lc
from .domain import runs
from .domain.provisioning import Action, Request, requests_for
from .domain.verdicts import Verdict, judge
from .settings import HealthSettings
from .store import check_runs, guards, nodes

log = logging.getLogger(__name__)
SERVICE = "health"


def _no_kick() -> None:
    """Without a relay (a test driving the loop alone): directives wait for the relay's own poll."""


class Checks:
    def __init__(self, runtime: Runtime, settings: HealthSettings, *, kick: Callable[[], None] = _no_kick) -> None:
        self.runtime = runtime
        self.settings = settings
        self.kick = kick  # the outbox relay's: directives should go out at once
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
        node, row = await nodes.load(conn, reg.node_id)
        t = lc.decide(node, lc.Registered(reg.node_id, reg.executor_id, reg.group, reg.boot_id), now, self.policy)
        assert isinstance(t, lc.Transition)  # registration is never refused
        extra = {"address": reg.address, "collective_port": reg.collective_port, "hostname": reg.hostname,
                 "gpus": [g.model_dump(mode="json") for g in reg.gpus], "registered_at": reg.time,
                 "slurm_job_id": reg.slurm_job_id}
        if row is None or row["joined_at"] is None:
            extra["joined_at"] = now  # the service's clock, like the breaker's replacement times
        await nodes.save(conn, self.s, t, now, seq=row["event_seq"] if row else 0, extra=extra,
                         needs_check=True if t.schedules_checks else None)

    # -- the check loop ------------------------------------------------------------------------------------

    async def tick(self) -> int:
        """Start what is due (joining nodes past their batch wait, cordoned or queued nodes now idle), fail the
        members whose report is overdue, and mark gone the nodes no heartbeat followed."""
        now = self.runtime.clock.now()
        started = 0
        async with self.runtime.pool.acquire() as conn, conn.transaction():
            provision = await self._fail_overdue(conn, now)
            await nodes.mark_gone(conn, self.s, now, self.settings.node_gone_seconds)
            # Joining nodes are read unlocked, and a group's locked only once its join run is due (and judged
            # again on the locked rows): locking every joining node each tick made every registration wait for
            # the tick, and a fleet registering at once fell tens of seconds behind (issue 12).
            batch = self.settings.join_batch_seconds
            for group in runs.due_groups(await nodes.joining(conn), now, batch):
                rows = await nodes.lock_joining(conn, group)
                if not runs.join_run_due([r["since"] for r in rows], now, batch):
                    continue
                run_id = new_id()
                await check_runs.new_run(conn, run_id, runs.run_kind([r["reboots"] for r in rows]), group, None,
                                         list(ALL_TESTS), False, now)
                await check_runs.add_members(conn, run_id, [r["node_id"] for r in rows])
                await nodes.checks_scheduled(conn, [r["node_id"] for r in rows])
            # Every waiting node that may start now, per run: idle (no job per its heartbeats), or forced.
            by_run: dict[str, list[asyncpg.Record]] = defaultdict(list)
            for w in await check_runs.startable(conn):
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

    async def _start_wave(self, conn: asyncpg.Connection, run_id: str, node_ids: list[str], tests: list[CheckTest],
                          force: bool, now: datetime) -> int:
        wave = await check_runs.next_wave(conn, run_id)
        members: list[tuple[lc.Node, asyncpg.Record]] = []
        for node_id in node_ids:
            try:
                async with conn.transaction():  # a savepoint: one node that cannot start never stops the others
                    node, row = await nodes.load(conn, node_id)
                    t = lc.decide(node, lc.ChecksStarted(run_id), now, self.policy)
                    if isinstance(t, lc.Refusal):
                        await check_runs.finish_member(conn, run_id, node_id, CheckStatus.FAILED,
                                                       f"not checked: {t.reason}", now)
                        continue
                    self.s.agent(t.node.executor_id or "", "check")  # its directive must be addressable
                    await nodes.save(conn, self.s, t, now, seq=row["event_seq"])
                    members.append((t.node, row))
            except Exception as exc:  # noqa: BLE001 - isolated: this node is flagged, the others go on
                await self._unaddressable(conn, run_id, node_id, f"cannot be checked: {exc}", now)
        if not members:
            await self._maybe_finish_run(conn, run_id, now)
            return 0
        world = len(members)
        rendezvous = runs.rendezvous(members[0][1]["address"], members[0][1]["collective_port"], world)
        for rank, (node, row) in enumerate(members):
            member = runs.started(runs.Member(run_id, node.node_id, runs.MemberStatus.WAITING), wave, now,
                                  self.settings.check_deadline_seconds)
            await check_runs.start_member(conn, member, rank, world, rendezvous, now)
            await check_runs.reset_results(conn, run_id, node.node_id, tests)
            directive = RunChecks(run_id=run_id, node_id=node.node_id, executor_id=node.executor_id or "",
                                  tests=tests, force=force, peers=await self._peers(conn, node), rank=rank,
                                  world_size=world, rendezvous=rendezvous)
            await check_runs.send(conn, [(self.s.agent(node.executor_id or "", "check"), directive)])
        log.info("check run %s wave %d started on %s", run_id, wave, ", ".join(n.node_id for n, _ in members))
        return len(members)

    async def _peers(self, conn: asyncpg.Connection, node: lc.Node) -> list[CheckPeer]:
        """The group's other nodes whose agents are alive now (a dead node's listener would fail the
        connectivity test of every node that joins after it)."""
        rows = await nodes.live_peers(conn, node.group, node.node_id, self.runtime.clock.now(),
                                      timedelta(seconds=self.settings.effective_signal_timeout))
        return [CheckPeer(node_id=r["node_id"], address=r["address"]) for r in rows]

    # -- reports -------------------------------------------------------------------------------------------

    async def on_report(self, conn: asyncpg.Connection, rep: CheckReport) -> list[Request]:
        """Apply one report; returns provisioner requests to make once the transaction has committed."""
        now = self.runtime.clock.now()
        owner = await nodes.owner(conn, rep.node_id)
        if owner is not None and owner != rep.executor_id:
            # The bus binds the sender's id, not the node: another node's verdict is not this executor's to give.
            await self.runtime.reject(self.s.check(rep.run_id, rep.status, rep.executor_id), rep.encode(),
                                      f"executor {rep.executor_id} reported on node {rep.node_id}, which is "
                                      f"executor {owner}'s")
            return []
        test = rep.test and rep.test.value
        member = await check_runs.lock_member(conn, rep.run_id, rep.node_id)
        result = await check_runs.lock_result(conn, rep.run_id, rep.node_id, test)
        fact: runs.Fact | None = runs.unjudged_fact(rep.status, test, rep.attempt)
        if fact is None:
            if runs.stale_report(member, result, rep.attempt) is not None:  # before judging: no peers to load
                self.stale_reports += 1
                return []
            fact = runs.Judged(rep.test.value, rep.attempt, await self._judge(conn, rep))
        step = runs.decide(member, result, fact, now, deadline_seconds=self.settings.check_deadline_seconds)
        if step is None or step.ignored is not None:
            self.stale_reports += 1
            return []
        if isinstance(fact, runs.Judged):  # the attempt's figures and verdict are kept, even when it re-runs
            await check_runs.record_attempt(conn, rep, fact.test, runs.judged_verdict(fact.verdict, rep.attempt),
                                            fact.verdict.reason)
        return await self._apply(conn, step, now)

    async def _judge(self, conn: asyncpg.Connection, rep: CheckReport) -> Verdict:
        """Judged against the group's median over the nodes that may speak for it now (liveness.median_sample)."""
        peers = await nodes.median_samples(conn, rep.node_id, rep.test.value, self.runtime.clock.now(),
                                           self.settings.sample_rule(rep.suite_version))
        return judge(rep.test.value, CheckStatus(rep.status), rep.figures, peers, rep.attempt,
                     baselines=self.settings.baselines, min_ratio=self.settings.min_ratio, error=rep.error)

    async def _apply(self, conn: asyncpg.Connection, step: runs.Step, now: datetime) -> list[Request]:
        """Write a member's step (its status, results) and carry out its effects."""
        m = step.member
        await check_runs.save_member(conn, m)
        await check_runs.save_results(conn, m.run_id, m.node_id, step.results)
        for effect in step.effects:
            if isinstance(effect, runs.Deferred):
                node, row = await nodes.load(conn, m.node_id)
                t = lc.decide(node, lc.ChecksDeferred(m.run_id), now, self.policy)
                if isinstance(t, lc.Transition) and t.changed:
                    await nodes.save(conn, self.s, t, now, seq=row["event_seq"])
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
        members = await check_runs.wave_members(conn, run_id, member.node_id, whole_wave, member.wave)
        force = await check_runs.force(conn, run_id)
        deadline = runs.deadline_of(now, self.settings.check_deadline_seconds)
        for m in members:
            await check_runs.rearm(conn, run_id, m["node_id"], deadline)
            await check_runs.save_results(conn, run_id, m["node_id"], [runs.Result(test.value, CheckStatus.PENDING,
                                                                                    attempt)])
            node = await nodes.node(conn, m["node_id"])
            directive = RunChecks(run_id=run_id, node_id=node.node_id, executor_id=node.executor_id or "",
                                  tests=[test], attempt=attempt, force=force, peers=await self._peers(conn, node),
                                  rank=m["rank"] or 0, world_size=m["world_size"] or 1, rendezvous=m["rendezvous"])
            await check_runs.send(conn, [(self.s.agent(node.executor_id or "", "check"), directive)])
        log.info("check run %s: %s failed on %s; re-running it once", run_id, test.value, member.node_id)

    async def _maybe_finish_wave(self, conn: asyncpg.Connection, run_id: str, wave: int | None,
                                 now: datetime) -> list[Request]:
        rows = await check_runs.wave_results(conn, run_id, wave)
        outcomes = runs.wave_outcomes(runs.by_node((node_id, result) for node_id, result, _ in rows))
        if outcomes is None:
            return []
        failed_verdicts = runs.failed_verdicts(rows)
        provision: list[Request] = []
        for node_id, outcome in outcomes.items():
            node, row = await nodes.load(conn, node_id)
            if outcome.status is CheckStatus.PASSED:
                fact: lc.Fact = lc.ChecksPassed(run_id)
                extra: dict[str, Any] = nodes.figures_after_pass(row, await check_runs.passed_figures(conn, run_id,
                                                                                                    node_id))
            else:
                fact, extra = await self._failed_fact(conn, node, row, run_id, outcome, now), {}
            extra.update(last_check_run_id=run_id, last_check_at=now, last_check_outcome=outcome.status.value)
            t = lc.decide(node, fact, now, self.policy)
            if isinstance(t, lc.Transition):
                await nodes.save(conn, self.s, t, now, seq=row["event_seq"], extra=extra)
                provision += requests_for(t, failed=failed_verdicts.get(node_id, ()), hostname=row["hostname"],
                                          slurm_job_id=row["slurm_job_id"])
                if outcome.status is CheckStatus.PASSED and node is not None:
                    alert = await guards.alert(conn, node.group)
                    if alert is not None:  # a node passing in a held group is held too
                        await nodes.apply_to_group(conn, self.s, node.group, lc.Hold(alert.reason), now)
            await check_runs.finish_member(conn, run_id, node_id, outcome.status, outcome.reason, now)
            log.info("node %s %s check run %s%s", node_id, outcome.status.value, run_id,
                     f": {outcome.reason}" if outcome.reason else "")
        await self._maybe_finish_run(conn, run_id, now)
        return provision

    async def _failed_fact(self, conn: asyncpg.Connection, node: lc.Node | None, row: asyncpg.Record | None,
                           run_id: str, outcome: runs.Outcome, now: datetime) -> lc.Fact:
        """A node failed for good: its group's breaker says whether the usual reboot/replace path may go on."""
        reason = outcome.reason or "failed"
        if node is None or row is None or not runs.breaker_applies(node, run_id):
            return runs.failed_fact(run_id, reason, None)  # old news for the node: the lifecycle ignores it
        guard = await guards.load(conn, node.group)
        d = breaker.decide(guard, breaker.NodeFailed(node.node_id, outcome.failed_tests,
                                                     node.reboots >= self.policy.max_reboots, row["joined_at"]),
                           now, self.settings.breaker)
        assert isinstance(d, breaker.Decision)  # a failure is never refused
        if d.guard != guard:
            await guards.save(conn, d.guard)
        if d.verdict is breaker.Verdict.TRIP:
            assert d.guard.alert is not None
            log.error("ALERT group %s: %s. Nothing in the group is rebooted or replaced and its nodes are held out"
                      " of scheduling until an operator clears it (teto clear-alert %s)", node.group,
                      d.guard.alert.reason, node.group)
            held = await nodes.apply_to_group(conn, self.s, node.group, lc.Hold(d.guard.alert.reason), now,
                                              but=node.node_id)  # this one is held by its own failure below
            log.warning("group %s: held %s", node.group, ", ".join(held) or "no other node")
        return runs.failed_fact(run_id, reason, d)

    async def _fail_overdue(self, conn: asyncpg.Connection, now: datetime) -> list[Request]:
        """Members whose report missed its deadline fail their unfinished tests (SKIP LOCKED: not overdue yet)."""
        provision: list[Request] = []
        seconds = self.settings.check_deadline_seconds
        for member in await check_runs.lock_overdue(conn, now):
            results = await check_runs.lock_results(conn, member.run_id, member.node_id)
            step = runs.decide(member, None, runs.DeadlinePassed(seconds), now, deadline_seconds=seconds,
                               results=results)
            if step is None or step.ignored is not None:
                continue
            for r in step.results:
                await check_runs.record_overdue(conn, member.run_id, member.node_id, r, runs.overdue_verdict(r))
            if step.results:
                self.overdue_reports += 1
                log.warning("check run %s: no report from node %s by its deadline (%gs): %s failed", member.run_id,
                            member.node_id, seconds, ", ".join(r.test for r in step.results))
            provision += await self._apply(conn, step, now)
        return provision

    async def _unaddressable(self, conn: asyncpg.Connection, run_id: str, node_id: str, reason: str,
                             now: datetime) -> None:
        """Flag a node that cannot be checked: failed with the reason (logged once: it is not due again)."""
        log.error("node %s %s; the other nodes are checked as usual", node_id, reason)
        await check_runs.finish_member(conn, run_id, node_id, CheckStatus.FAILED, reason, now)
        await nodes.flag_unaddressable(conn, self.s, node_id, reason, now)

    async def _maybe_finish_run(self, conn: asyncpg.Connection, run_id: str, now: datetime) -> None:
        if runs.run_finished(await check_runs.member_statuses(conn, run_id)):
            await check_runs.finish_run(conn, run_id, now)

    # -- the provisioner hook ------------------------------------------------------------------------------

    async def provision(self, request: Request) -> None:
        """After the commit: the provisioner's part, audited (provisioner.py)."""
        if request.action is Action.REPLACE:  # the replacements asked for (a pass or a drain is no news to keep)
            self.provisioned.append(request.as_dict())
        if await provisioner.carry_out(self.runtime, self.settings, request):
            self.kick()

    # -- commands ------------------------------------------------------------------------------------------

    async def on_command(self, cmd: commands.HealthCommand) -> CommandOutcome:
        """Applied and answered in one transaction (commands.py); then the relay is kicked and the provisioner's
        part carried out."""
        outcome, after = await commands.apply(self.runtime, self.policy, self.settings.breaker, cmd)
        self.kick()
        for request in after:
            await self.provision(request)
        return outcome
