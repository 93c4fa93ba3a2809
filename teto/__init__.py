"""Teto: a control plane for GPU fine-tuning jobs under GPU-time ceilings."""

__version__ = "0.1.0"
