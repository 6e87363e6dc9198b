"""Argument checks shared by every room: each raises ``ValueError`` naming ``owner.key``.

The message always has the key, the value given and what is allowed, so a bad YAML value
is reported as e.g. ``InfoNCE.temperature must be > 0, got 0.0``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")

__all__ = [
    "check_at_least",
    "check_choice",
    "check_known_keys",
    "check_nonnegative",
    "check_positive",
    "check_rate",
]


def check_rate(owner: str, key: str, value: float) -> float:
    """Return ``float(value)`` if it is in ``[0, 1]``."""
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{owner}.{key} must be in [0, 1], got {value}")
    return value


def check_positive(owner: str, key: str, value: float) -> float:
    """Return ``float(value)`` if it is finite and ``> 0``."""
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{owner}.{key} must be > 0, got {value}")
    return value


def check_nonnegative(owner: str, key: str, value: float) -> float:
    """Return ``float(value)`` if it is finite and ``>= 0``."""
    value = float(value)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{owner}.{key} must be >= 0, got {value}")
    return value


def check_at_least(owner: str, key: str, value: int, minimum: int = 1) -> int:
    """Return ``int(value)`` if it is an integer ``>= minimum``."""
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise ValueError(f"{owner}.{key} must be an integer >= {minimum}, got {value}")
    return int(value)


def check_choice(owner: str, key: str, value: T, allowed: Collection[T]) -> T:
    """Return ``value`` if it is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{owner}.{key}={value!r} is not one of {list(allowed)}")
    return value


def check_known_keys(
    owner: str, key: str, given: Iterable[str], known: Sequence[str], noun: str
) -> None:
    """Check that every name in ``given`` (a mapping's keys) is one of ``known``.

    Args:
        owner: the class or command the setting belongs to.
        key: the setting, a mapping keyed by names (``table_overrides``, ``objective_weights``).
        given: the names it uses.
        known: the names it may use, in the order the message lists them.
        noun: what the names are, plural (``"fields"``, ``"objectives"``).

    Raises:
        ValueError: ``owner.key names unknown <noun> [sorted unknown]; <noun> are [known]``.

    """
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(f"{owner}.{key} names unknown {noun} {unknown}; {noun} are {list(known)}")
