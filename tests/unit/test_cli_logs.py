"""``teto logs`` (teto/cli_logs.py) against a fake gateway: every page read in order, stdout and stderr kept apart,
Teto's notices on stderr, ``-f`` reading NDJSON until the end line, a refusal's reason, and a job's output never
driving the operator's terminal."""

from __future__ import annotations

import io
import json

import httpx
import pytest

from teto import cli_http
from teto.cli import main
from teto.cli_format import terminal_safe
from teto.cli_logs import write_item

pytestmark = pytest.mark.unit


def chunk(seq: int, text: str, stream: str = "stdout", **kw) -> dict:
    return {"seq": seq, "attempt": 1, "rank": 0, "stream": stream, "text": text, "notice": None, **kw}


@pytest.fixture
def gateway(monkeypatch):
    seen: list[httpx.Request] = []
    answers: dict[str, object] = {}

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.params.get("follow") == "true":
            body = answers.get("follow")
            if isinstance(body, tuple):
                return httpx.Response(body[0], json=body[1])
            return httpx.Response(200, content="".join(json.dumps(i) + "\n" for i in body),
                                  headers={"content-type": "application/x-ndjson"})
        pages = answers["pages"]
        after = int(request.url.params.get("after_seq", 0))
        return httpx.Response(200, json=pages[after])

    monkeypatch.setattr(cli_http, "TRANSPORT", httpx.MockTransport(handle))
    monkeypatch.setenv("TETO_URL", "http://gw:1")
    monkeypatch.setenv("TETO_TOKEN", "secret")
    return answers, seen


def test_every_page_is_read_and_the_streams_go_to_stdout_and_stderr(gateway, capsys):
    answers, seen = gateway
    answers["pages"] = {
        0: {"chunks": [chunk(1, "epoch 1\n"), chunk(2, "warn\n", "stderr")], "next_after_seq": 2, "more": True},
        2: {"chunks": [chunk(5, "epoch 2\n"),
                       chunk(6, "", final=True, notice="[teto: attempt 1 rank 0 ended: exit status 3]")],
            "next_after_seq": 6, "more": False}}
    assert main(["logs", "j1", "--attempt", "1", "--rank", "0"]) == 0
    out, err = capsys.readouterr()
    assert out == "epoch 1\nepoch 2\n"
    assert err == "warn\n[teto: attempt 1 rank 0 ended: exit status 3]\n"
    assert [r.url.path for r in seen] == ["/v1/jobs/j1/logs"] * 2
    assert [dict(r.url.params) for r in seen][1] == {"attempt": "1", "rank": "0", "after_seq": "2", "limit": "1000"}


def test_follow_prints_until_the_end_line_and_skips_keepalives(gateway, capsys):
    answers, seen = gateway
    answers["follow"] = [chunk(1, "tick 0\n"), {"type": "keepalive", "next_after_seq": 1},
                         chunk(2, "tick 1"), chunk(3, "", notice="[teto: 10 bytes of stdout not shipped: x]"),
                         {"type": "end", "state": "succeeded", "next_after_seq": 3}]
    assert main(["logs", "j1", "-f", "--stream", "stdout"]) == 0
    out, err = capsys.readouterr()
    assert out == "tick 0\ntick 1"
    assert err == "[teto: 10 bytes of stdout not shipped: x]\n[teto: job ended: succeeded]\n"
    assert dict(seen[0].url.params) == {"stream": "stdout", "after_seq": "0", "follow": "true"}


def test_json_prints_the_apis_objects_one_a_line(gateway, capsys):
    answers, _ = gateway
    answers["follow"] = [chunk(1, "a\n"), {"type": "end", "state": "failed", "next_after_seq": 1}]
    assert main(["logs", "j1", "-f", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["text"] == "a\n" and lines[-1] == {"type": "end", "state": "failed", "next_after_seq": 1}


def test_a_refused_follow_prints_the_reason_and_exits_1(gateway, capsys):
    answers, _ = gateway
    answers["follow"] = (404, {"error": "not_found", "reason": "no such job: j1"})
    assert main(["logs", "j1", "-f"]) == 1
    assert "error 404: no such job: j1" in capsys.readouterr().err


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_escape_sequences_are_shown_not_obeyed():
    assert terminal_safe("ok\tstill\r\n\x1b]0;pwned\x07\x9b2J") == "ok\tstill\r\n\\x1b]0;pwned\\x07\\x9b2J"
    tty, piped, err = Tty(), io.StringIO(), io.StringIO()
    write_item(chunk(1, "\x1b[31mred\n"), tty, err, as_json=False)
    write_item(chunk(1, "\x1b[31mred\n"), piped, err, as_json=False)
    assert tty.getvalue() == "\\x1b[31mred\n" and piped.getvalue() == "\x1b[31mred\n"


def test_a_notice_after_text_without_a_newline_starts_its_own_line():
    out, err = io.StringIO(), io.StringIO()
    write_item(chunk(1, "no newline", "stderr", notice="[teto: cut]"), out, err, as_json=False)
    assert err.getvalue() == "no newline\n[teto: cut]\n"


def test_a_failed_jobs_view_shows_its_last_lines_stderr_marked():
    from teto.cli_format import format_job

    job = {"id": "j1", "state": "failed", "error": "exit status 3", "log_tail": {
        "attempt": 2, "rank": 0, "exit_code": 3, "complete": True,
        "lines": [{"stream": "stdout", "text": "step 5"}, {"stream": "stderr", "text": "ValueError: \x1b[2J"}]}}
    text = format_job(job)
    assert "output    last lines of attempt 2 rank 0 (exit status 3); all: teto logs <job-id>" in text
    assert "    step 5" in text and "  ! ValueError: \\x1b[2J" in text
