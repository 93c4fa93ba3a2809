"""The control plane's own words on the panel's pages, in the page's language. Pure.

The queue, the gateway, the health checks and the log store write codes and short English sentences into what the
panel shows: a job's reason and its timeline's (``transport_lost``, ``lease expired``, ``stopped by executor``,
``handed back: busy``), the audit log's command kinds and refusal reasons (``role 'viewer' lacks permission
'finetune:manage'``), the queue's waiting sentence (``behind 3 jobs of higher priority ...``), the figures a check
measured (``rel_error_bfloat16``, ``max_rtt_ms``); the markers in a job's output (``[teto: attempt 1 rank 0 ended:
exit status 143]``) are said by the page's script from the chunk's fields (static/job.js, ``terms.log_*``). Each is said here through the catalogue (``i18n/<locale>/terms.json``): a code by its
key, a sentence by the pattern that recognises it, whose captured parts (ids, numbers, names, a person's or a
program's own text) are kept as they are. What no pattern recognises is not the control plane's sentence (a
cancel reason typed by a person, a training's error) and is shown as written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from . import fmt, i18n

_CODE = re.compile(r"[a-z][a-z0-9_]*")

# A job's or an event's reason: (pattern over the whole reason, terms key). Codes first (below), then these.
REASONS: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p, re.S), k) for p, k in (
    (r"lease expired", "reason_lease_expired"),
    (r"stopped by executor", "reason_stopped_by_executor"),
    (r"abandoned", "reason_abandoned"),
    (r"every worker lost a peer", "reason_peer_lost"),
    (r"stop already requested", "reason_stop_already_requested"),
    (r"cancelled by operator", "reason_cancelled_by_operator"),
    (r"drained by operator", "reason_drained_by_operator"),  # a node's (routes/nodes.py's default)
    (r"cordoned for run (?P<run>\S+)", "reason_cordoned"),
    (r"training failed", "reason_training_failed"),
    (r"exit code (?P<code>-?\d+)", "reason_exit_code"),
    (r"exit status (?P<code>-?\d+)(?P<tail>: .*)?", "reason_exit_status"),  # the agent's (run.py), then stderr
    (r"killed by signal (?P<signal>\d+)(?P<tail>: .*)?", "reason_killed"),
    (r"handed back: (?P<why>.*)", "reason_handed_back"),
    (r"not started: (?P<why>.*)", "reason_not_started"),  # a hand-back's error (agents/executor/agent.py)
    (r"the executor is busy with job (?P<job>\S+)", "reason_busy_with"),
    (r"node failed: (?P<why>.*)", "reason_node_failed"),
    (r"undeliverable: (?P<why>.*)", "reason_undeliverable"),
))

# The audit log's refusal reasons (the gateway's and the queue's), same shape.
AUDIT_REASONS: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p, re.S), k) for p, k in (
    (r"role '(?P<role>[^']*)' lacks permission '(?P<permission>[^']*)'", "audit_lacks_permission"),
    (r"job (?P<job>\S+) belongs to '(?P<owner>[^']*)'; cancelling it needs '(?P<permission>[^']*)'",
     "audit_not_owner_cancel"),
    (r"missing or wrong CSRF token \(X-CSRF-Token\) for a request made with a panel session", "audit_csrf"),
    (r"no such (?P<what>job|node|group|run|organisation|project): (?P<id>.*)", "audit_no_such"),
    (r"only an interrupted job can be requeued; this job is (?P<state>[a-z_]+)", "audit_requeue_not_interrupted"),
    (r"new ceiling (?P<given>[\d.e+]+)s is below consumed \+ (?P<margin>[\d.e+]+)s = (?P<minimum>[\d.e+]+)s",
     "audit_requeue_too_low"),
    (r"job already (?P<state>[a-z_]+)", "audit_job_already"),
    (r"a job with this id already exists", "audit_job_exists"),
    (r"unknown or revoked token", "audit_unknown_token"),
))

# The queue's waiting sentence (tenancy/placement_pass.py, quota.py): a pattern each; the code's words stay beside it.
WAITING: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p), k) for p, k in (
    (r"no ready node has (?P<gpus>\d+) GPUs", "wait_no_ready_node"),
    (r"no ready node offering the Python environment (?P<environment>.+) has (?P<gpus>\d+) GPUs",
     "wait_no_ready_node_environment"),
    (r"no ready node offers the Python environment (?P<environment>.+) \(prepare it on a node with teto env "
     r"create and list it in its TETO_ENVIRONMENTS\)", "wait_no_environment"),
    (r"gang cannot fit: (?P<workers>\d+) workers of (?P<gpus>\d+) GPUs, at most (?P<most>\d+) (?P<rest>.*)",
     "wait_gang_cannot_fit"),
    (r"behind (?P<ahead>\d+) jobs of higher priority or fair share: no free node of (?P<gpus>\d+) GPUs for "
     r"(?P<workers>\d+) worker\(s\) now", "wait_behind"),
    (r"organisation (?P<org>\S+) does not exist", "wait_no_organisation"),
    (r"no quota: organisation (?P<org>\S+) has no share of node group (?P<group>\S+)", "wait_no_quota"),
    (r"quota: organisation (?P<org>\S+) holds (?P<now>\d+) of its (?P<ceiling>\d+) devices in node group "
     r"(?P<group>\S+) \(nominal (?P<nominal>\d+) \+ borrowing (?P<borrowing>\d+)\), job needs (?P<demand>\d+)",
     "wait_quota"),
    (r"cohort (?P<cohort>\S+): (?P<used>\d+) of the (?P<total>\d+) shared devices of node group (?P<group>\S+) "
     r"are in use, job needs (?P<extra>\d+) of them", "wait_cohort"),
    (r"cohort (?P<cohort>\S+): node group (?P<group>\S+) is reclaimed by organisation (?P<org>\S+) within its "
     r"nominal share", "wait_cohort_reclaimed"),
    (r"reclaiming (?P<need>\d+) devices of node group (?P<group>\S+) by preemption of borrowed capacity "
     r"\((?P<stopped>\d+) job\(s\) preempted for it\)", "wait_reclaiming"),
))

# A check's own words for a test that does not apply (agents/executor/checks/suite.py), same shape; a failing
# test's error (what went wrong, in the check's words) is shown as written.
CHECK_ERRORS: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p), k) for p, k in (
    (r"nvidia-ml-py is not installed: no NVML readings", "check_no_nvml"),
    (r"no NVIDIA GPU on this node \((?P<why>[\w.]+)\)", "check_no_gpu"),
    (r"no other node in the group to reach", "check_no_peer"),
    (r"a single node in this run: no collective to measure", "check_single_node"),
))

# The control plane's problems as GET /v1/status words them (services/gateway/domain/status.py), same shape.
PROBLEMS: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p, re.S), k) for p, k in (
    (r"(?P<count>\d+) executor\(s\) without signal", "problem_no_signal"),
    (r"(?P<service>\S+): no replica answered", "problem_no_replica"),
    (r"(?P<service>\S+): nobody holds singleton (?P<lock>\S+)", "problem_nobody_holds"),
    (r"(?P<service>\S+): singleton (?P<lock>\S+) held by (?P<count>\d+) replicas: (?P<holders>.*)", "problem_held_twice"),
    (r"(?P<service>\S+): replica (?P<instance>\S+) did not answer \(last seen (?P<seconds>\d+) s ago\)",
     "problem_replica_silent"),
    (r"(?P<service>\S+): replica (?P<instance>\S+) serves no metrics: (?P<why>.*)", "problem_no_metrics"),
    (r"nats member (?P<member>.+?) did not answer: (?P<why>.*)", "problem_nats_member"),
    (r"stream (?P<stream>\S+): no leader", "problem_no_leader"),
    (r"stream (?P<stream>\S+): replica on (?P<peer>\S+) is offline", "problem_replica_offline"),
    (r"stream (?P<stream>\S+): replica on (?P<peer>\S+) is behind \((?P<lag>\d+) operations\)",
     "problem_replica_behind"),
    (r"stream (?P<stream>\S+): (?P<have>\d+) of (?P<want>\d+) replicas", "problem_replicas_missing"),
    (r"stream (?P<stream>\S+): info failed: (?P<why>.*)", "problem_stream_info"),
    (r"database unreachable: (?P<why>.*)", "problem_database"),
    (r"NATS: (?P<why>.*)", "problem_nats"),
))

# Figures a check measures whose name is not in the nodes page's own table (fleet.metric_label).
METRIC_PREFIXES = ("rel_error_", "gpu")


def _say(locale: str, key: str, values: Mapping[str, Any]) -> str:
    return i18n.translate(locale, f"terms.{key}", **values)


def _match(table: tuple[tuple[re.Pattern[str], str], ...], text: str) -> tuple[str, dict[str, str]] | None:
    for pattern, key in table:
        found = pattern.fullmatch(text)
        if found:
            return key, found.groupdict()
    return None


def reason(text: str | None, locale: str) -> str:
    """A job's or a timeline event's reason: a code (``transport_lost``, ``gpu_ceiling``) or a known sentence in
    the page's words; anything else (a person's cancel reason, a training's error) as written."""
    if not text:
        return ""
    words = i18n.catalogue(locale)
    if _CODE.fullmatch(text):
        for key in (f"terms.reason_{text}", f"job.reason_{text}", f"job.cause_{text}", f"common.state_{text}"):
            if key in words:
                return words[key]
    found = _match(REASONS, text)
    if found:
        key, values = found
        if "why" in values:
            values["why"] = reason(values["why"], locale)
        if "tail" in values:
            values["tail"] = values["tail"] or ""
        return _say(locale, key, values)
    return text


