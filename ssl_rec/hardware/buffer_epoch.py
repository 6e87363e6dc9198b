"""A process-wide counter that moves whenever a table's buffer or submodule is replaced.

The kernels receive a table group's tensors as one validated handle that the group keeps
between calls (see ``TableGroup.tensors``); the handle stays valid until a tensor is replaced
(``module.to(...)``, ``load_state_dict(..., assign=True)``, assigning a buffer), which moves
this counter. Changes in place (``resize_``, ``set_``) are caught by the handle itself.
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["TracksReplacement", "current"]

_counter = [0]


def current() -> int:
    """The counter's value: equal values mean no tracked tensor was replaced in between."""
    return _counter[0]


class TracksReplacement(nn.Module):
    """An ``nn.Module`` whose buffer and submodule replacements move :func:`current`."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__.get("_buffers", ()) or name in self.__dict__.get("_modules", ()):
            _counter[0] += 1
        super().__setattr__(name, value)

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001, ANN202 - nn.Module's signature
        _counter[0] += 1
        return super()._apply(fn, recurse)
