"""``fit --ckpt_path``: the command's configuration runs, checked against the checkpoint's.

LightningCLI would replace the command's model settings with the checkpoint's saved
hyperparameters (``_parse_ckpt_path``) and say nothing. Here the command's settings run, and
``config.yaml`` records them; before training they are compared with what the checkpoint
was trained with:

- a **structural** value (one that changes a saved tensor's shape or dtype or what the saved
  rows mean: module and encoder classes, ``embedding_dim``, the tables' precision, cache
  fraction, cache policy and optimizer, per-field table overrides, encoder, head and
  objective layer sizes, ``finetune``, the data's fields and cardinalities) that differs
  is refused in one line naming the key and both values;
- any other difference (learning rates, batch size, data paths, ``max_steps``, callbacks)
  is applied and logged in one line each: ``resuming with KEY NEW (checkpoint: OLD)``.

Both sides are compared as the modules record them (``module.hparams``, the data module's
``hparams``), so defaults the command did not spell out and the checkpoint also had are no
difference. Trainer settings are not in a checkpoint: they are compared with the
``config.yaml`` the resumed run left in the same run directory, if there is one.
"""

from __future__ import annotations

import fnmatch
import json
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch
import yaml

from ssl_rec.hardware.table_allocation import declared_state

log = logging.getLogger(__name__)

MODEL, DATA = "model", "data"
# Keys of the saved module hyperparameters (LightningCLI's ``_class_path`` plus init args,
# nested classes as class_path / init_args) whose change changes a tensor's shape or dtype.
STRUCTURAL_MODEL_KEYS = (
    "_class_path",
    "backbone.class_path",
    "backbone.init_args.embedding_dim",
    # TableSpec.layout(): what shapes a table's tensors
    "backbone.init_args.tables.precision",
    "backbone.init_args.tables.cache_fraction",
    "backbone.init_args.tables.cache_policy",
    "backbone.init_args.tables.optimizer",
    "backbone.init_args.tables.column_blocks",
    "backbone.init_args.table_overrides",
    "backbone.init_args.table_overrides.*.precision",
    "backbone.init_args.table_overrides.*.cache_fraction",
    "backbone.init_args.table_overrides.*.cache_policy",
    "backbone.init_args.table_overrides.*.optimizer",
    "backbone.init_args.table_overrides.*.column_blocks",
    "backbone.init_args.encoder.class_path",
    "backbone.init_args.encoder.init_args.bottom",  # DLRM
    "backbone.init_args.encoder.init_args.top",
    "backbone.init_args.encoder.init_args.cross_layers",  # DCNv2
    "backbone.init_args.encoder.init_args.low_rank",
    "backbone.init_args.encoder.init_args.deep",  # DCNv2, DeepFM
    "head_hidden",  # CTRModule
    "wide",  # CTRModule: the wide term's tables and dense weight
    "finetune",  # which parameters the saved optimizer state belongs to
    "objectives.*.class_path",  # PretrainModule: each objective's heads
    "objectives.*.init_args.hidden",
    "objectives.*.init_args.projection_dim",
    "objectives.*.init_args.generator_hidden",
    "objectives.*.init_args.full_softmax_max",
    "objectives.*.init_args.queue_size",
)
# Linked from the data, compared as its fields and cardinalities below.
_SCHEMA_KEY = "schema"
# Values that name the run rather than configure it.
_NOT_COMPARED = ("ckpt_path", "model", "data")


class Difference(NamedTuple):
    """One configuration value that differs between the command and the resumed run."""

    key: str
    value: Any
    saved: Any
    structural: bool

    def describe(self, source: str = "checkpoint") -> str:
        """``KEY VALUE (checkpoint: SAVED)``."""
        return f"{self.key} {_show(self.value)} ({source}: {_show(self.saved)})"


def is_structural(key: str) -> bool:
    """Whether a module hyperparameter ``key`` (dotted, as saved) shapes the saved tensors."""
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in STRUCTURAL_MODEL_KEYS)


def flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, leaf value)`` of nested mappings; lists are leaves."""
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            yield from flatten(item, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, value


def hparams_differences(current: Mapping[str, Any], saved: Mapping[str, Any],
                        where: str, structural: bool) -> list[Difference]:  # fmt: skip
    """Differences of two hyperparameter dicts, keyed as the command line spells them.

    Args:
        current: what the command's module records (``module.hparams``).
        saved: what the checkpoint holds.
        where: ``"model"`` or ``"data"``.
        structural: whether :func:`is_structural` applies (model) or nothing is (data).

    """
    mine = dict(flatten({k: v for k, v in current.items() if k != _SCHEMA_KEY}))
    theirs = dict(flatten({k: v for k, v in saved.items() if k != _SCHEMA_KEY}))
    out = []
    for key in sorted(set(mine) | set(theirs), key=_order(mine, theirs)):
        value, old = (
            mine.get(key, _empty_parent(key, mine)),
            theirs.get(key, _empty_parent(key, theirs)),
        )
        if _same(value, old) or _split(key, mine, theirs) or _split(key, theirs, mine):
            continue  # a parent recorded as "none" on one side: its children are compared
        # a key one side does not record (another version's module) is logged, not refused:
        # the tensor comparison still catches a shape it changes
        shaped = structural and is_structural(key) and _UNSET not in (value, old)
        out.append(Difference(_cli_key(where, key), value, old, shaped))
    return out


def schema_differences(current: Mapping[str, Any] | None,
                       saved: Mapping[str, Any] | None) -> list[Difference]:  # fmt: skip
    """The data's dense columns and fields with cardinalities, when they differ (structural)."""
    if not current or not saved:
        return []
    out = []
    for part, read in (("dense", _dense), ("fields", _fields)):
        if read(current) != read(saved):
            out.append(Difference(f"data schema {part}", read(current), read(saved), True))
    return out


