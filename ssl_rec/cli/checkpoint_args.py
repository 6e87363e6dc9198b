"""Commands that start from a checkpoint take their model, data settings and vocabulary from it.

``ssl-rec validate|test|predict --ckpt_path CKPT`` needs no config: the checkpoint's model
config and data module settings become the first arguments, so ``--data.path new.csv`` (or
a ``--config``) only says what differs. Whatever data is given is encoded with the
checkpoint's vocabulary, as is the data of ``fit --model.init_from CKPT`` (fine-tuning) and
of ``fit --ckpt_path CKPT`` (resuming).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jsonargparse import Namespace

from ssl_rec.lightning.checkpoint_loading import read_checkpoint, vocabulary_of
from ssl_rec.vocab import Vocabularies

CKPT_COMMANDS = ("validate", "test", "predict")
DM_HPARAMS = "datamodule_hyper_parameters"
# Values the data or the run supplies, never the checkpoint.
_MODEL_KEYS_NOT_CARRIED = ("schema", "init_from")


def option_value(argv: Sequence[str], name: str) -> str | None:
    """Value of ``--name X`` or ``--name=X`` in ``argv`` (the last one wins), else ``None``."""
    value = None
    for i, arg in enumerate(argv):
        if arg == f"--{name}" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
    return value


def class_config(hparams: Mapping[str, Any], drop: Sequence[str] = ()) -> dict[str, Any]:
    """LightningCLI's saved ``{"_class_path", **init_args}`` as ``{"class_path", "init_args"}``."""
    init_args = {k: v for k, v in hparams.items() if not k.startswith("_") and k not in drop}
    return {"class_path": hparams["_class_path"], "init_args": init_args}


def checkpoint_defaults(argv: Sequence[str]) -> tuple[list[str], dict | None]:
    """``argv`` with the checkpoint's model and data configs first, and the loaded checkpoint.

    Only for ``validate``/``test``/``predict`` with a ``--ckpt_path`` naming a file or a
    sharded checkpoint directory; other command lines come back unchanged (with ``None``).
    """
    argv = list(argv)
    if not argv or argv[0] not in CKPT_COMMANDS:
        return argv, None
    path = option_value(argv[1:], "ckpt_path")
    if path is None or not Path(path).exists():  # a file, or a sharded checkpoint directory
        return argv, None
    checkpoint = read_checkpoint(path, mapped=True)  # configs are read; tables stay in the file
    defaults = []
    model = checkpoint.get("hyper_parameters") or {}
    if "_class_path" in model:
        defaults.append(f"--model={json.dumps(class_config(model, _MODEL_KEYS_NOT_CARRIED))}")
    data = checkpoint.get(DM_HPARAMS) or {}
    if "_class_path" in data:
        defaults.append(f"--data={json.dumps(class_config(data))}")
    return [argv[0], *defaults, *argv[1:]], checkpoint


def ckpt_path_checkpoint(
    config: Namespace, loaded: tuple[str, dict] | None
) -> tuple[str, dict] | None:  # fmt: skip
    """``(path, checkpoint)`` of the command's ``ckpt_path`` file, read once (else ``loaded``).

    Reading checks the checkpoint's class paths (:func:`read_checkpoint`), so a config
    file's ``ckpt_path`` is checked like ``--ckpt_path`` before LightningCLI parses it.
    """
    subcommand = config.get("subcommand")
    path = config[subcommand].get("ckpt_path") if subcommand else None
    if not path or not Path(str(path)).exists() or (loaded and loaded[0] == str(path)):
        return loaded
    return str(path), read_checkpoint(path, mapped=True)


def vocabulary_source(subcommand: str | None, config: Namespace) -> str | None:
    """The checkpoint whose vocabulary must encode the data of this command, if any."""
    ckpt_path = config.get("ckpt_path")
    if ckpt_path and Path(str(ckpt_path)).exists():  # a file or a sharded checkpoint dir
        return str(ckpt_path)
    init_from = config.get("model.init_args.init_from") if subcommand in ("fit", None) else None
    return str(init_from) if init_from else None


def checkpoint_vocabulary(path: str, loaded: tuple[str, dict] | None) -> Vocabularies | None:
    """The vocabulary of checkpoint ``path`` (reusing ``loaded = (path, checkpoint)``)."""
    return vocabulary_of(_checkpoint(path, loaded), path)


def recorded_dense_transforms(path: str, loaded: tuple[str, dict] | None) -> dict | None:
    """The per-column dense transforms checkpoint ``path``'s data recorded (``None``: none)."""
    hparams = _checkpoint(path, loaded).get("datamodule_hyper_parameters") or {}
    preprocess = hparams.get("preprocess") if isinstance(hparams, Mapping) else None
    transform = preprocess.get("dense_transform") if isinstance(preprocess, Mapping) else None
    return dict(transform) if isinstance(transform, Mapping) else None


def _checkpoint(path: str, loaded: tuple[str, dict] | None) -> dict:
    if loaded is not None and loaded[0] == path:
        return loaded[1]
    return read_checkpoint(path, mapped=True)
