"""How ``teto`` prints jobs, executors and events: the tables' columns, ``teto job``'s view of one job (its
folded timeline, live budget, interruption cost, what the runs reported, a failed job's last output lines) and
a job's output made safe for a terminal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .cli_common import _cell, table

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\x80-\x9f]")
JOB_COLUMNS = [("id", "id"), ("name", "name"), ("owner", "owner"), ("state", "state"), ("step", "last_step"),
               ("of", "total_steps"), ("executor", "executor_id"), ("signal", "signal.signal"),
               ("gpu-s", "budget.consumed_seconds"), ("ceiling", "spec.gpu_ceiling_seconds")]
EXECUTOR_COLUMNS = [("executor", "executor_id"), ("node", "node_id"), ("group", "group_name"),
                    ("accepting", "accepting"), ("phase", "phase"), ("job", "job_id"), ("from", "job_source"),
                    ("step", "step"),
                    ("signal", "signal"), ("last heartbeat", "last_heartbeat")]
EVENT_COLUMNS = [("seq", "seq"), ("time", "time"), ("event", "event"), ("state", "state"), ("reason", "reason"),
                 ("executor", "executor_id"), ("epoch", "epoch")]
EVENTS_READ = 200  # the latest events `teto job` asks for: enough that a run of checkpoints hides nothing else
EVENT_ROWS_SHOWN = 20  # rows of its timeline, once runs of checkpoints are folded


def timeline_rows(events: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """The events as ``teto job`` prints them, oldest first, the last ``EVENT_ROWS_SHOWN`` rows: a run of
    checkpoints of one run is one row (``libs/timeline.py``, the panel's fold): its sequence numbers, its count,
    its steps and when the last was. True when earlier events exist than those printed."""
    from libs.timeline import timeline

    folded = timeline(list(events))
    rows = folded["rows"][::-1]
    out = []
    for r in rows[-EVENT_ROWS_SHOWN:]:
        row, steps = dict(r), (r["first_step"], r["last_step"])
        if r["count"] > 1:
            row["seq"], row["event"] = f"{r['seq']}-{r['last_seq']}", f"{r['event']} x{r['count']}"
            row["reason"] = ", ".join(([f"steps {steps[0]}-{steps[1]}"] if None not in steps else [])
                                      + [f"until {r['last_time']}"])
        elif steps[0] is not None and not r["reason"]:
            row["reason"] = f"step {steps[0]}"
        out.append(row)
    return out, folded["earlier"] or len(rows) > EVENT_ROWS_SHOWN


def _eta(ckpt: dict[str, Any]) -> str:
    """The checkpoint ETA, or why there is none (the API's next_eta_status: standing, not_running, ...)."""
    if ckpt.get("next_eta_seconds") is not None:
        return f"{_cell(ckpt['next_eta_seconds'])} s"
    return f"- ({ckpt['next_eta_status'].replace('_', ' ')})" if ckpt.get("next_eta_status") else "- s"


def _kept(kept: Any) -> str:
    """How many checkpoints the job keeps on disk (JobSpec.checkpoints_kept)."""
    if kept is None:
        return "the executor's default kept on disk"
    return "every one kept on disk" if kept == 0 else f"the newest {kept} kept on disk"


def format_job(job: Mapping[str, Any]) -> str:
    attempts = job.get("attempts") or {}
    ckpt = job.get("checkpoint") or {}
    lines = [
        f"job       {job.get('id')}  {job.get('name') or ''}".rstrip(),
        f"state     {job.get('state')}" + (f"  ({job['reason']})" if job.get("reason") else ""),
        f"owner     {_cell(job.get('owner'))}",
        f"executor  {_cell(job.get('executor_id'))}  epoch {_cell(job.get('lease_epoch'))}",
        f"progress  step {_cell(job.get('last_step'))} of {_cell(job.get('total_steps'))}",
        f"attempts  {', '.join(f'{k}={v}' for k, v in attempts.items()) or '-'}",
        f"checkpoint last step {_cell(ckpt.get('last_step'))}, every {_cell(ckpt.get('every_steps'))}, "
        f"next at {_cell(ckpt.get('next_step'))} in {_eta(ckpt)}, "
        f"{_kept((job.get('spec') or {}).get('checkpoints_kept'))}",
    ]
    if job.get("signal"):
        sig = job["signal"]
        lines.append(f"signal    {sig.get('signal')} since {_cell(sig.get('signal_since'))}")
    if job.get("budget"):
        b = job["budget"]
        lines.append(f"budget    {_cell(b.get('consumed_seconds'))} of {_cell(b.get('ceiling_seconds'))} GPU-s, "
                     f"{_cell(b.get('remaining_seconds'))} left, overshoot {_cell(b.get('overshoot_seconds'))}")
        for h in b.get("ceiling_history") or []:
            was = h.get("previous_ceiling_seconds")
            lines.append(f"ceiling   {_cell(h.get('ceiling_seconds'))} GPU-s set by {_cell(h.get('actor'))} at "
                         f"{_cell(h.get('at'))} ({_cell(h.get('consumed_seconds'))} consumed then"
                         + (f"; from {_cell(was)})" if was is not None else ")"))
        if b.get("warning"):
            w = b["warning"]
            lines.append(f"warning   {w.get('reason') if isinstance(w, Mapping) and w.get('reason') else _cell(w)}")
    lines += live_lines(job)
    if job.get("error"):
        lines.append(f"error     {job['error']}")
    if job.get("log_tail"):
        lines += tail_lines(job["log_tail"])
    if job.get("events"):
        rows, earlier = timeline_rows(job["events"])
        lines += ["", table(rows, EVENT_COLUMNS)]
        if earlier:
            lines.append(f"(earlier events: GET /v1/jobs/{job.get('id')}/events)")
    return "\n".join(lines)


def live_lines(job: Mapping[str, Any]) -> list[str]:
    """``teto job`` lines for the provisional budget, the interruption cost and what the runs reported (absent
    fields: no lines)."""
    lines = []
    b = job.get("budget") or {}
    if b.get("provisional_seconds"):
        lines.append(f"live      {_cell(b.get('consumed_live_seconds'))} GPU-s = {_cell(b.get('consumed_seconds'))}"
                     f" in the ledger + {_cell(b.get('provisional_seconds'))} provisional (running since "
                     f"{_cell(b.get('provisional_since'))}, not yet reported)")
    cost = job.get("interruption_cost")
    if cost:
        what = "lost" if cost.get("kind") == "lost" else "at risk"
        steps = cost.get("steps")
        lines.append(f"{what:<9} {_cell(steps)} step{'' if steps == 1 else 's'} and {_cell(cost.get('gpu_seconds'))}"
                     " GPU-s since "
                     f"the last checkpoint (step {_cell(cost.get('checkpoint_step'))})")
    reported = job.get("reported")
    if reported:
        lines.append(f"reported  step {_cell(reported.get('step'))}: loss {_cell(reported.get('loss'))}, learning rate "
                     f"{_cell(reported.get('learning_rate'))}")
    for c in (job.get("checkpoints") or [])[:1]:
        lines.append(f"last ckpt step {_cell(c.get('step'))}: a {c.get('kind')} of {_cell(c.get('bytes'))} bytes"
                     + (f" in {c.get('files')} files" if c.get("kind") == "directory" else ""))
    return lines


def terminal_safe(text: str) -> str:
    """Control characters (escape sequences, bells, C1) shown as ``\\xNN``; newline, tab and CR kept."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def tail_lines(tail: Mapping[str, Any]) -> list[str]:
    """A failed job's ``log_tail`` as ``teto job`` shows it (escaped: this is a job's output on a terminal)."""
    status = tail.get("exit_code")
    head = (f"output    last lines of attempt {tail.get('attempt')} rank {tail.get('rank')}"
            + (f" (exit status {status})" if status is not None else "") + "; all: teto logs <job-id>")
    return [head, *(f"  {'!' if line.get('stream') == 'stderr' else ' '} {terminal_safe(str(line.get('text')))}"
                    for line in tail.get("lines") or [])]
