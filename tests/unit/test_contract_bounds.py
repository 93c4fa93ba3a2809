"""Contracts refuse at decode what could never be stored or sent (libs/contracts/bounds.py): a NUL that jsonb
refuses, an integer past its column, an id a subject cannot carry, an env name the kernel cannot set, an
infinite figure, a seed torch refuses, a path no file system has. Each refusal names the field. The walks at
the end check every message in the registry generically, so a field added later cannot escape the rules."""

from __future__ import annotations

import math
import types
import typing
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, Literal, Union

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter, ValidationError

from libs.contracts import bounds
from libs.contracts.commands import SubmitJob
from libs.contracts.envelope import ContractError, Envelope, Model, RejectedMessage
from libs.contracts.jobs import FinetuneParams, JobEvent
from libs.contracts.nodes import CheckReport, NodeRegistered
from libs.contracts.registry import CATALOGUE
from libs.contracts.subjects import Subjects
from libs.contracts.telemetry import CheckpointReport, Heartbeat, StepReport, UsageSample

pytestmark = pytest.mark.unit

NOW = "2026-11-30T12:00:00+00:00"
SUBMIT = {"schema": SubmitJob.SCHEMA, "actor": "alice", "spec": {"workload": {"kind": "finetune"}}}
COMMAND_SUBMIT = {**SUBMIT, "spec": {"workload": {"kind": "command", "command": ["python", "train.py"],
                                                  "env": {"A": "1"}}}}
STEP = {"schema": StepReport.SCHEMA, "job_id": "j1", "epoch": 1, "executor_id": "e1", "kind": "step", "step": 5}
HEARTBEAT = {"schema": Heartbeat.SCHEMA, "executor_id": "e1", "node_id": "n1", "group": "default", "sent_at": NOW,
             "interval_seconds": 1.0, "progress_interval_seconds": 1.0}
REGISTERED = {"schema": NodeRegistered.SCHEMA, "node_id": "n1", "executor_id": "e1", "group": "default",
              "hostname": "host", "cpu_count": 2, "agent_version": "1"}
CHECK = {"schema": CheckReport.SCHEMA, "run_id": "r1", "node_id": "n1", "executor_id": "e1", "status": "passed"}
CHECKPOINT = {"schema": CheckpointReport.SCHEMA, "job_id": "j1", "epoch": 1, "executor_id": "e1",
              "kind": "checkpoint", "step": 5, "path": "/ckpt/5.pt"}


