"""A job's output as the agent ships it: chunks of one run's stdout or stderr, on
``teto.logs.<job_id>.<attempt>.<rank>.<executor_id>`` (stream LOGS, kept for days, bounded per run).

A chunk is text decoded from the process's bytes (invalid UTF-8 shown as U+FFFD, NUL as U+FFFD). ``offset``
counts the bytes of that stream the run wrote before the chunk, so a reader sees every gap; ``dropped_bytes``
says how much was lost right before it (the agent's buffer was full, or the bus refused); ``truncated`` marks the
chunk after which the run's limit stopped the shipping. The last chunk of a run is ``final``: it carries the exit
status and the run's last lines (both streams, in the order the agent read them), which a failed job's view shows.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BeforeValidator, Field

from .bounds import INT32_MAX, Big, Count, Epoch, Id, Int32, bounded_text, defuse
from .envelope import Envelope, Model

MAX_CHUNK_CHARS = 65536  # the agent cuts chunks by bytes (TETO_LOG_CHUNK_BYTES, at most this)
TAIL_LINES = 20
MAX_TAIL_LINE_CHARS = 1000

ChunkText = Annotated[bounded_text(MAX_CHUNK_CHARS), BeforeValidator(defuse)]
TailText = Annotated[bounded_text(MAX_TAIL_LINE_CHARS), BeforeValidator(defuse)]


class LogStream(StrEnum):
    STDOUT = "stdout"  # the process's standard output
    STDERR = "stderr"  # its standard error


class TailLine(Model):
    stream: LogStream
    text: TailText = Field(description="One line, without its newline (cut to 1,000 characters)")


class LogChunk(Envelope):
    SCHEMA = "teto.logs.chunk/1"

    job_id: Id
    epoch: Epoch
    attempt: int = Field(ge=1, le=INT32_MAX, description="The job's attempt this run served (RunJob.attempt)")
    rank: Count = 0
    executor_id: Id
    stream: LogStream
    offset: Big = Field(description="Bytes of this stream the run wrote before this chunk")
    text: ChunkText = ""
    dropped_bytes: Big = Field(0, description="Output lost right before this chunk (buffer full, bus refused)")
    truncated: bool = Field(False, description="The run's log limit is reached: no more output is shipped")
    final: bool = Field(False, description="The run's last chunk (its process has exited)")
    exit_code: Int32 | None = Field(None, description=(
        "final: the process's exit status: a command's as a shell reports it (128 + N when killed by signal N); "
        "the built-in fine-tune's negative when killed by a signal"))
    tail: list[TailLine] = Field(default_factory=list, max_length=TAIL_LINES,
                                 description="final: the run's last lines, both streams in the order read")
