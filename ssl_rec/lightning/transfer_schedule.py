"""How a fine-tuned CTR model uses its pretrained backbone: parts, learning rates, freezing.

Three knobs of :class:`~ssl_rec.lightning.CTRModule` (validated by
:func:`check_transfer_settings`):

- ``transfer``: which parts of the ``init_from`` backbone are loaded (:data:`TRANSFER_PARTS`;
  :func:`ssl_rec.lightning.checkpoint_loading.load_backbone_weights` loads them).
- ``encoder_lr_scale``: the backbone's dense parameters (encoder, ``[MASK]`` tokens) step at
  ``learning_rate * encoder_lr_scale``, the new head at ``learning_rate``
  (:func:`dense_parameter_groups`).
- ``freeze_backbone_epochs``: linear probing, then fine-tuning (LP-FT; Kumar et al., ICLR 2022,
  https://arxiv.org/abs/2202.10054): the backbone, tables included, is frozen for the first
  ``N`` epochs, so the randomly initialised head does not push large gradients through the
  pretrained features (:func:`apply_backbone_freeze`). The phase is a function of the epoch
  the trainer is in, so a resumed run in the frozen phase stays frozen.

The optimizer holds every dense parameter from the first step, frozen or not, so its saved
state has the same layout in both phases; :func:`regroup_optimizer_state` adapts a saved
state whose parameter groups were split differently (another ``encoder_lr_scale``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from torch import nn

TransferParts = Literal["backbone", "tables"]
# backbone: embedding tables, [MASK] tokens, encoder and dense statistics (every backbone.*
# entry); tables: embedding tables and [MASK] tokens only (a fresh encoder, this data's dense
# statistics).
TRANSFER_PARTS: tuple[str, ...] = ("backbone", "tables")


def check_transfer_settings(
    transfer: str, encoder_lr_scale: float, freeze_backbone_epochs: int, finetune: str,
    has_objectives: bool, owner: str = "CTRModule",
) -> None:  # fmt: skip
    """Refuse transfer settings that are out of range or contradict the others.

    Raises:
        ValueError: one line naming ``owner``'s argument, the value and what is accepted.

    """
    if transfer not in TRANSFER_PARTS:
        raise ValueError(
            f"{owner}.transfer must be one of {list(TRANSFER_PARTS)}, got {transfer!r}"
        )
    if isinstance(encoder_lr_scale, bool) or not (
        isinstance(encoder_lr_scale, int | float) and encoder_lr_scale > 0
    ):
        raise ValueError(
            f"{owner}.encoder_lr_scale must be a number > 0, got {encoder_lr_scale!r} (to keep "
            "the backbone fixed use finetune=linear_probe)"
        )
    epochs = freeze_backbone_epochs
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ValueError(
            f"{owner}.freeze_backbone_epochs must be an integer >= 0, "
            f"got {freeze_backbone_epochs!r}"
        )
    if freeze_backbone_epochs and finetune != "full":
        raise ValueError(
            f"{owner}.freeze_backbone_epochs={freeze_backbone_epochs} needs finetune=full (with "
            f"finetune={finetune} the backbone is frozen for the whole run)"
        )
    if freeze_backbone_epochs and has_objectives:
        raise ValueError(
            f"{owner}.freeze_backbone_epochs={freeze_backbone_epochs} cannot be combined with "
            "objectives (they train the backbone); set it to 0 or drop the objectives"
        )


def dense_parameter_groups(
    module: nn.Module, backbone: nn.Module, learning_rate: float, encoder_lr_scale: float,
    scheduled: bool,
) -> list[dict[str, Any]]:  # fmt: skip
    """The optimizer's parameter groups: the backbone's, then the rest, in ``parameters()`` order.

    Args:
        module: the LightningModule (its ``parameters()`` start with the backbone's).
        backbone: ``module.backbone``.
        learning_rate: the head's learning rate.
        encoder_lr_scale: the backbone's dense parameters step at ``learning_rate * scale``.
        scheduled: whether a freezing schedule will toggle the backbone's ``requires_grad``:
            its parameters are then held even while frozen.

    Returns:
        One group (all at ``learning_rate``) when the scale is 1, else two; parameters that
        do not require grad (outside a schedule) are left out.

    """
    own = {id(p) for p in backbone.parameters()}
    trainable = [p for p in module.parameters() if p.requires_grad or (scheduled and id(p) in own)]
    if encoder_lr_scale == 1:
        return [{"params": trainable, "lr": learning_rate}]
    groups = [
        {"params": [p for p in trainable if id(p) in own], "lr": learning_rate * encoder_lr_scale},
        {"params": [p for p in trainable if id(p) not in own], "lr": learning_rate},
    ]
    return [g for g in groups if g["params"]]


def apply_backbone_freeze(backbone: Any, frozen_params: list[nn.Parameter], frozen: bool) -> None:
    """Freeze (or unfreeze) the backbone's dense parameters and tables for a schedule's phase.

    Args:
        backbone: a :class:`~ssl_rec.models.Backbone`.
        frozen_params: the parameters this schedule froze (filled when freezing, emptied when
            unfreezing), so parameters frozen by design stay frozen.
        frozen: the phase to enter.

    """
    if frozen:
        if not frozen_params:
            frozen_params.extend(p for p in backbone.parameters() if p.requires_grad)
            for p in frozen_params:
                p.requires_grad_(False)
    else:
        for p in frozen_params:
            p.requires_grad_(True)
        frozen_params.clear()
    backbone.freeze_tables(frozen)


def regroup_optimizer_state(
    optimizer_state: dict[str, Any], groups: Sequence[Mapping[str, Any]]
) -> None:  # fmt: skip
    """Split a saved optimizer state's parameters as ``groups`` are split, in place.

    Parameter indices run through the groups in order, so a state saved with one group and
    one saved with the backbone's and the head's groups hold the same per-parameter state;
    only the groups' boundaries differ. A state of another total size is left alone (the
    optimizer's own check then refuses it). A regrouped group takes the saved first group's
    settings and the learning rate of its counterpart in ``groups``.

    Args:
        optimizer_state: a saved ``Optimizer.state_dict()``.
        groups: this run's parameter groups (:func:`dense_parameter_groups`).

    """
    sizes = [len(g["params"]) for g in groups]
    saved = optimizer_state.get("param_groups") or []
    if [len(g["params"]) for g in saved] == sizes:
        return
    flat = [i for g in saved for i in g["params"]]
    if len(flat) != sum(sizes) or not saved:
        return
    settings = {k: v for k, v in saved[0].items() if k != "params"}
    regrouped, start = [], 0
    for size, group in zip(sizes, groups, strict=True):
        regrouped.append({**settings, "lr": group["lr"], "params": flat[start : start + size]})
        start += size
    optimizer_state["param_groups"] = regrouped
