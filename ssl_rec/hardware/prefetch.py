"""``AdmissionQueue``: cache admissions run ahead of their forward, optionally on a thread.

As in TorchRec's prefetch pipeline for FBGEMM's cache, the next batch's rows are admitted
while the current batch's dense layers run, so its misses leave the critical path. The
admission runs without the GIL on one helper thread (the compiled kernels release it and
stay on that thread), and every other use of the tables waits for it first: the order of
operations on the tables is the program order, so results are bit-identical to running
the same admission synchronously at the same point.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from ssl_rec.hardware.kernels.table_meta import AdmittedBatch

__all__ = ["AdmissionQueue"]


def _plan_dict(plan: AdmittedBatch | tuple[AdmittedBatch, ...]) -> dict[str, Any]:
    """Plain form of a plan (a tuple of plans for tables with column blocks)."""
    if isinstance(plan, AdmittedBatch):
        return plan._asdict()
    return {"calls": [part._asdict() for part in plan]}


def _plan_from(state: dict[str, Any]) -> AdmittedBatch | tuple[AdmittedBatch, ...]:
    """Inverse of :func:`_plan_dict`."""
    if "calls" in state:
        return tuple(AdmittedBatch(**part) for part in state["calls"])
    return AdmittedBatch(**state)


class AdmissionQueue:
    """At most one admission in flight, and the plans still waiting for their backward.

    Args:
        max_pending: Plans kept as pending (their rows locked in the cache); older ones are
            dropped, so a forward whose backward never runs cannot lock rows for ever.

    """

    def __init__(self, max_pending: int = 2) -> None:
        self.max_pending = max_pending
        self.pending: list[AdmittedBatch] = []
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._ahead: tuple[torch.Tensor, AdmittedBatch] | None = None
        self.used = 0
        self.discarded = 0

    def __getstate__(self) -> dict:
        self.wait()
        return {k: v for k, v in self.__dict__.items() if k not in ("_thread", "_error")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _thread=None, _error=None)

    def wait(self) -> None:
        """Block until the admission in flight (if any) is done; re-raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def add_pending(self, plan: AdmittedBatch) -> None:
        """Record an admitted plan whose backward has not run yet."""
        self.pending.append(plan)
        del self.pending[: -self.max_pending]

    def done(self, plan: AdmittedBatch) -> None:
        """The plan's backward ran: its rows are no longer locked."""
        self.pending = [p for p in self.pending if p is not plan]

    def start(
        self, ids: torch.Tensor, admit: Callable[[], AdmittedBatch], background: bool
    ) -> None:
        """Admit ``ids`` ahead with ``admit()``, on a helper thread if ``background``."""
        self.wait()
        self.discard()

        def run() -> None:
            try:
                plan = admit()
            except BaseException as err:  # noqa: BLE001 - re-raised by wait()
                self._error = err
                return
            self.add_pending(plan)
            self._ahead = (ids, plan)

        if not background:
            run()
            self.wait()
            return
        self._thread = threading.Thread(target=run, name="ssl_rec-admission", daemon=True)
        self._thread.start()

    def take(self, ids: torch.Tensor) -> AdmittedBatch | None:
        """The plan admitted ahead for exactly these ids, else None (and it is dropped)."""
        self.wait()
        if self._ahead is None:
            return None
        ahead_ids, plan = self._ahead
        self._ahead = None
        if ahead_ids.shape == ids.shape and torch.equal(ahead_ids, ids):
            self.used += 1
            return plan
        self.done(plan)
        self.discarded += 1
        return None

    def ahead_state(self) -> dict[str, Any] | None:
        """The plan admitted ahead, its ids and the pending plans, as plain tensors.

        What a checkpoint written between an admission ahead and its forward needs, so the
        resumed forward uses the same plan (``None``: nothing admitted ahead).
        """
        self.wait()
        if self._ahead is None:
            return None
        ids, plan = self._ahead
        index = next((i for i, p in enumerate(self.pending) if p is plan), None)
        return {"ids": ids, "plan": _plan_dict(plan), "pending_index": index,
                "pending": [_plan_dict(p) for p in self.pending]}  # fmt: skip

    def restore_ahead(self, state: dict[str, Any]) -> None:
        """Take back an :meth:`ahead_state`: its plan is used by the forward of its ids."""
        self.wait()
        pending = [_plan_from(p) for p in state["pending"]]
        index = state["pending_index"]
        plan = _plan_from(state["plan"]) if index is None else pending[index]
        self.pending, self._ahead = pending, (state["ids"], plan)

    def discard(self) -> None:
        """Forget a plan admitted ahead that no forward used (its rows stay cached)."""
        if self._ahead is not None:
            self.done(self._ahead[1])
            self._ahead = None
            self.discarded += 1
