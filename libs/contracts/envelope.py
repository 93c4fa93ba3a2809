"""The envelope every Teto message carries: a versioned schema name, a unique id and a time.

A message class declares ``SCHEMA = "name/version"``; the field ``schema`` on the wire must equal it, so a
consumer never mistakes one message for another, and a bumped version is refused loudly rather than
half-understood. Trace context travels in NATS headers, not here; a decoded message keeps the context it arrived
with beside its fields (``received_trace``, never serialised).
"""

from __future__ import annotations

import copy
import functools
import json
import os
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from .bounds import Id, Label, Time, bounded_text, defuse


def new_id() -> str:
    """A random id used for messages, commands and jobs: a version-4 UUID's 32 hex digits, what
    ``uuid.uuid4().hex`` gives, made without building the UUID object (a third of its cost, once per message)."""
    n = int.from_bytes(os.urandom(16))
    return f"{n & _UUID4_CLEAR | _UUID4_SET:032x}"


# The version (4) and variant (RFC 4122) bits of a UUID, as ``uuid.UUID(..., version=4)`` sets them.
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48)) & ((1 << 128) - 1)
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)


def utcnow() -> datetime:
    return datetime.now(UTC)


class ContractError(ValueError):
    """A message that does not match its contract; ``reason`` is what a person reads."""

    def __init__(self, schema: str, reason: str) -> None:
        super().__init__(f"{schema}: {reason}")
        self.schema = schema
        self.reason = reason


class Model(BaseModel):
    """A strict value object nested inside messages; its floats are finite (inf/nan would serialise as null)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True, allow_inf_nan=False)


class Envelope(Model):
    """Base of every message on a subject."""

    SCHEMA: ClassVar[str] = ""
    # The W3C trace headers this message arrived with (set by the consumer's edge; not part of the contract). A
    # slot, not a pydantic private attribute: those are initialised on every instance (pydantic's
    # ``init_private_attributes``, about a twentieth of a busy consumer's CPU), and most messages carry no trace.
    __slots__ = ("_received_trace",)

    schema_: Label = Field(default="", alias="schema", description="Schema name and version, e.g. teto.cmd.submit/1")
    id: Id = Field(default_factory=new_id, description="Unique message id (also the NATS de-duplication id)")
    time: Time = Field(default_factory=utcnow, description="When the message was made (UTC)")

    def note_trace(self, headers: dict[str, str]) -> None:
        object.__setattr__(self, "_received_trace", dict(headers))

    @property
    def received_trace(self) -> dict[str, str]:
        """The trace context noted on arrival; empty when none was (a fresh dict: never shared between messages)."""
        return getattr(self, "_received_trace", None) or {}

    def __copy__(self) -> Self:
        """A copy (``model_copy``) keeps the trace context it arrived with, as a pydantic private attribute would."""
        copied = super().__copy__()
        _copy_trace(self, copied)
        return copied

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Self:
        copied = super().__deepcopy__(memo)
        _copy_trace(self, copied)
        return copied

    def __eq__(self, other: object) -> bool:
        """Equal by the contract's fields: how a message travelled (its trace context) is not part of it."""
        if not isinstance(other, BaseModel):
            return NotImplemented
        return (type(self) is type(other) and self.__dict__ == other.__dict__
                and self.__pydantic_extra__ == other.__pydantic_extra__)

    __hash__ = None  # type: ignore[assignment] - mutable value objects, as pydantic's own

    @model_validator(mode="after")
    def _schema_matches(self) -> Self:
        if not self.schema_:
            object.__setattr__(self, "schema_", self.SCHEMA)
        elif self.schema_ != self.SCHEMA:
            raise ValueError(f"schema {self.schema_!r} is not {self.SCHEMA!r}")
        return self

    def encode(self) -> bytes:
        """The wire bytes: ``model_dump_json(by_alias=True).encode()``, made by the serializer straight to bytes
        (without the wrapper's keyword handling and the round trip through ``str``; once per message sent)."""
        return self.__pydantic_serializer__.to_json(self, by_alias=True)

    @classmethod
    def trusted(cls, **fields: Any) -> Self:
        """The message made without validating ``fields`` again: for a hot path whose every value is already of its
        field's type and within its bounds (a placement pass's grants: a stored, validated spec, the database's
        clock, its own counters), never for values from outside. A field left out takes its default (a new id,
        the time now); an unknown or missing field is refused; the schema is the class's. About a tenth of the
        constructor's cost (pydantic's ``model_construct`` costs more than validating)."""
        names, required, defaults, factories, private = _shape(cls)
        if not fields.keys() <= names or not required <= fields.keys():
            raise TypeError(f"{cls.__name__}.trusted: unknown {sorted(fields.keys() - names)}, "
                            f"missing {sorted(required - fields.keys())}")
        message = cls.__new__(cls)
        # In the fields' order (the order they are serialised in), as validation makes them: the defaults laid out
        # in that order once per class, then the given values put in their places (an update keeps the order).
        values = dict(defaults)
        for name, factory in factories:
            if name not in fields:
                values[name] = factory()
        values.update(fields)
        values["schema_"] = cls.SCHEMA
        object.__setattr__(message, "__dict__", values)
        object.__setattr__(message, "__pydantic_fields_set__", set(fields))
        object.__setattr__(message, "__pydantic_extra__", None)
        # As validation leaves it: None without private attributes (the received trace is a slot, not one)
        object.__setattr__(message, "__pydantic_private__",
                           {k: a.default_factory() if a.default_factory else copy.deepcopy(a.default)
                            for k, a in private} or None)
        return message

    @classmethod
    def decode(cls, data: bytes | str | dict[str, Any]) -> Self:
        """Parse wire data, raising ContractError with a readable reason for anything malformed."""
        try:
            if isinstance(data, dict):
                return cls.model_validate(data)
            return cls.model_validate_json(data)
        except ValidationError as exc:
            raise ContractError(cls.SCHEMA, describe(exc)) from None


