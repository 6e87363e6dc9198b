"""Class paths read back from an artifact name ssl-rec classes, or classes the user allowed.

A checkpoint, a quantized model directory or any other file ssl-rec wrote stores how to
rebuild its parts as ``{"class_path": ..., "init_args": ...}`` configs (and LightningCLI's
``{"_class_path": ..., **init_args}``). Rebuilding imports and calls what they name, so a
hostile file could name ``os.system``. :func:`check_class_paths` walks such a config before
anything is imported or built and refuses every class path that is not

- under ``ssl_rec`` and resolving to a class defined in ssl-rec (``ssl_rec.cli.main.os.system``
  names a function of ``os`` through an attribute, and is refused), or
- under an entry the user allowed with :func:`allowed_classes` (``ssl-rec --allow_class``),
  resolving to a class defined in that entry's top-level package.

A dotted string given for a constructor argument that takes a class or a callable is an
import path too (jsonargparse imports ``"pkg.mod.fn"`` for a ``Callable`` argument), so it is
held to the same rule. Configs the user writes (YAML, command-line values, Python objects)
are never checked: only what is read back from a file.
"""

from __future__ import annotations

import collections.abc
import contextlib
import contextvars
import dataclasses
import enum
import importlib
import inspect
import os
import re
import typing
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

BUILTIN_ENTRIES = ("ssl_rec",)
CLASS_PATH_KEYS = ("class_path", "_class_path")
_DOTTED = re.compile(r"[^\W\d]\w*(\.[^\W\d]\w*)+")
# Hints whose string values jsonargparse takes literally (never as an import path).
_LITERAL_TYPES = (str, int, float, bool, bytes, type(None), enum.Enum, os.PathLike,
                  list, tuple, dict, set, frozenset)  # fmt: skip
_ALLOWED: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "ssl_rec_allowed_classes", default=()
)


class UntrustedClassPath(ValueError):
    """A config read from a file names a class outside the allow-list (one-line message)."""


@contextlib.contextmanager
def allowed_classes(entries: Iterable[str] = ()) -> Iterator[tuple[str, ...]]:
    """Also trust the class paths under ``entries`` while the block runs.

    Args:
        entries: class paths (``my_pkg.models.MyEncoder``) or package prefixes
            (``my_pkg``, which allows ``my_pkg.*``); added to those already allowed.

    Yields:
        Every entry allowed inside the block, ``ssl_rec`` first.

    Example:
        >>> with allowed_classes(["my_pkg"]):  # doctest: +SKIP
        ...     module = load_module("runs/own/checkpoints/last.ckpt")

    """
    added = tuple(_valid_entry(e) for e in entries)
    token = _ALLOWED.set(_ALLOWED.get() + added)
    try:
        yield allowed_entries()
    finally:
        _ALLOWED.reset(token)


def allowed_entries() -> tuple[str, ...]:
    """The allowed entries in effect: ``ssl_rec`` and those of enclosing :func:`allowed_classes`."""
    return BUILTIN_ENTRIES + _ALLOWED.get()


def check_class_paths(
    config: Any, where: str, key: str = "", owner: type | None = None
) -> None:  # fmt: skip
    """Refuse ``config`` if any class path inside it is not allowed (nothing is built).

    Args:
        config: plain values read from a file (dicts, lists, scalars).
        where: the file, for the message.
        key: the key path of ``config`` in the file (``hyper_parameters``), for the message.
        owner: the class ``config``'s top-level keys are arguments of, when the caller knows
            it (``CTRModule.load_from_checkpoint``); else its ``_class_path`` says.

    Raises:
        UntrustedClassPath: naming ``where``, the key path and the class path.

    """
    _walk(config, where, key, owner)


def resolve_class(path: Any, where: str, key: str) -> type:
    """The class ``path`` names, once it has passed :func:`check_class_paths`' rule.

    Raises:
        UntrustedClassPath: naming ``where`` and ``key`` when it is not allowed.

    """
    return _checked(path, where, key, callable_ok=False)


def _valid_entry(entry: str) -> str:
    entry = entry.strip()
    if not _DOTTED.fullmatch(entry) and not entry.isidentifier():
        raise ValueError(
            f"allowed class {entry!r} (--allow_class, allow_classes): expected a package "
            "prefix or a class path, such as my_pkg or my_pkg.models.MyEncoder"
        )
    return entry


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


def _walk(value: Any, where: str, key: str, owner: type | None = None) -> None:
    if isinstance(value, Mapping):
        if "_class_path" in value or "class_path" in value or owner is not None:
            _check_node(value, where, key, owner)
        for name, item in value.items():
            _walk(item, where, _join(key, str(name)))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _walk(item, where, f"{key}[{i}]")


def _check_node(node: Mapping[str, Any], where: str, key: str, owner: type | None) -> None:
    """One ``class_path`` / ``_class_path`` dict: its class, then its import-path arguments."""
    cls = owner
    args, args_key = {k: v for k, v in node.items() if not str(k).startswith("_")}, key
    if "_class_path" in node:
        named = _checked(node["_class_path"], where, _join(key, "_class_path"))
        cls = owner or named  # the class Lightning builds when it is given, else the named one
    if "class_path" in node:
        cls = _checked(node["class_path"], where, _join(key, "class_path"))
        args, args_key = {}, _join(key, "init_args")
        for part in ("init_args", "dict_kwargs"):
            if isinstance(node.get(part), Mapping):
                args.update(node[part])
    if isinstance(cls, type):
        _check_arguments(cls, args, where, args_key)


