"""The plain-value constructor config a module saves as its hyperparameters, and the way back.

``CTRModule`` and ``PretrainModule`` take their backbone factory and objectives either as
Python objects or as LightningCLI-style dicts (``{"class_path": ..., "init_args": ...}``).
Either way they record the dict form (:func:`ssl_rec._config.describe`) as their
hyperparameters, so a checkpoint made from Python and one made by ``ssl-rec fit`` hold
the same thing, rebuild with ``load_from_checkpoint(path)`` alone and load with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytorch_lightning as pl
from jsonargparse import ArgumentParser

from ssl_rec._config import CLASS_PATH, class_path, describe
from ssl_rec.models.backbone import Backbone
from ssl_rec.objectives.base import Objective

BackboneFactory = Callable[[dict], Backbone]
CLASS_PATH_KEY = "_class_path"


def instantiate_config(config: Mapping[str, Any], hint: Any, where: str) -> Any:
    """Build ``config`` (a ``class_path`` dict) as jsonargparse would for a ``hint`` argument.

    A ``Callable[..., Backbone]`` hint gives a factory (the ``init_args`` bound, the rest
    left for the caller), a class hint an instance.

    Raises:
        ValueError: naming ``where`` and jsonargparse's reason.

    """
    if CLASS_PATH not in config:
        raise ValueError(f"{where}: a config needs 'class_path', got keys {sorted(config)}")
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--value", type=hint)
    try:
        return parser.instantiate(parser.parse_object({"value": dict(config)})).value
    except Exception as e:  # noqa: BLE001 - jsonargparse raises several error types
        reason = " ".join(str(e).split()).removeprefix('Parser key "value": ')
        reason = reason.split(" Got value: Namespace(")[0] or type(e).__name__
        raise ValueError(f"{where}: cannot build {config[CLASS_PATH]!r}: {reason}") from e


def backbone_factory(backbone: BackboneFactory | Mapping[str, Any], owner: str) -> BackboneFactory:
    """The factory of a backbone given as a factory or as a ``class_path`` dict."""
    if isinstance(backbone, Mapping):
        return instantiate_config(backbone, BackboneFactory, f"{owner}.backbone")
    if not callable(backbone):
        raise TypeError(
            f"{owner}.backbone must be a factory (a Backbone class, functools.partial, or a "
            f"class_path dict), got {type(backbone).__name__}"
        )
    return backbone


def build_objectives(
    objectives: Mapping[str, Objective | Mapping[str, Any]], owner: str
) -> dict[str, Objective]:
    """The objectives, with those given as ``class_path`` dicts built."""
    return {
        name: instantiate_config(o, Objective, f"{owner}.objectives.{name}")
        if isinstance(o, Mapping) else o
        for name, o in objectives.items()
    }  # fmt: skip


def module_hparams(module: pl.LightningModule, **init_args: Any) -> dict[str, Any]:
    """The hyperparameters a module saves: its class path and plain-value ``init_args``.

    The ``_class_path`` key is LightningCLI's convention: ``ssl-rec test --ckpt_path`` and
    :func:`ssl_rec.lightning.load_module` rebuild the module from it.
    """
    owner = type(module).__name__
    return {CLASS_PATH_KEY: class_path(type(module)),
            **{k: describe(v, f"{owner}.{k}") for k, v in init_args.items()}}  # fmt: skip
