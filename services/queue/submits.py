"""Submits decided a fetched batch at a time: one transaction, one outbox flush, and one statement per kind of
read or write for the whole batch (the claims, the stored outcomes of repeats, the gang policy, the
organisations and projects, the jobs, their events and outbox rows, the recorded outcomes).

Every guarantee of deciding one at a time holds per submit: each is decided once per ``command_id`` (a repeat,
in this batch or from before, is answered again with the stored outcome); a refusal is that submit's alone;
outcomes leave through the outbox after the commit; each submit is traced in its sender's trace and logged
with its own line. If the batch's transaction fails, the edge applies each message alone
(libs/runtime/edge.py), so one poisoned submit cannot hold back the others and is dead-lettered as before.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from datetime import datetime

from libs.contracts.commands import CommandOutcome, SubmitJob
from libs.contracts.envelope import Envelope
from libs.runtime import commands as once
from libs.runtime import outbox, tracing
from libs.runtime.unit import Units

from . import executors, policy, store, tenancy_edge
from .domain.lifecycle import Job, Submitted, Transition, decide
from .domain.submits import environments_named, first_of_each, needs_policy, submit_refusal, with_org_limits
from .effects import answer_of, messages_for
from .settings import QueueSettings

log = logging.getLogger(__name__)


async def decide_submits(units: Units, settings: QueueSettings, cmds: Sequence[SubmitJob],
                         now: datetime) -> list[CommandOutcome]:
    """Decide ``cmds`` in one transaction; the outcome of each, in the order given.

    Tracing: a lone submit's span holds its transaction, as when each submit was decided alone. In a batch the
    transaction is shared by several traces and belongs to none: each submit's span (its decision, its outbox
    rows, the trace its job's grants continue) sits inside it."""
    if len(cmds) == 1:
        with tracing.continued(tracing.of(cmds[0]), "queue submit", command_id=cmds[0].command_id):
            return await _decide(units, settings, cmds, now, spans=False)
    return await _decide(units, settings, cmds, now, spans=True)


async def _decide(units: Units, settings: QueueSettings, cmds: Sequence[SubmitJob], now: datetime, *,
                  spans: bool) -> list[CommandOutcome]:
    subjects = settings.subjects
    first = first_of_each([c.command_id for c in cmds])
    firsts = [cmds[i] for i in first]
    repeats = [c for i, c in enumerate(cmds) if i not in set(first)]
    outcomes: dict[str, CommandOutcome] = {}
    async with units.begin() as unit:
        conn = unit.conn
        # Claimed in id order: two replicas claiming overlapping batches wait on each other, never in a cycle.
        claimed = await once.claim_many(conn, store.SCHEMA, sorted((c.command_id, c.KIND) for c in firsts))
        new = [c for c in firsts if c.command_id in claimed]
        stored = await once.stored_outcomes(conn, store.SCHEMA, [c.command_id for c in firsts
                                                                 if c.command_id not in claimed])
        gang_policy = await policy.load(conn) if needs_policy(c.spec for c in new) else None
        targets = await tenancy_edge.submit_targets(conn, [(c.org, c.spec.project) for c in new])
        offered = await executors.offered_environments(conn, environments_named(c.spec for c in new))
        refusals = {c.command_id: r for c in new
                    if (r := submit_refusal(c.spec, c.org, gang_policy, targets, offered))}
        to_decide = sorted({c.job_id for c in new if c.command_id not in refusals})
        jobs: dict[str, Job] = await store.load_jobs(conn, to_decide, lock=True) if to_decide else {}
        staged: list[store.Staged] = []
        rows: list[outbox.OutboxRow] = []
        records: list[tuple[str, CommandOutcome, str | None]] = []
        traces: list[tuple[str, dict[str, str]]] = []
        for cmd in firsts:
            with (tracing.continued(tracing.of(cmd), "queue submit", command_id=cmd.command_id) if spans
                  else contextlib.nullcontext()):
                if cmd.command_id not in claimed:
                    outcome = once.again_outcome(stored.get(cmd.command_id), cmd.command_id, cmd.KIND)
                    rows += outbox.rows_of([(subjects.outcome(cmd.KIND, cmd.command_id), outcome)])
                    log.info("submit %s seen again: answered with the stored outcome", cmd.command_id)
                else:
                    spec = with_org_limits(cmd.spec, targets.get((cmd.org, cmd.spec.project)))
                    fact = Submitted(cmd.job_id, cmd.spec.name, cmd.actor, spec, cmd.org)
                    result = refusals.get(cmd.command_id) or decide(jobs.get(cmd.job_id), fact, now)
                    outcome = answer_of(cmd, cmd.job_id, result)
                    answer = (subjects.outcome(cmd.KIND, cmd.command_id), outcome)
                    if isinstance(result, Transition):
                        jobs[cmd.job_id] = result.job  # a second submit of this job id in the batch is refused
                        messages: list[tuple[str, Envelope]] = [*messages_for(result.job, result, settings), answer]
                        staged.append(store.stage(subjects, result, now, messages))
                        traces.append((cmd.job_id, tracing.carrier()))
                    else:
                        rows += outbox.rows_of([answer])
                    records.append((cmd.command_id, outcome, cmd.job_id))
                    log.info("submit %s for job %s: %s", cmd.command_id, cmd.job_id,
                             "accepted" if outcome.accepted else f"refused ({outcome.reason})")
            outcomes[cmd.command_id] = outcome
        await store.write_staged(conn, subjects, staged, new=True)
        await store.remember_traces(conn, traces)
        await once.record_many(conn, store.SCHEMA, records)
        # A command id twice in this batch: the second is answered like a redelivery, with a message of its own.
        for cmd in repeats:
            log.info("submit %s seen again in its batch: answered with the first's outcome", cmd.command_id)
            again = once.again_outcome(outcomes[cmd.command_id].model_dump(mode="json"), cmd.command_id, cmd.KIND)
            rows += outbox.rows_of([(subjects.outcome(cmd.KIND, cmd.command_id), again)])
        await outbox.add_rows(conn, store.SCHEMA, rows)
    return [outcomes[c.command_id] for c in cmds]
