"""How one run's output is cut for shipping (pure: no I/O, the clock is an argument).

The pipe readers feed bytes as the process writes them; ``Chunker`` cuts them into pieces per stream, by size
(``chunk_bytes``, at a newline when there is one) and by time (nothing waits longer than ``flush_seconds``),
and enforces the run's limit (``max_bytes`` over both streams): the piece that reaches it is marked
``truncated`` and nothing more is shipped; at the end, one empty ``truncated`` piece per stream says how much was
not. It also keeps the run's last lines (both streams, in the order read) for the final piece. ``Backlog`` holds
the pieces waiting for the bus, bounded in bytes: when full, the newest piece is dropped, and the next piece
delivered of that stream says how many bytes are missing before it (from the offsets, so a piece the bus
refused counts too). Nothing here can block the process: every structure is bounded and drops instead.
"""

from __future__ import annotations

import codecs
from collections import deque
from dataclasses import dataclass, field, replace

from libs.contracts.logs import MAX_TAIL_LINE_CHARS, TAIL_LINES, LogStream

PARTIAL_LINE_BYTES = 4 * MAX_TAIL_LINE_CHARS  # of an unfinished line, only this much is kept for the tail


@dataclass(frozen=True)
class LogLimits:
    chunk_bytes: int = 64000  # a piece is cut when this much is pending
    flush_seconds: float = 1.0  # ...or when its oldest byte has waited this long
    max_bytes: int = 16 * 1024 * 1024  # shipped per run, both streams together
    buffer_bytes: int = 1024 * 1024  # pieces waiting for the bus, at most


@dataclass(frozen=True)
class Piece:
    """A chunk of one stream, ready to become a LogChunk."""

    stream: LogStream
    offset: int  # bytes of the stream written before this piece
    nbytes: int
    text: str = ""
    truncated: bool = False
    final: bool = False
    exit_code: int | None = None
    tail: tuple[tuple[LogStream, str], ...] = ()
    dropped_bytes: int = 0  # set by Backlog.pop from the offsets


@dataclass
class _Pending:
    data: bytearray = field(default_factory=bytearray)
    offset: int = 0  # stream offset of data[0]
    since: float | None = None  # when its oldest byte arrived
    written: int = 0  # bytes the process wrote to the stream so far
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace"))
    partial: bytearray = field(default_factory=bytearray)  # the unfinished line, for the tail


class Tail:
    """The last lines a run wrote, both streams interleaved in the order read; each line cut to 1,000 chars."""

    def __init__(self, lines: int = TAIL_LINES) -> None:
        self.lines: deque[tuple[LogStream, str]] = deque(maxlen=lines)

    def add(self, stream: LogStream, pending: _Pending, data: bytes) -> None:
        # Only the last lines of a write can stay in the tail: split those alone (this runs for every read of the
        # pipe, in the agent's loop, and a process may write megabytes a second).
        newlines = data.count(b"\n")
        if newlines:
            *lines, rest = data.rsplit(b"\n", self.lines.maxlen)
            if newlines > len(lines):  # lines[0] holds earlier lines too: keep its last one
                lines[0] = lines[0].rsplit(b"\n", 1)[-1]
            else:
                lines[0] = bytes(pending.partial) + lines[0]
            pending.partial.clear()
            for line in lines:
                self.lines.append((stream, _line(line)))
        else:
            rest = data
        pending.partial += rest[:max(0, PARTIAL_LINE_BYTES - len(pending.partial))]

    def end(self, stream: LogStream, pending: _Pending) -> None:
        if pending.partial:
            self.lines.append((stream, _line(bytes(pending.partial))))
            pending.partial.clear()


def _line(raw: bytes) -> str:
    return raw[:PARTIAL_LINE_BYTES].decode("utf-8", "replace").rstrip("\r")[:MAX_TAIL_LINE_CHARS]