def state_differences(state: Mapping[str, torch.Tensor],
                      saved: Mapping[str, Any]) -> list[Difference]:  # fmt: skip
    """Tensors whose shape or dtype differ, or that one side lacks (the last line of defence).

    Lightning loads a resumed model's state strictly, so any of these would fail there, with
    a traceback instead of a line.
    """
    out = []
    for key in [*state, *(k for k in saved if k not in state)]:
        new, old = state.get(key), saved.get(key)
        if not isinstance(new, torch.Tensor) and not isinstance(old, torch.Tensor):
            continue
        if _layout(new) != _layout(old):
            out.append(Difference(f"model state {key}", _layout(new), _layout(old), True))
    return out


def check_resume(module: Any, datamodule: Any, checkpoint: Mapping[str, Any], path: str) -> None:
    """Refuse a structural difference between the command and checkpoint ``path``; log the rest.

    Args:
        module: the command's LightningModule, built from its configuration.
        datamodule: the command's data module (or ``None``).
        checkpoint: the loaded checkpoint dict (without ``state_dict``, as read of a sharded
            directory, the saved tensors' shapes are not compared).
        path: the checkpoint's path, for the message.

    Raises:
        ValueError: one line naming the first structural key and both values.

    """
    hparams = dict(getattr(module, "hparams", {}) or {})
    saved = dict(checkpoint.get("hyper_parameters") or {})
    differences = hparams_differences(hparams, saved, MODEL, structural=True) if saved else []
    differences += schema_differences(hparams.get(_SCHEMA_KEY), saved.get(_SCHEMA_KEY))
    data_saved = checkpoint.get("datamodule_hyper_parameters")
    if datamodule is not None and isinstance(data_saved, Mapping):
        data = dict(getattr(datamodule, "hparams", {}) or {})
        differences += hparams_differences(data, data_saved, DATA, structural=False)
    refused = [d for d in differences if d.structural]
    if not refused and hasattr(module, "state_dict") and "state_dict" in checkpoint:
        with declared_state():  # shapes only: declared tables stay unallocated until sharded
            state = module.state_dict()
        refused = state_differences(state, checkpoint["state_dict"] or {})
    if refused:
        raise ValueError(
            f"cannot resume {path} with {refused[0].describe()}: it changes the saved model's "
            "shape; resume with the checkpoint's value, or start a new run in another "
            "--trainer.default_root_dir"
        )
    for difference in differences:
        log.info("resuming with %s", difference.describe())


def log_trainer_changes(current: Mapping[str, Any], root: str | Path) -> None:
    """Log the settings (trainer, seed...) that differ from the run's previous ``config.yaml``.

    Args:
        current: the command's config as plain values (``model`` and ``data`` are compared
            with the checkpoint instead).
        root: the run directory; nothing is logged without ``<root>/config.yaml``.

    """
    path = Path(root) / "config.yaml"
    try:
        previous = yaml.safe_load(path.read_text()) if path.is_file() else None
    except (OSError, yaml.YAMLError):
        previous = None
    if not isinstance(previous, Mapping):
        return
    mine = {k: v for k, v in current.items() if k not in _NOT_COMPARED}
    theirs = {k: v for k, v in previous.items() if k not in _NOT_COMPARED}
    for difference in hparams_differences(mine, theirs, "", structural=False):
        log.info("resuming with %s", difference.describe(f"previous run, {path.name}"))


class _Unset:
    def __repr__(self) -> str:
        return "unset"


_UNSET = _Unset()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    if (a is None or a == {} or a == []) and (b is None or b == {} or b == []):
        return True  # "no head layers" / "no overrides" either way
    return a == b


def _split(key: str, one: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """Whether ``key`` is a leaf of ``one`` only because ``other`` has children under it."""
    return key not in other and any(k.startswith(f"{key}.") for k in other)


def _empty_parent(key: str, flat: Mapping[str, Any]) -> Any:
    """``None`` / ``{}`` of a parent of ``key`` recorded as a leaf ("no overrides"), else unset."""
    parts = key.split(".")
    for end in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:end])
        if parent in flat:
            return flat[parent] if flat[parent] in (None, {}) else _UNSET
    return _UNSET


def _order(*dicts: Mapping[str, Any]) -> Any:
    """Keys in the order they were saved, not alphabetically (the config's own order)."""
    seen: dict[str, int] = {}
    for d in dicts:
        for key in d:
            seen.setdefault(key, len(seen))
    return seen.__getitem__


def _cli_key(where: str, key: str) -> str:
    """The command-line spelling of a saved key: ``model.init_args.learning_rate``."""
    if not where:
        return key
    if key == "_class_path":
        return f"{where}.class_path"
    return f"{where}.init_args.{key}"


def _show(value: Any) -> str:
    if value is _UNSET:
        return "unset"
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, separators=(",", ":"), default=str)[:200]
    except (TypeError, ValueError):
        return repr(value)[:200]


def _dense(schema: Mapping[str, Any]) -> list[str]:
    return [str(name) for name in schema.get("dense", [])]


def _fields(schema: Mapping[str, Any]) -> list[str]:
    return [f"{f.get('name')}:{f.get('cardinality')}" for f in schema.get("categorical", [])]


def _layout(tensor: Any) -> str:
    if not isinstance(tensor, torch.Tensor):
        return "absent"
    return f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}"