def _check_arguments(cls: type, args: Mapping[str, Any], where: str, key: str) -> None:
    """Dotted strings given for arguments that take a class or a callable are import paths."""
    hints = _init_hints(cls)
    for name, value in args.items():
        hint = hints.get(name, Any)
        if _takes_import_paths(hint):
            for suffix, text in _direct_strings(value):
                if _DOTTED.fullmatch(text):
                    _checked(text, where, _join(key, str(name)) + suffix, callable_ok=True)
        record = _dataclass_of(hint)
        if record is not None and isinstance(value, Mapping) and not _is_class_config(value):
            _check_arguments(record, value, where, _join(key, str(name)))


def _is_class_config(value: Mapping[str, Any]) -> bool:
    return any(k in value for k in CLASS_PATH_KEYS)


def _direct_strings(value: Any) -> list[tuple[str, str]]:
    """``(key suffix, string)`` of ``value`` itself, or of its items (``dict[str, Objective]``)."""
    if isinstance(value, str):
        return [("", value)]
    if isinstance(value, list | tuple):
        return [(f"[{i}]", v) for i, v in enumerate(value) if isinstance(v, str)]
    if isinstance(value, Mapping) and not _is_class_config(value):
        return [(f".{k}", v) for k, v in value.items() if isinstance(v, str)]
    return []


def _init_hints(cls: type) -> dict[str, Any]:
    """Type hints of ``cls``'s constructor; an unresolvable one counts as taking a class."""
    init = cls if dataclasses.is_dataclass(cls) else cls.__init__
    try:
        return typing.get_type_hints(init)
    except Exception:  # noqa: BLE001 - a name only imported for type checking, a bad string
        try:
            names = inspect.signature(cls).parameters
        except (TypeError, ValueError):
            return {}
        return dict.fromkeys(names, type)


def _takes_import_paths(hint: Any) -> bool:
    """Whether jsonargparse may read a string given for ``hint`` as an import path."""
    if hint is Any:
        return False
    if hint in (collections.abc.Callable, typing.Callable, type):
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return False
    if origin in (collections.abc.Callable, type):
        return True
    if origin is not None:  # unions, containers, Annotated
        return any(_takes_import_paths(a) for a in typing.get_args(hint) if _is_hint(a))
    if not isinstance(hint, type) or dataclasses.is_dataclass(hint):
        return False
    return not issubclass(hint, _LITERAL_TYPES)


def _is_hint(value: Any) -> bool:
    return isinstance(value, type) or typing.get_origin(value) is not None or value is Any


def _dataclass_of(hint: Any) -> type | None:
    """The dataclass in ``hint`` (``TableSpec | None`` -> ``TableSpec``), if any."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    for arg in typing.get_args(hint):
        found = _dataclass_of(arg)
        if found is not None:
            return found
    return None


def _checked(path: Any, where: str, key: str, callable_ok: bool = False) -> Any:
    """The object ``path`` names, imported only after its string passed the allow-list."""
    entries = allowed_entries()
    if not isinstance(path, str) or not _DOTTED.fullmatch(path):
        raise UntrustedClassPath(
            f"{where}: {key} is {path!r}, not a class path (module.Class)"
        )  # fmt: skip
    entry = next((e for e in entries if path == e or path.startswith(e + ".")), None)
    if entry is None:
        _refuse(where, key, path, "which is not an ssl-rec class")
    try:
        obj = _import(path)
    except (ImportError, AttributeError) as e:
        reason = " ".join(f"{type(e).__name__}: {e}".split())
        _refuse(where, key, path, f"which cannot be imported ({reason})")
    home = str(getattr(obj, "__module__", None) or "")
    what = f"{home}.{getattr(obj, '__qualname__', type(obj).__name__)}"
    package = entry.split(".")[0]
    if not (isinstance(obj, type) or (callable_ok and inspect.isfunction(obj))):
        raise UntrustedClassPath(f"{where}: {key} names {path!r}, which resolves to {what}: "
                                 "not a class")  # fmt: skip
    if not (home == package or home.startswith(package + ".")):
        # reached through an attribute (``ssl_rec.x.os.system``): no allowance makes it a class
        # of the allowed package, so the message suggests none
        raise UntrustedClassPath(f"{where}: {key} names {path!r}, which resolves to {what}, "
                                 f"defined outside {package}")  # fmt: skip
    return obj


def _refuse(where: str, key: str, path: str, reason: str) -> typing.NoReturn:
    raise UntrustedClassPath(
        f"{where}: {key} names {path!r}, {reason}; pass --allow_class {path} "
        f"(allow_classes=[{path!r}] in Python) if you trust this file"
    )


def _import(path: str) -> Any:
    """``module.attr...`` resolved as jsonargparse does: the longest importable module prefix."""
    parts = path.split(".")
    for end in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:end])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
                continue  # not a module: an attribute of a shorter prefix, or not there at all
            raise
        for attr in parts[end:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(f"No module named {parts[0]!r}", name=parts[0])
