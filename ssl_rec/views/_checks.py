"""Validation helpers shared by the views (kept private: not part of the public API)."""

from __future__ import annotations


def check_rate(owner: str, key: str, value: float) -> float:
    """Return ``float(value)``; raise ``ValueError`` naming ``owner.key`` unless in [0, 1]."""
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{owner}.{key} must be in [0, 1], got {value}")
    return value
