"""How a run's output is cut for shipping (agents/executor/logship.py): by size at a newline, by time, the run's
limit with its truncation markers, the tail of last lines, and the bounded backlog whose gaps are marked."""

from __future__ import annotations

import pytest

from agents.executor.logship import Backlog, Chunker, LogLimits, Piece
from libs.contracts.logs import TAIL_LINES, LogStream

OUT, ERR = LogStream.STDOUT, LogStream.STDERR


def chunker(**kw) -> Chunker:
    return Chunker(LogLimits(**{"chunk_bytes": 16, "flush_seconds": 1.0, "max_bytes": 1000, "buffer_bytes": 100,
                                **kw}))


def text(pieces: list[Piece], stream: LogStream = OUT) -> str:
    return "".join(p.text for p in pieces if p.stream is stream)


def test_nothing_is_cut_below_the_size_until_the_time_has_come():
    c = chunker()
    assert c.feed(OUT, b"hello\n", now=0.0) == []
    assert c.due(now=0.9) == []
    (piece,) = c.due(now=1.0)
    assert (piece.stream, piece.offset, piece.nbytes, piece.text) == (OUT, 0, 6, "hello\n")
    assert c.due(now=5.0) == []  # nothing pending any more


def test_the_time_counts_from_the_oldest_pending_byte():
    c = chunker()
    c.feed(OUT, b"a", now=0.0)
    c.feed(OUT, b"b", now=0.8)
    assert [p.text for p in c.due(now=1.0)] == ["ab"]


def test_a_full_chunk_is_cut_at_its_last_newline_and_the_offsets_follow_the_bytes():
    c = chunker()
    pieces = c.feed(OUT, b"line one\nline two is long\nx", now=0.0)
    assert [(p.offset, p.text) for p in pieces] == [(0, "line one\n"), (9, "line two is long")]
    rest = c.close(exit_code=0)
    assert [(p.offset, p.text) for p in rest if p.nbytes] == [(25, "\nx")]


def test_a_chunk_without_a_newline_is_cut_at_the_size():
    pieces = chunker().feed(OUT, b"x" * 40, now=0.0)
    assert [p.nbytes for p in pieces] == [16, 16]


def test_a_character_split_between_chunks_is_decoded_whole():
    c = chunker(chunk_bytes=4)
    pieces = c.feed(OUT, "aaaé".encode() + b"b", now=0.0)  # 'é' is two bytes: the cut falls inside it
    pieces += c.close(exit_code=0)
    assert text(pieces) == "aaaéb"


def test_streams_are_cut_apart_with_their_own_offsets():
    c = chunker()
    c.feed(OUT, b"out\n", now=0.0)
    c.feed(ERR, b"err\n", now=0.0)
    pieces = c.due(now=1.0)
    assert {(p.stream, p.offset, p.text) for p in pieces} == {(OUT, 0, "out\n"), (ERR, 0, "err\n")}


def test_the_limit_ships_up_to_it_marks_the_cut_and_ships_nothing_after():
    c = chunker(max_bytes=10, chunk_bytes=64)
    c.feed(ERR, b"e1\n", now=0.0)
    pieces = c.feed(OUT, b"0123456789abcdef\n", now=0.0)
    # everything pending goes out at once; the piece at the cut says so
    assert [(p.stream, p.text, p.truncated) for p in pieces] == [(ERR, "e1\n", False), (OUT, "0123456", True)]
    assert c.feed(OUT, b"more\n", now=0.1) == [] and c.feed(ERR, b"more\n", now=0.1) == []
    end = c.close(exit_code=1)
    markers = [p for p in end if p.truncated and not p.final]
    assert {(p.stream, p.offset, p.nbytes) for p in markers} == {(OUT, 22, 0), (ERR, 8, 0)}
    final = end[-1]
    assert final.final and final.truncated and final.exit_code == 1


