"""teto up's process supervisor (teto/stack/supervisor.py): a part that dies is started again after its back-off,
and one that keeps dying is never given up on (a cause that passes by itself heals the stack)."""

from __future__ import annotations

import logging
import time

import pytest

from teto.stack.supervisor import CRASH_LOOP_SECONDS, Part, Supervisor, restart_delay

pytestmark = pytest.mark.unit


def test_the_back_off_doubles_to_ten_seconds_then_a_crash_loop_waits_a_minute():
    assert [restart_delay(n, 5) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, CRASH_LOOP_SECONDS,
                                                           CRASH_LOOP_SECONDS]
    assert restart_delay(6, 10) == 10.0 and restart_delay(0, 5) == 0.5


def _exited(part: Part) -> None:
    part.proc.wait(timeout=10)


def test_a_part_that_keeps_dying_is_started_again_every_minute_never_given_up_on(tmp_path, caplog):
    sup = Supervisor(tmp_path, max_restarts_per_minute=2)
    part = Part("queue-1", ["sh", "-c", "echo bind failed: address in use; exit 3"], {})
    sup.add(part)
    now, starts = time.monotonic(), 1
    with caplog.at_level(logging.WARNING, logger="teto.stack.supervisor"):
        for _ in range(6):  # more exits in a minute than allowed, then well past it
            _exited(part)
            assert sup.check(now) == []  # the exit is seen: its back-off starts
            delay = part.next_start - now
            now += delay
            assert sup.check(now) == ["queue-1"]
            starts += 1
    _exited(part)
    assert starts == 7 and part.proc is not None
    assert "queue-1 exited 3 times in a minute; starting it again every 60 s" in caplog.text
    assert "its log ends: bind failed: address in use" in caplog.text
    assert (tmp_path / "logs" / "queue-1.log").read_text().count("bind failed") == 7


def test_a_part_running_or_stopping_is_left_alone(tmp_path):
    sup = Supervisor(tmp_path)
    part = Part("audit-1", ["sleep", "30"], {})
    sup.add(part)
    try:
        assert sup.check() == []
        sup.stop(["audit-1"], timeout=5)
        assert sup.check() == [] and part.proc.poll() is not None
    finally:
        if part.proc.poll() is None:
            part.proc.kill()
