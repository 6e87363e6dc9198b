"""Constructor configs as plain values: how a model describes the parts it was built from.

A checkpoint must say how to rebuild its module without pickling Python objects, so
``torch.load(weights_only=True)`` can read it and the CLI and the Python API store the same
thing. :func:`describe` turns a constructor argument into LightningCLI's own form: plain
values, lists, dicts and ``{"class_path": ..., "init_args": {...}}`` for classes,
``functools.partial`` factories and instances of :class:`RecordsConfig` subclasses (which
remember the arguments they were built with).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
from collections.abc import Mapping
from typing import Any

CLASS_PATH, INIT_ARGS = "class_path", "init_args"
_RECORD = "_ssl_rec_init_args"


class RecordsConfig:
    """Mixin remembering the arguments an instance was constructed with (see :func:`describe`).

    Put it first among the bases (``class Objective(RecordsConfig, nn.Module)``); the
    arguments are bound to the signature with defaults applied, once, in ``__new__``.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """Create the instance and record ``args``/``kwargs`` bound to ``cls``'s signature."""
        obj = super().__new__(cls)
        try:
            bound = inspect.signature(cls).bind(*args, **kwargs)
        except TypeError:
            return obj  # __init__ raises its own, clearer error
        bound.apply_defaults()
        obj.__dict__[_RECORD] = dict(bound.arguments)
        return obj


def class_path(cls: type) -> str:
    """``module.QualName`` of a class, as LightningCLI writes it."""
    return f"{cls.__module__}.{cls.__qualname__}"


def describe(value: Any, where: str = "value") -> Any:
    """Plain-value description of ``value`` (see the module docstring).

    Args:
        value: a constructor argument.
        where: its name, for the error message.

    Raises:
        TypeError: naming ``where`` when ``value`` has no plain description.

    Example:
        >>> from fractions import Fraction
        >>> describe(functools.partial(Fraction, 3, denominator=4))
        {'class_path': 'fractions.Fraction', 'init_args': {'numerator': 3, 'denominator': 4}}

    """
    if isinstance(value, enum.Enum):
        return describe(value.value, where)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [describe(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        return {str(k): describe(v, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return {f.name: describe(getattr(value, f.name), f"{where}.{f.name}") for f in fields}
    if isinstance(value, type):
        return {CLASS_PATH: class_path(value)}
    if isinstance(value, functools.partial):
        return _describe_partial(value, where)
    recorded = getattr(value, "__dict__", {}).get(_RECORD)
    if recorded is not None:
        return {CLASS_PATH: class_path(type(value)),
                INIT_ARGS: describe(recorded, f"{where}.init_args")}  # fmt: skip
    raise TypeError(
        f"{where}: cannot describe a {type(value).__name__} as plain values for the checkpoint; "
        "pass a class, functools.partial(Class, ...) or {'class_path': ..., 'init_args': {...}}"
    )


def _describe_partial(factory: functools.partial, where: str) -> dict[str, Any]:
    # jsonargparse builds partial(wrapper, instantiator, Class, **kwargs): the class is the
    # last positional argument; a plain partial(Class, *args, **kwargs) has it as func.
    if isinstance(factory.func, type):
        cls, args = factory.func, factory.args
    elif factory.args and isinstance(factory.args[-1], type):
        cls, args = factory.args[-1], ()
    else:
        raise TypeError(f"{where}: a partial of {factory.func!r} is not a class factory")
    bound = inspect.signature(cls).bind_partial(*args, **factory.keywords)
    return {CLASS_PATH: class_path(cls),
            INIT_ARGS: describe(dict(bound.arguments), f"{where}.init_args")}  # fmt: skip