def audit_kind(kind: str | None, locale: str) -> str | None:
    """A command kind of the audit log (``requeue``, ``drain_node``) in words; an unknown one as written."""
    if not kind:
        return None
    return i18n.catalogue(locale).get(f"terms.kind_{kind}", kind)


def audit_reason(text: str | None, locale: str) -> str:
    """An audit row's reason: a known refusal in the page's words, else as written."""
    if not text:
        return ""
    found = _match(AUDIT_REASONS, text)
    if found is None:
        return reason(text, locale)
    key, values = found
    words = i18n.catalogue(locale)
    if "state" in values:
        values["state"] = words.get(f"common.state_{values['state']}", values["state"])
    if "role" in values:
        values["role"] = words.get(f"common.role_{values['role']}", values["role"])
    if "what" in values:
        values["what"] = words.get(f"terms.thing_{values['what']}", values["what"])
    for name in ("given", "margin", "minimum"):
        if name in values:
            values[name] = fmt.compact(float(values[name]), locale)
    return _say(locale, key, values)


def problem(text: str | None, locale: str) -> str:
    """A problem of the control plane (GET /v1/status) in the page's words; the errors it quotes as written."""
    if not text:
        return ""
    found = _match(PROBLEMS, text)
    return text if found is None else _say(locale, *found)


