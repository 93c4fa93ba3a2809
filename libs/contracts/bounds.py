"""Bounded wire types: what every field of every Teto message may hold, so that anything a message decodes to
can be stored by PostgreSQL, sent by NATS and used by the code that reads it.

A value that passes a contract but cannot be applied is a poison message: jsonb refuses ``\\u0000``, a bigint
column refuses ``2**63``, an int4 column anything past ``2**31 - 1``, a subject refuses an id with a ``.``, and an
infinite float serialises as ``null``. So strings are bounded and NUL-free (names, ids and actors also free of
C0 and C1 control characters), ids match :data:`ID_PATTERN` (a subset of what a subject token allows), integers are bounded
by the column that stores them (int4) or by what a float and a JSON reader keep exact (``2**53``), floats are
finite, and free-form ``detail`` objects are checked as JSON values. Every message and nested model uses these.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, StringConstraints

# Ids become subject tokens and durable consumer names: no '.', '*', '>', whitespace (see subjects._token).
# Every id Teto makes fits: uuid4 hex (jobs, commands, runs, messages), "<host>-<6 hex>" executor and node ids
# (hosts cut to 120 characters by the executor's settings), group names, Idempotency-Keys.
ID_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"

MAX_SAFE_INT = 2**53  # exact in a float and in every JSON reader; bigint columns hold it
INT32_MAX = 2**31 - 1  # int4 columns (epochs, sequences, attempts, counts of devices)
MAX_SECONDS = 1e10  # about 300 years: no duration Teto measures is longer, and sums of them stay finite
# torch.manual_seed refuses anything past 2**64 - 1, and the fine-tune seeds its batches with
# (seed x world_size + rank) x 1_000_003 + step: 2**32 - 1 keeps that in range for 256 workers and 10**7 steps.
SEED_MAX = 2**32 - 1
MAX_JSON_DEPTH = 32

# C0, DEL and C1 (U+0080-U+009F: CSI, NEL and the rest that a terminal or a log viewer acts on like C0).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL (\\u0000)")
    return value


def _no_control(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError("must not contain control characters")
    return value


def _check_json(value: Any, depth: int = 0) -> None:
    """A free-form JSON value that jsonb can store and a reader can use: no NUL, exact ints, finite floats."""
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, str):
        _no_nul(value)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if abs(value) > MAX_SAFE_INT:
            raise ValueError(f"integer {value} is outside +-2**53")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("numbers must be finite")
    elif isinstance(value, dict):
        for key, item in value.items():
            _no_nul(str(key))
            _check_json(item, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_json(item, depth + 1)


def _json_object(value: dict[str, Any]) -> dict[str, Any]:
    _check_json(value)
    return value


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _finite_only(value: Any) -> Any:
    """Metrics a training script reported: only finite numbers under usable names travel; the rest is dropped."""
    if not isinstance(value, dict):
        return value
    kept = {k: v for k, v in value.items()
            if isinstance(k, str) and 0 < len(k) <= 200 and not _CONTROL.search(k)
            and isinstance(v, int | float) and not isinstance(v, bool) and abs(v) < 1e300}
    return dict(list(kept.items())[:1000])


def _utc(value: datetime) -> datetime:
    """Times are UTC and in a range every reader can shift by a time zone without overflowing."""
    try:
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:
        raise ValueError("time out of range") from None
    if not 1970 <= value.year <= 9998:
        raise ValueError("time must lie between the years 1970 and 9998")
    return value


def defuse(value: Any) -> Any:
    """Text quoted from hostile input (a path, a refused value), made storable: NULs become U+FFFD."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {defuse(str(k)): defuse(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [defuse(v) for v in value]
    return value


def bounded_text(max_length: int, *, min_length: int = 0) -> Any:
    """Free text (reasons, errors): bounded, NUL-free."""
    return Annotated[str, StringConstraints(min_length=min_length, max_length=max_length), AfterValidator(_no_nul)]


def bounded_name(max_length: int = 200, *, min_length: int = 0) -> Any:
    """A name a person reads (job names, actors, hosts, versions): bounded, no control characters."""
    return Annotated[str, StringConstraints(min_length=min_length, max_length=max_length),
                     AfterValidator(_no_control)]


Id = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
# Output quoted from a process (an error tail, a check's message): a NUL in it is shown as U+FFFD, not refused,
# so that reporting a failure can never fail itself.
QuotedOutput = Annotated[bounded_text(8000), BeforeValidator(defuse)]
Reason = bounded_text(8000)  # a run's error tail (RunFinished.error) becomes job events' reason
Label = bounded_name(200)
Actor = bounded_name(200, min_length=1)
Address = bounded_name(255)  # a host, or host:port
# host:port built from an Address by the queue or health ("[host]:port" for IPv6): room for the brackets and port.
Rendezvous = bounded_name(300)
Path = bounded_text(4096, min_length=1)  # PATH_MAX on Linux
Digest = Annotated[str, StringConstraints(pattern=r"^[0-9a-fA-F]{1,128}$")]
EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME_PATTERN, max_length=256)]
ArgvItem = bounded_text(131072)  # MAX_ARG_STRLEN: the kernel refuses longer single arguments
EnvValue = bounded_text(131072)
MetricName = bounded_name(200, min_length=1)

Int32 = Annotated[int, Field(ge=-INT32_MAX - 1, le=INT32_MAX)]
Epoch = Annotated[int, Field(ge=1, le=INT32_MAX)]  # int4 columns
Seq = Annotated[int, Field(ge=1, le=INT32_MAX)]  # event and usage sequences live in int4 columns
Count = Annotated[int, Field(ge=0, le=INT32_MAX)]  # attempts, devices, ranks, reboots (int4)
Big = Annotated[int, Field(ge=0, le=MAX_SAFE_INT)]  # steps, bytes (bigint, and exact as a JSON number)

Finite = Annotated[float, Field(allow_inf_nan=False)]
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
PositiveSeconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
Figures = Annotated[dict[MetricName, Finite], Field(max_length=1000)]
# A diverged run reports a loss of nan: informational figures that are not finite are reported as absent.
Observed = Annotated[Finite | None, BeforeValidator(_finite_or_none)]
ObservedFigures = Annotated[Figures, BeforeValidator(_finite_only)]
JsonObject = Annotated[dict[str, Any], AfterValidator(_json_object)]
Time = Annotated[datetime, AfterValidator(_utc)]
