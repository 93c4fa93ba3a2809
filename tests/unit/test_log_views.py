"""How the gateway shows a job's output (services/gateway/domain/logviews.py): whose chunks are the job's, the
notices that mark gaps and truncation, the tail of a failed job, and when a follow ends."""

from __future__ import annotations

import pytest

from libs.contracts.logs import LogChunk, LogStream, TailLine
from libs.contracts.subjects import Subjects
from services.gateway.domain import logviews

S = Subjects("teto")
EVENTS = [
    {"event": "submitted", "detail": {}},
    {"event": "leased", "detail": {"attempt": 1, "workers": ["ex-a"]}},
    {"event": "leased", "detail": {"attempt": 2, "workers": ["ex-b", "ex-c"]}},
    {"event": "leased", "detail": "not an object"},
]


def chunk(**kw) -> LogChunk:
    base = dict(job_id="j1", epoch=1, attempt=1, rank=0, executor_id="ex-a", stream=LogStream.STDOUT, offset=0)
    return LogChunk(**{**base, **kw})


def test_grants_map_each_attempt_and_rank_to_the_executor_the_queue_leased_it_to():
    assert logviews.grants(EVENTS) == {(1, 0): "ex-a", (2, 0): "ex-b", (2, 1): "ex-c"}


@pytest.mark.parametrize("kw, subject_sender, job, ok", [
    ({}, "ex-a", "j1", True),
    ({"attempt": 2, "rank": 1, "executor_id": "ex-c"}, "ex-c", "j1", True),
    ({"executor_id": "ex-b"}, "ex-b", "j1", False),  # ex-b ran attempt 2, not attempt 1
    ({"attempt": 3}, "ex-a", "j1", False),  # an attempt never granted
    ({}, "ex-z", "j1", False),  # the body claims another sender than the subject
    ({"job_id": "j2"}, "ex-a", "j1", False),  # the body names another job
], ids=["granted", "gang-rank", "other-attempts-executor", "ungranted-attempt", "forged-sender", "other-job"])
def test_only_chunks_of_the_executor_granted_that_attempt_and_rank_belong_to_the_job(kw, subject_sender, job, ok):
    c = chunk(**kw)
    subject = f"teto.logs.{job}.{c.attempt}.{c.rank}.{subject_sender}"
    assert logviews.belongs(c, subject, job, logviews.grants(EVENTS)) is ok


def test_a_plain_chunk_has_no_notice_and_shows_its_fields():
    view = logviews.chunk_view(7, chunk(text="hello\n", offset=12))
    assert view["notice"] is None
    assert {k: view[k] for k in ("seq", "attempt", "rank", "stream", "executor_id", "offset", "text")} == {
        "seq": 7, "attempt": 1, "rank": 0, "stream": "stdout", "executor_id": "ex-a", "offset": 12,
        "text": "hello\n"}


@pytest.mark.parametrize("kw, expected", [
    ({"dropped_bytes": 300, "text": "x"}, "[teto: 300 bytes of stdout not shipped: the executor could not ship it "
                                          "in time]"),
    ({"truncated": True, "text": "x"}, "[teto: output truncated here: the run's log limit was reached; the rest "
                                       "of stdout is not shipped]"),
    ({"truncated": True, "dropped_bytes": 5000, "stream": LogStream.STDERR},
     "[teto: 5000 bytes of stderr not shipped: the run's log limit was reached]"),
    ({"final": True, "exit_code": 3}, "[teto: attempt 1 rank 0 ended: exit status 3]"),
    ({"final": True, "exit_code": -9}, "[teto: attempt 1 rank 0 ended: killed by signal 9]"),
    ({"final": True}, "[teto: attempt 1 rank 0 ended: unknown]"),
], ids=["dropped", "cut-here", "not-shipped", "exit", "signal", "unknown"])
def test_gaps_truncation_and_the_end_of_a_run_are_marked(kw, expected):
    assert logviews.notice(chunk(**kw)) == expected


@pytest.mark.parametrize("stream, kw, shown", [
    (None, {"stream": LogStream.STDERR}, True),
    ("stdout", {"stream": LogStream.STDERR}, False),
    ("stderr", {"stream": LogStream.STDERR}, True),
    ("stderr", {"final": True}, True),  # the run's end shows whatever stream was asked for
    ("stderr", {"final": True, "text": "late"}, False),
])
def test_the_stream_filter(stream, kw, shown):
    assert logviews.wanted(chunk(**kw), stream=stream) is shown


def test_the_tail_of_a_failed_job_is_the_failing_ranks_last_lines():
    lines = [TailLine(stream=LogStream.STDERR, text="ValueError: bad")]
    peer = chunk(rank=0, final=True, exit_code=76, tail=[TailLine(stream=LogStream.STDERR, text="peer lost")])
    failing = chunk(rank=1, final=True, exit_code=3, tail=lines, executor_id="ex-c")
    tail = logviews.tail_view([failing, peer])
    assert tail == {"attempt": 1, "rank": 1, "exit_code": 3, "complete": True,
                    "lines": [{"stream": "stderr", "text": "ValueError: bad"}]}


def test_the_tail_is_rank_0s_when_no_rank_failed_by_itself():
    tail = logviews.tail_view([chunk(rank=1, final=True, exit_code=76), chunk(rank=0, final=True, exit_code=76)])
    assert tail["rank"] == 0


def test_without_the_final_chunk_the_tail_is_the_last_lines_of_the_last_chunk():
    text = "".join(f"l{i}\n" for i in range(30))
    tail = logviews.tail_view([chunk(text=text)])
    assert tail["complete"] is False and tail["exit_code"] is None
    assert [line["text"] for line in tail["lines"]] == [f"l{i}" for i in range(10, 30)]


def test_no_chunk_no_tail():
    assert logviews.tail_view([]) is None


@pytest.mark.parametrize("state", ["queued", "admitting", "running", "backoff"])
def test_a_follow_goes_on_while_the_job_may_still_run(state):
    assert state not in logviews.FOLLOW_END_STATES


@pytest.mark.parametrize("state", ["succeeded", "failed", "cancelled", "interrupted"])
def test_a_follow_ends_once_nothing_more_runs(state):
    assert state in logviews.FOLLOW_END_STATES


def test_subjects_of_a_jobs_output_put_the_sender_last_and_filter_by_attempt_and_rank():
    assert S.logs("j1", 2, 1, "ex-a") == "teto.logs.j1.2.1.ex-a"
    assert S.logs_of("j1") == "teto.logs.j1.*.*.*"
    assert S.logs_of("j1", 2) == "teto.logs.j1.2.*.*" and S.logs_of("j1", rank=0) == "teto.logs.j1.*.0.*"
    assert S.sender_token(S.logs("j1", 2, 1, "ex-a")) == "ex-a"
    with pytest.raises(ValueError):
        S.logs("j.1", 1, 0, "ex-a")
