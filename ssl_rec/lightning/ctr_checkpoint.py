"""A CTR checkpoint as post-training quantization starts from it: the module and its FP32 form.

Lives with the Lightning modules it reads (``ssl_rec.quantize`` sits below Lightning and
never imports it); ``ssl-rec quantize``, ``explain`` and ``monitor`` and the serving
benchmark use it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ssl_rec.lightning.checkpoint_loading import load_module, read_checkpoint
from ssl_rec.lightning.ctr_module import CTRModule
from ssl_rec.quantize.model import Architecture, FloatCTR
from ssl_rec.quantize.serving_wide import ServingWide

__all__ = ["load_ctr"]


def load_ctr(ckpt: str | os.PathLike[str]) -> tuple[CTRModule, FloatCTR]:
    """The CTR module of checkpoint ``ckpt`` (in eval mode) and its FP32 serving form.

    Args:
        ckpt: a checkpoint of :class:`~ssl_rec.lightning.CTRModule` written by ``ssl-rec fit``.

    Raises:
        ValueError: the checkpoint holds another model, or does not describe its backbone.

    """
    module = load_module(ckpt)
    if not isinstance(module, CTRModule):
        raise ValueError(
            f"{ckpt}: not a CTR model ({type(module).__name__}); quantization "
            "needs a checkpoint of ssl_rec.lightning.CTRModule"
        )
    module.eval()
    hparams = read_checkpoint(ckpt).get("hyper_parameters", {})
    backbone = hparams.get("backbone")
    if not isinstance(backbone, Mapping) or "init_args" not in backbone:
        raise ValueError(
            f"{ckpt}: the checkpoint does not describe its backbone as a config "
            "(train it with `ssl-rec fit` to quantize it)"
        )
    encoder = dict(
        backbone["init_args"].get("encoder") or {"class_path": "ssl_rec.models.DLRMEncoder"}
    )
    wide = None if module.wide is None else ServingWide.from_wide(module.wide)
    architecture = Architecture(
        module.backbone.dims.embedding_dim,
        encoder,
        list(hparams.get("head_hidden") or []),
        wide=wide is not None,
    )
    return module, FloatCTR.from_backbone(module.backbone, module.head, architecture, wide)