def _with(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``base`` with the value at a dotted path replaced."""
    out = typing.cast(dict[str, Any], _copy(base))
    node = out
    *parents, last = path.split(".")
    for key in parents:
        node = node[key]
    node[last] = value
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


CASES = [
    # (message class, valid base, dotted path, hostile value, field named in the reason)
    (SubmitJob, SUBMIT, "spec.name", "job\x00", "spec.name"),
    (SubmitJob, SUBMIT, "actor", "ali\x00ce", "actor"),
    (SubmitJob, SUBMIT, "actor", "alice\x1b[31m", "actor"),
    (SubmitJob, SUBMIT, "actor", "alice\x9b31m", "actor"),  # C1: CSI
    (SubmitJob, SUBMIT, "actor", "ali\x85ce", "actor"),  # C1: NEL
    (SubmitJob, SUBMIT, "spec.name", "job\x80", "spec.name"),
    (SubmitJob, SUBMIT, "spec.name", "job\x9f", "spec.name"),
    (SubmitJob, COMMAND_SUBMIT, "spec.workload.command", ["python", "a\x00b"], "spec.workload.command.command.1"),
    (SubmitJob, COMMAND_SUBMIT, "spec.workload.env", {"A": "x\x00"}, "spec.workload.command.env.A"),
    (SubmitJob, COMMAND_SUBMIT, "spec.workload.env", {"A=B": "1"}, "spec.workload.command.env.A=B.[key]"),
    (SubmitJob, COMMAND_SUBMIT, "spec.workload.env", {"1A": "1"}, "spec.workload.command.env.1A.[key]"),
    (SubmitJob, SUBMIT, "spec.workload.params", {"seed": bounds.SEED_MAX + 1}, "spec.workload.finetune.params.seed"),
    (SubmitJob, SUBMIT, "spec.workload.params", {"seed": 2**64}, "spec.workload.finetune.params.seed"),
    (SubmitJob, SUBMIT, "job_id", "a.b", "job_id"),
    (StepReport, STEP, "step", 2**63, "step"),
    (StepReport, STEP, "step", bounds.MAX_SAFE_INT + 1, "step"),
    (StepReport, STEP, "epoch", 2**31, "epoch"),
    (StepReport, STEP, "job_id", "j.1", "job_id"),
    (Heartbeat, HEARTBEAT, "step", 2**63, "step"),
    (Heartbeat, HEARTBEAT, "usage", {"job_id": "j1", "epoch": 1, "seq": 2**31, "devices": 1, "wall_seconds": 1},
     "usage.seq"),
    (Heartbeat, HEARTBEAT, "usage", {"job_id": "j1", "epoch": 1, "seq": 1, "devices": 1, "wall_seconds": 1e300},
     "usage.wall_seconds"),
    (Heartbeat, HEARTBEAT, "sent_at", "9999-12-31T23:00:00-05:00", "sent_at"),
    (NodeRegistered, REGISTERED, "executor_id", "host.example.com-abc123", "executor_id"),
    (NodeRegistered, REGISTERED, "node_id", "n>1", "node_id"),
    (NodeRegistered, REGISTERED, "group", "gpu *", "group"),
    (CheckReport, CHECK, "figures", {"tflops": "inf"}, "figures.tflops"),
    (CheckReport, CHECK, "figures", {"tflops": "nan"}, "figures.tflops"),
    (CheckReport, CHECK, "figures", {"tflops": 1e999}, "figures.tflops"),
    (CheckReport, CHECK, "detail", {"a": {"b": "x\x00"}}, "detail"),
    (CheckReport, CHECK, "detail", {"a": 2**63}, "detail"),
    (CheckpointReport, CHECKPOINT, "path", "/" + "a" * (1 << 20), "path"),
    (CheckpointReport, CHECKPOINT, "path", "/ckpt/\x00.pt", "path"),
]


@pytest.mark.parametrize(("cls", "base", "path", "value", "field"), CASES,
                         ids=[f"{c[0].__name__}.{c[2]}={str(c[3])[:24]!r}" for c in CASES])
def test_a_value_that_cannot_be_stored_or_sent_is_refused_at_decode_naming_the_field(cls, base, path, value, field):
    cls.decode(base)  # the base is valid: the one change below is what is refused
    with pytest.raises(ContractError) as refused:
        cls.decode(_with(base, path, value))
    assert f"{field}:" in refused.value.reason


@pytest.mark.parametrize("wire", [b'{"tflops": Infinity}', b'{"tflops": NaN}', b'{"tflops": -Infinity}'])
def test_a_check_figure_that_is_not_finite_is_refused_from_raw_json(wire):
    body = (b'{"schema": "teto.check.report/1", "run_id": "r1", "node_id": "n1", "executor_id": "e1",'
            b' "status": "passed", "figures": ' + wire + b"}")
    with pytest.raises(ContractError, match="figures.tflops"):
        CheckReport.decode(body)


def test_the_widest_values_the_contracts_allow_are_accepted():
    spec = {"workload": {"kind": "finetune", "params": {"seed": bounds.SEED_MAX, "steps": 10_000_000}}}
    SubmitJob.decode({**SUBMIT, "spec": spec, "job_id": "A" * 128, "actor": "a" * 200})
    StepReport.decode({**STEP, "step": bounds.MAX_SAFE_INT, "epoch": bounds.INT32_MAX})
    CheckpointReport.decode({**CHECKPOINT, "path": "/" + "a" * 4095})


def test_a_diverged_loss_is_reported_as_absent_rather_than_refused():
    # The executor builds StepReports from what the training script said: a nan loss must not stop it.
    report = StepReport(job_id="j1", epoch=1, executor_id="e1", step=3, loss=math.nan,
                        metrics={"ppl": math.inf, "lr": 0.1})
    assert report.loss is None and report.metrics == {"lr": 0.1}


def test_the_executor_sends_only_finite_check_figures():
    from agents.executor.checks.handler import _floats

    figures = _floats({"ok": 1, "inf": math.inf, "nan": math.nan, "huge": 10**400, "text": "x"})
    assert figures == {"ok": 1.0}
    CheckReport(run_id="r1", node_id="n1", executor_id="e1", status="passed", figures=figures)


def test_the_largest_seed_the_contract_allows_builds_the_model_and_its_batches():
    torch = pytest.importorskip("torch")
    from agents.executor.workloads import data, model

    params = FinetuneParams(seed=bounds.SEED_MAX, steps=10_000_000)
    # The fine-tune seeds batches with (seed x world_size + rank) x 1_000_003 + step (workloads/data.py).
    worst = params.seed * 256 + 255
    x, _ = data.finetune_corpus().batch(params.steps, batch_size=2, seq_len=8, seed=worst)
    assert x.shape == (2, 8)
    state = model.build_base_state(model.ModelConfig(), seed=params.seed, steps=1)
    assert state and all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point())


@given(st.from_regex(bounds.ID_PATTERN, fullmatch=True))
def test_every_id_the_contracts_accept_is_a_subject_token(ident):
    s = Subjects()
    assert s.heartbeat(ident).count(".") == 2 and s.job_event(ident, "submitted").count(".") == 3


@pytest.mark.parametrize("ident", ["a.b", "a*", "a>", "a b", "a\tb", "", "x" * 129, "é"])
def test_what_a_subject_cannot_carry_is_not_an_id(ident):
    with pytest.raises(ValidationError):
        TypeAdapter(bounds.Id).validate_python(ident)
    with pytest.raises(ValueError, match="subject token"):  # one rule: subjects refuse exactly what ids refuse
        Subjects().heartbeat(ident)


def test_a_rejected_message_quoting_a_nul_is_still_recorded():
    # The note about a hostile message quotes it: making the note must never fail on what it quotes.
    note = RejectedMessage(service="queue", subject="teto.cmd.submit", reason="actor: NUL",
                           payload_excerpt='{"actor": "a\x00"}', payload_bytes=17)
    assert "\x00" not in note.encode().decode()


# -- generic walks over every message in the registry -----------------------------------------------------------

def _models() -> list[type[BaseModel]]:
    """Every message class in the catalogue and every model nested in one."""
    seen: dict[type[BaseModel], None] = {}
    todo: list[Any] = [entry.model for entry in CATALOGUE]
    while todo:
        tp = todo.pop()
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if tp in seen:
                continue
            seen[tp] = None
            todo.extend(f.annotation for f in tp.model_fields.values())
        else:
            todo.extend(typing.get_args(tp))
    return list(seen)


def _strip(tp: Any) -> Any:
    while typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _good(tp: Any) -> Any:
    """A simple valid value of a leaf type (keys and values next to the one being probed)."""
    base = _strip(tp)
    if base in (str, Any):
        return "a"
    if base is float:
        return 1.0
    if base is bool:
        return True
    if base is int:
        return 1
    if typing.get_origin(base) in (Union, types.UnionType):
        return _good(next(a for a in typing.get_args(base) if a is not type(None)))
    if isinstance(base, type) and issubclass(base, BaseModel):
        return {}  # a model whose fields all have defaults (a quota per group, say); a required field says so
    raise AssertionError(f"no probe value for {tp!r}")


def _probes(tp: Any, bad: Any) -> list[tuple[Any, Any]]:
    """(good, bad) values for every free-text / number position of a type; nested models are walked apart."""
    base = _strip(tp)
    origin = typing.get_origin(base)
    if origin in (Union, types.UnionType):
        return [p for arg in typing.get_args(base) for p in _probes(arg, bad)]
    if origin is list:
        return [([g], [b]) for g, b in _probes(typing.get_args(base)[0], bad)]
    if origin is dict:
        key, value = typing.get_args(base)
        out = [({g: _good(value)}, {b: _good(value)}) for g, b in _probes(key, bad) if isinstance(b, str)]
        out += [({_good(key): g}, {_good(key): b}) for g, b in _probes(value, bad)]
        return out
    if origin is Literal or base is type(None) or (isinstance(base, type) and issubclass(base, (Enum, BaseModel))):
        return []
    if base in (str, Any) and isinstance(bad, str):
        return [("a", bad)]
    if base in (float, Any) and isinstance(bad, float):
        return [(1.0, bad)]
    return []


def _annotation(field: Any) -> Any:
    return Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation


def _fields(probe: Any) -> list[tuple[str, TypeAdapter, Any, Any]]:
    out = []
    for model in _models():
        for name, field in model.model_fields.items():
            probes = _probes(field.annotation, probe)
            if probes:
                config = Model.model_config if issubclass(model, Model) else None
                adapter = TypeAdapter(_annotation(field), config=config)
                out += [(f"{model.__name__}.{name}", adapter, _accepted(adapter, good), bad) for good, bad in probes]
    return out


def _accepted(adapter: TypeAdapter, good: Any) -> Any:
    """``good``, or for a string field with a pattern (a hex digest, say; an absolute path) a value of that
    shape."""
    for candidate in (good, "0" * 64, "/a") if good == "a" else (good,):
        try:
            adapter.validate_python(candidate)
            return candidate
        except ValueError:
            continue
    return good


def _contains(value: Any, predicate: typing.Callable[[Any], bool]) -> bool:
    if isinstance(value, dict):
        return any(_contains(k, predicate) or _contains(v, predicate) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_contains(v, predicate) for v in value)
    return predicate(value)


def _has_nul(value: Any) -> bool:
    return isinstance(value, str) and "\x00" in value


def _not_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


# DeadLetter (libs/contracts/dead.py) belongs to the edge work: its fields quote a message already given up on.
NUL_FIELDS = _fields("a\x00")
INF_FIELDS = _fields(math.inf) + _fields(math.nan)


def test_the_walk_finds_the_fields_it_is_meant_to_check():
    names = {f[0] for f in NUL_FIELDS}
    assert {"SubmitJob.actor", "JobSpec.name", "CommandWorkload.env", "CheckReport.detail", "Heartbeat.executor_id",
            "JobEvent.detail", "CheckpointReport.path", "RejectedMessage.payload_excerpt"} <= names
    assert {"CheckReport.figures", "StepReport.loss", "UsageSample.wall_seconds"} <= {f[0] for f in INF_FIELDS}


@pytest.mark.parametrize(("field", "adapter", "good", "bad"), NUL_FIELDS, ids=[f"{f[0]}:{f[3]!r}" for f in NUL_FIELDS])
def test_every_string_of_every_message_refuses_nul(field, adapter, good, bad):
    adapter.validate_python(good)
    try:
        kept = adapter.validate_python(bad)
    except ValidationError:
        return
    assert not _contains(kept, _has_nul), f"{field} let a NUL through"


@pytest.mark.parametrize(("field", "adapter", "good", "bad"), INF_FIELDS, ids=[f"{f[0]}:{f[3]!r}" for f in INF_FIELDS])
def test_every_float_of_every_message_is_finite(field, adapter, good, bad):
    adapter.validate_python(good)
    try:
        kept = adapter.validate_python(bad)
    except ValidationError:
        return
    assert not _contains(kept, _not_finite), f"{field} let a non-finite number through"


def test_every_message_in_the_registry_is_an_envelope_with_bounded_ids():
    for entry in CATALOGUE:
        assert issubclass(entry.model, Envelope)
        for name, field in entry.model.model_fields.items():
            if name.endswith("_id") and not name.startswith("payload"):
                with pytest.raises(ValidationError):
                    TypeAdapter(_annotation(field)).validate_python("a.b")


def test_job_event_detail_refuses_what_jsonb_cannot_hold():
    base = {"schema": JobEvent.SCHEMA, "job_id": "j1", "seq": 1, "event": "submitted", "state": "queued"}
    JobEvent.decode({**base, "detail": {"spec": {"a": [1, "b"]}}})
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(bounds.MAX_JSON_DEPTH + 2):
        node["x"] = {}
        node = node["x"]
    for detail in ({"a": "\x00"}, {"\x00": 1}, {"a": [2**60]}, deep):
        with pytest.raises(ContractError, match="detail"):
            JobEvent.decode({**base, "detail": detail})


def test_times_are_utc_and_in_range():
    beat = Heartbeat.decode({**HEARTBEAT, "sent_at": "2026-11-30T13:00:00+01:00"})
    assert beat.sent_at == datetime.fromisoformat(NOW) and beat.sent_at.utcoffset().total_seconds() == 0
    with pytest.raises(ContractError, match="sent_at"):
        Heartbeat.decode({**HEARTBEAT, "sent_at": "0001-01-01T00:00:00+01:00"})


def test_a_usage_sample_cannot_overflow_a_sum():
    # devices x wall_seconds summed over a long run must stay finite in the ledger's double precision column.
    worst = UsageSample(job_id="j1", epoch=1, seq=1, devices=bounds.INT32_MAX, wall_seconds=bounds.MAX_SECONDS)
    assert math.isfinite(worst.devices * worst.wall_seconds * bounds.INT32_MAX)


def test_dead_letters_refuse_nul_too():
    leaks = []
    for field, adapter, _good_value, bad in _fields("a\x00"):
        if field.startswith("DeadLetter."):
            try:
                kept = adapter.validate_python(bad)
            except ValidationError:
                continue
            if _contains(kept, _has_nul):
                leaks.append(field)
    assert not leaks, leaks


@pytest.mark.parametrize("step", [2**63, bounds.MAX_SAFE_INT + 1, -1])
def test_the_executor_ignores_a_step_report_its_heartbeats_could_not_carry(step):
    # Every heartbeat carries the run's step: a script reporting 2**63 must not stop the agent's heartbeats.
    from agents.executor.reports import Reports

    run = types.SimpleNamespace(step=7)
    with pytest.raises(ValueError, match="outside"):
        Reports(lambda *a, **k: None, 1.0).on_report(run, {"type": "step", "step": step})  # type: ignore[arg-type]
    assert run.step == 7


def test_a_step_report_the_contract_refuses_is_dropped_not_raised():
    # flush_step also runs as the run finishes: raising there would lose the run's final report.
    from agents.executor.reports import Reports

    sent = []
    reports = Reports(lambda run, cls, **fields: sent.append(cls(job_id="j1", epoch=1, executor_id="e1", **fields)), 1.0)
    grant = types.SimpleNamespace(rank=0, job_id="j1")
    run = types.SimpleNamespace(pending_step={"step": 3, "total_steps": -5, "loss": 0.1}, grant=grant,
                                last_step_sent_at=None, step_seconds_sum=0.0, step_seconds_n=0)
    reports.flush_step(run)  # type: ignore[arg-type]
    assert sent == [] and run.pending_step is None


def test_process_output_quoted_in_an_error_is_made_storable():
    from libs.contracts.telemetry import RunFinished

    done = RunFinished(job_id="j1", epoch=1, executor_id="e1", outcome="failed", error="binary \x00 output")
    assert "\x00" not in done.encode().decode() and "\ufffd" in done.error


def test_a_rendezvous_built_from_the_widest_address_fits_the_grant():
    # The queue builds "host:port" ("[host]:port" for IPv6) from an executor's reported address.
    from libs.contracts.agents import RunJob
    from libs.contracts.jobs import JobSpec

    host = "a:" + "b" * 253  # the widest Address, with a colon: bracketed
    RunJob(job_id="j1", epoch=1, executor_id="e1", spec=JobSpec.model_validate({"workload": {"kind": "finetune"}}),
           attempt=1, lease_seconds=1, heartbeat_seconds=1, rendezvous=f"[{host}]:65535")
