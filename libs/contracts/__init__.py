"""Teto's wire contracts: versioned pydantic messages and the one module that spells subjects."""

from .envelope import ContractError, Envelope, Model, new_id, utcnow
from .subjects import DEFAULT_PREFIX, Subjects

__all__ = ["ContractError", "DEFAULT_PREFIX", "Envelope", "Model", "Subjects", "new_id", "utcnow"]
