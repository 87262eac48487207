"""Memory units: one definition of the megabyte the whole package reports in.

Why binary: budgets, RSS and weight sizes are counted in pages and allocator blocks, so every
``MB`` in this package (parameters, messages, tables) is 2**20 bytes.
"""
from __future__ import annotations

MB = 1 << 20


def to_mb(nbytes: float) -> float:
    """Bytes as (fractional) MB."""
    return nbytes / MB


def from_mb(mb: float) -> int:
    """MB as whole bytes (rounded down)."""
    return int(mb * MB)