def check_error(text: str | None, locale: str) -> str:
    """A check's error: a test that does not apply, in the page's words; a failure's own text as written."""
    if not text:
        return ""
    found = _match(CHECK_ERRORS, text)
    return text if found is None else _say(locale, *found)


def waiting(wait: Mapping[str, Any] | None, locale: str) -> str | None:
    """The queue's sentence of why a job waits, in the page's words; None when it has none or no pattern knows it
    (the code's words, shown beside, then say it alone)."""
    text = (wait or {}).get("reason")
    if not text:
        return None
    if locale == "en":
        return text
    found = _match(WAITING, str(text))
    return None if found is None else _say(locale, *found)


def metric(name: str, locale: str) -> str:
    """A check's figure the nodes page has no name for (``rel_error_bfloat16``, ``max_rtt_ms``, ``gpu0_temp_c``)."""
    words = i18n.catalogue(locale)
    if f"terms.metric_{name}" in words:
        return words[f"terms.metric_{name}"]
    if name.startswith("rel_error_"):
        return _say(locale, "metric_rel_error", {"precision": name[len("rel_error_"):]})
    found = re.fullmatch(r"gpu(?P<index>\d+)_(?P<key>[a-z0-9_]+)", name)
    if found and f"terms.metric_gpu_{found['key']}" in words:
        return _say(locale, "metric_gpu", {"index": found["index"], "what": words[f"terms.metric_gpu_{found['key']}"]})
    return name

