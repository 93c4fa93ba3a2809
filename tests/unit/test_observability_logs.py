"""Structured logs (libs/runtime/logs.py): JSON lines carry the job, executor, command and trace a line is about
when the context knows them, and leave out what it does not; text stays the default."""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace

import pytest

from libs.runtime import logs

pytestmark = pytest.mark.unit

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def line(message: str = "hello", exc_info=None) -> dict:
    record = logging.LogRecord("teto.test", logging.INFO, __file__, 1, message, (), exc_info)
    return json.loads(logs.JsonFormatter().format(record))


def test_a_json_line_has_time_level_logger_message_and_no_unknown_ids():
    out = line()
    assert out["level"] == "INFO" and out["logger"] == "teto.test" and out["message"] == "hello"
    assert out["time"].endswith("+00:00")
    assert not set(logs.FIELDS) & out.keys()


def test_bound_ids_appear_on_every_line_inside_the_block_only():
    with logs.bound(job_id="j1", executor_id="e1", command_id="c1", trace_id=TRACE, other="x"):
        out = line()
    assert {k: out[k] for k in logs.FIELDS} == {"job_id": "j1", "executor_id": "e1", "command_id": "c1",
                                                "trace_id": TRACE}
    assert "other" not in out
    assert "job_id" not in line()


def test_a_traceback_travels_inside_the_json_line():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys

        out = line("failed", exc_info=sys.exc_info())
    assert "RuntimeError: boom" in out["exception"]


async def test_a_task_inherits_what_was_bound_before_it_started_and_keeps_its_own():
    seen = {}

    async def job() -> None:
        logs.bind_here(job_id="j9")
        seen["job"] = logs.current()

    async def agent() -> None:  # its own task, so the binding ends with it
        logs.bind_here(executor_id="agent-1")
        await asyncio.create_task(job())
        seen["agent"] = logs.current()

    await asyncio.create_task(agent())
    assert seen["job"]["executor_id"] == "agent-1" and seen["job"]["job_id"] == "j9"
    assert seen["agent"] == {"executor_id": "agent-1"}  # the job's binding stayed in its task
    assert "executor_id" not in logs.current()


def test_the_trace_id_comes_from_a_w3c_traceparent_header():
    assert logs.trace_id_of({"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}) == TRACE
    assert logs.trace_id_of({"traceparent": "garbage"}) is None
    assert logs.trace_id_of({"traceparent": f"00-{'0' * 32}-00f067aa0ba902b7-01"}) is None
    assert logs.trace_id_of(None) is None


def test_a_batch_binds_only_the_ids_all_its_messages_share():
    a = SimpleNamespace(job_id="j1", executor_id="e1")
    b = SimpleNamespace(job_id="j2", executor_id="e1")
    header = {"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}
    assert logs.shared_fields([a, b], [header, header]) == {"executor_id": "e1", "trace_id": TRACE}
    assert logs.shared_fields([a], [None]) == {"job_id": "j1", "executor_id": "e1"}
    cmd = SimpleNamespace(command_id="c7", job_id=None)
    assert logs.shared_fields([cmd]) == {"command_id": "c7"}


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def keep_logging(monkeypatch):
    """The process-wide switches ``configure`` sets, put back after the test (pytest's own log capture reads the
    caller's file and line)."""
    for name in ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing"):
        monkeypatch.setattr(logging, name, getattr(logging, name))
    monkeypatch.setattr(logging, "logAsyncioTasks", getattr(logging, "logAsyncioTasks", True), raising=False)


def test_configure_writes_json_lines_or_text_and_refuses_another_format(capsys, keep_logging):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.configure("INFO", "json")
        with logs.bound(job_id="j5"):
            logging.getLogger("teto.x").info("started %s", "now")
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert json.loads(err)["job_id"] == "j5" and json.loads(err)["message"] == "started now"
        logs.configure("INFO", "text")
        logging.getLogger("teto.x").info("plain")
        assert capsys.readouterr().err.strip().endswith("teto.x: plain")
        with pytest.raises(ValueError, match="TETO_LOG_FORMAT"):
            logs.configure("INFO", "xml")
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])


def test_a_configured_part_does_not_look_up_where_each_line_came_from(capsys, keep_logging):
    """The caller's file and line (a walk up the stack), the thread and the process: no line shows them, and they
    were half of what a line cost."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.configure("INFO", "json")
        kept = Kept()
        root.addHandler(kept)
        logging.getLogger("teto.x").info("placed %s", "j1")
        (record,) = kept.records
        assert (record.pathname, record.lineno) == ("(unknown file)", 0)
        assert record.thread is None and record.process is None
        assert json.loads(capsys.readouterr().err.strip().splitlines()[-1])["message"] == "placed j1"
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])


@pytest.mark.parametrize("message", ["naïve café 東京", "a\x00nul, a\ttab, a \"quote\" and a \\ backslash",
                                     "two\nlines\r\n", "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029 every line end",
                                     "emoji \U0001f600"])
def test_any_message_is_one_valid_json_line_that_reads_back_the_same(message):
    record = logging.LogRecord("teto.test", logging.INFO, __file__, 1, "%s %s", (message, object), None)
    text = logs.JsonFormatter().format(record)
    assert text.splitlines() == [text]  # one line, whoever splits it
    assert json.loads(text)["message"] == f"{message} {object}"


def test_an_ids_value_the_json_library_cannot_write_is_written_as_text():
    with logs.bound(job_id="j1"):
        record = logging.LogRecord("teto.test", logging.INFO, __file__, 1, "m", (), None)
        out = logs.JsonFormatter().format(record)
    assert json.loads(out)["job_id"] == "j1"


def test_the_current_spans_trace_id_is_on_the_line():
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("s") as span:
        out = line()
        again = line()  # the span lookup is imported once, then called directly
    want = format(span.get_span_context().trace_id, "032x")
    assert out["trace_id"] == want == again["trace_id"]
    assert "trace_id" not in line()