def test_the_tail_keeps_the_last_lines_of_both_streams_in_the_order_read_even_past_the_limit():
    c = chunker(max_bytes=5)
    for i in range(30):
        c.feed(OUT if i % 2 else ERR, f"line {i}\n".encode(), now=0.0)
    c.feed(ERR, b"Traceback: boom", now=0.0)  # no newline: still in the tail
    final = c.close(exit_code=3)[-1]
    assert len(final.tail) == TAIL_LINES
    assert final.tail[-1] == (ERR, "Traceback: boom")
    assert final.tail[-2] == (OUT, "line 29") and final.tail[-3] == (ERR, "line 28")


def test_a_tail_line_is_cut_and_carriage_returns_dropped():
    c = chunker()
    c.feed(OUT, b"y" * 5000 + b"\r\n", now=0.0)
    (line,) = c.close(exit_code=0)[-1].tail
    assert line == (OUT, "y" * 1000)


def test_close_twice_and_feeding_after_close_add_nothing():
    c = chunker()
    c.feed(OUT, b"a", now=0.0)
    assert len(c.close(exit_code=0)) == 2
    assert c.close(exit_code=0) == [] and c.feed(OUT, b"b", now=1.0) == []


def test_the_final_piece_carries_the_exit_status_and_follows_all_output():
    c = chunker()
    c.feed(OUT, b"done\n", now=0.0)
    pieces = c.close(exit_code=-9)
    assert [p.final for p in pieces] == [False, True]
    assert pieces[-1].offset == 5 and pieces[-1].exit_code == -9


# -- the backlog -----------------------------------------------------------------------------------------------


def piece(offset: int, n: int, stream: LogStream = OUT, **kw) -> Piece:
    return Piece(stream, offset, n, text="x" * n, **kw)


def test_the_backlog_drops_what_does_not_fit_and_the_next_delivered_piece_marks_the_gap():
    b = Backlog(max_bytes=10)
    assert b.push(piece(0, 6)) and not b.push(piece(6, 6)) and b.push(piece(12, 4))
    first = b.pop()
    assert first.dropped_bytes == 0
    b.delivered(first)
    second = b.pop()
    assert (second.offset, second.dropped_bytes) == (12, 6)
    assert b.dropped == 6 and b.pop() is None


def test_a_piece_the_bus_refused_shows_as_a_gap_on_the_next_one_of_its_stream_only():
    b = Backlog(max_bytes=100)
    for p in (piece(0, 5), piece(0, 3, ERR), piece(5, 5)):
        b.push(p)
    b.pop()  # not delivered
    err = b.pop()
    assert err.dropped_bytes == 0
    b.delivered(err)
    assert b.pop().dropped_bytes == 5


@pytest.mark.parametrize("marker", [piece(50, 0, truncated=True), piece(50, 0, final=True)], ids=["marker", "final"])
def test_markers_and_the_final_piece_always_fit(marker):
    b = Backlog(max_bytes=4)
    assert b.push(piece(0, 4)) and b.push(marker)
    assert len(b) == 2


def test_the_gap_of_a_truncation_marker_is_what_the_limit_kept_from_the_bus():
    c = chunker(max_bytes=4, chunk_bytes=64)
    b = Backlog(max_bytes=100)
    for p in c.feed(OUT, b"abcdefgh", now=0.0) + c.close(exit_code=0):
        b.push(p)
    shipped = []
    while (p := b.pop()) is not None:
        b.delivered(p)
        shipped.append(p)
    assert [(p.text, p.truncated, p.dropped_bytes, p.final) for p in shipped] == [
        ("abcd", True, 0, False), ("", True, 4, False), ("", True, 0, True)]


@pytest.mark.parametrize("lines", [5, TAIL_LINES - 1, TAIL_LINES, TAIL_LINES + 1, 50])
def test_the_tail_of_one_large_write_is_its_last_lines_and_a_line_begun_before_it_completes_it(lines):
    c = chunker()
    c.feed(OUT, b"begun ", now=0.0)
    c.feed(OUT, b"".join(f"l{i}\n".encode() for i in range(lines)) + b"open", now=0.0)
    tail = [t for _, t in c.close(exit_code=0)[-1].tail]
    expected = ["begun l0"] + [f"l{i}" for i in range(1, lines)] + ["open"]
    assert tail == expected[-TAIL_LINES:]