class Chunker:
    def __init__(self, limits: LogLimits) -> None:
        self.limits = limits
        self.streams = {s: _Pending() for s in LogStream}
        self.accepted = 0  # bytes taken for shipping (both streams), against max_bytes
        self.truncated = False
        self.closed = False
        self.tail = Tail()

    def feed(self, stream: LogStream, data: bytes, now: float) -> list[Piece]:
        """Take what the process wrote; the pieces now due by size (or by the limit)."""
        if self.closed or not data:
            return []
        pending = self.streams[stream]
        pending.written += len(data)
        self.tail.add(stream, pending, data)
        if self.truncated:
            return []
        room = self.limits.max_bytes - self.accepted
        take = data[:room]
        self.accepted += len(take)
        if take:
            if pending.since is None:
                pending.since = now
            pending.data += take
        if len(take) < len(data) or self.accepted >= self.limits.max_bytes:
            self.truncated = True
            out = [p for s in LogStream if s is not stream for p in self._flush(s)]
            last = self._flush(stream)
            if last:
                last[-1] = replace(last[-1], truncated=True)
            else:  # the limit fell exactly on an earlier piece: an empty marker at the point shipping stopped
                last = [Piece(stream, pending.offset, 0, truncated=True)]
            return out + last
        out = []
        while len(pending.data) >= self.limits.chunk_bytes:
            window = pending.data[:self.limits.chunk_bytes]
            cut = window.rfind(b"\n") + 1 or self.limits.chunk_bytes
            out.append(self._cut(stream, cut))
        return out

    def due(self, now: float) -> list[Piece]:
        """Pieces whose oldest byte has waited ``flush_seconds`` (the time cut)."""
        out = []
        for stream, pending in self.streams.items():
            if pending.since is not None and now - pending.since >= self.limits.flush_seconds:
                out += self._flush(stream)
        return out

    def close(self, exit_code: int | None) -> list[Piece]:
        """Everything still pending, a truncation marker per stream with bytes not shipped, and the final piece."""
        if self.closed:
            return []
        self.closed = True
        out = []
        for stream, pending in self.streams.items():
            out += self._flush(stream, final=True)
            self.tail.end(stream, pending)
            if pending.written > pending.offset:  # cut by the limit: the gap is the marker's dropped_bytes
                out.append(Piece(stream, pending.written, 0, truncated=True))
        out.append(Piece(LogStream.STDOUT, self.streams[LogStream.STDOUT].written, 0, truncated=self.truncated,
                         final=True, exit_code=exit_code, tail=tuple(self.tail.lines)))
        return out

    def _flush(self, stream: LogStream, final: bool = False) -> list[Piece]:
        pending = self.streams[stream]
        if not pending.data:
            if final:
                text = pending.decoder.decode(b"", final=True)
                if text:  # a multi-byte character cut at the very end
                    return [Piece(stream, pending.offset, 0, text=text)]
            return []
        return [self._cut(stream, len(pending.data), final=final)]

    def _cut(self, stream: LogStream, n: int, final: bool = False) -> Piece:
        pending = self.streams[stream]
        raw = bytes(pending.data[:n])
        del pending.data[:n]
        piece = Piece(stream, pending.offset, n, text=pending.decoder.decode(raw, final=final))
        pending.offset += n
        if not pending.data:
            pending.since = None
        return piece


class Backlog:
    """Pieces waiting for the bus, at most ``max_bytes`` of them (empty pieces, markers and the final one, always
    fit); ``pop`` sets each piece's ``dropped_bytes`` from what was delivered of its stream before it."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.queue: deque[Piece] = deque()
        self.bytes = 0
        self.dropped = 0  # bytes refused because the backlog was full (for the agent's log)
        self.delivered_to = {s: 0 for s in LogStream}  # per stream: end offset of the last piece delivered

    def push(self, piece: Piece) -> bool:
        if piece.nbytes and self.bytes + piece.nbytes > self.max_bytes:
            self.dropped += piece.nbytes
            return False
        self.queue.append(piece)
        self.bytes += piece.nbytes
        return True

    def pop(self) -> Piece | None:
        if not self.queue:
            return None
        piece = self.queue.popleft()
        self.bytes -= piece.nbytes
        gap = max(0, piece.offset - self.delivered_to[piece.stream])
        return replace(piece, dropped_bytes=gap) if gap else piece

    def delivered(self, piece: Piece) -> None:
        end = piece.offset + piece.nbytes
        self.delivered_to[piece.stream] = max(self.delivered_to[piece.stream], end)

    def __len__(self) -> int:
        return len(self.queue)