def _copy_trace(source: Envelope, copied: Envelope) -> None:
    trace = getattr(source, "_received_trace", None)
    if trace is not None:
        object.__setattr__(copied, "_received_trace", dict(trace))


@functools.cache
def _shape(cls: type[Envelope]) -> tuple[frozenset[str], frozenset[str], dict[str, Any],
                                         tuple[tuple[str, Any], ...], tuple[tuple[str, Any], ...]]:
    """A message class's fields for ``Envelope.trusted``: names, required ones, every field in order with its
    default (a placeholder where a factory or the caller gives it), the (name, default factory) pairs, and the
    private attributes."""
    fields = cls.model_fields
    return (frozenset(fields), frozenset(n for n, f in fields.items() if f.is_required()),
            {n: f.default for n, f in fields.items()},
            tuple((n, f.default_factory) for n, f in fields.items() if f.default_factory is not None),
            tuple(cls.__private_attributes__.items()))


def schema_of(data: bytes | str) -> str | None:
    """The envelope's schema name without validating the rest (one subject can carry several schemas)."""
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value.get("schema") if isinstance(value, dict) else None


def describe(exc: ValidationError) -> str:
    """One line per problem: the field path and what is wrong with it."""
    parts = []
    for err in exc.errors()[:10]:
        loc = ".".join(str(p) for p in err.get("loc", ())) or "(message)"
        parts.append(f"{loc}: {err.get('msg')}")
    return "; ".join(parts)


# Text quoted from a hostile message: NULs shown as U+FFFD, so noting a refusal can never fail itself.
Quoted = Annotated[bounded_text(8000), BeforeValidator(defuse)]


class RejectedMessage(Envelope):
    """A message a consumer refused (malformed, hostile, wrong schema); kept so a person can see it."""

    SCHEMA = "teto.rejected/1"

    service: Label
    subject: Quoted
    reason: Quoted
    payload_excerpt: Annotated[bounded_text(2000), BeforeValidator(defuse)]
    payload_bytes: int = Field(ge=0)
