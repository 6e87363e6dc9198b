"""Workers end with their launcher: a torchrun worker never outlives the agent that started it.

torchrun's workers are children of its agent process. When the agent dies without stopping
them (SIGKILL, OOM killer, a lost node), nothing else does: the workers keep training and
rewriting the run's checkpoints. :func:`follow_launcher` asks the kernel to kill this
process when its parent dies (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, Linux); where that
call fails, a watchdog thread polls the parent's pid instead and ends the process when it
changes.

SIGKILL rather than SIGTERM: a Lightning fit only notes SIGTERM and stops after the next
batch, through a collective with the other ranks, and with the ranks signalled at slightly
different moments that collective mismatched (a gloo abort) or waited: measured here,
SIGTERM left the workers running 3-5 s after the launcher's death, until a watchdog ended
them. Nothing is lost by not cleaning up:
checkpoints are swapped into place whole (:mod:`ssl_rec.distributed.dcp_checkpoint`), so a
worker killed during a save leaves the previous one.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time

LAUNCHER_ENV = "TORCHELASTIC_RUN_ID"  # set by torchrun (torch.distributed.run) in its workers
POLL_S = 0.25
EXIT_STATUS = 128 + signal.SIGKILL
_PR_SET_PDEATHSIG = 1
_following = False

log = logging.getLogger(__name__)

__all__ = ["follow_launcher"]


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    log.error("the launcher (pid %d) died; ending this worker", parent)
    os._exit(EXIT_STATUS)


def follow_launcher() -> bool:
    """End this process soon after its launcher dies, if it is a torchrun worker.

    Idempotent; called at the start of ``ssl-rec`` and by ``ShardedTablesStrategy``. A
    process that is no torchrun worker is left alone (``nohup ssl-rec fit &`` must survive
    its shell).

    Returns:
        Whether this process now follows its parent.

    """
    global _following
    if _following:
        return True
    if not os.environ.get(LAUNCHER_ENV) or not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed (errno %d); polling the launcher's pid",
                    ctypes.get_errno())  # fmt: skip
        threading.Thread(target=_watch, args=(parent,), name="follow-launcher",
                         daemon=True).start()  # fmt: skip
    if os.getppid() != parent:  # it died before the kernel was told
        os._exit(EXIT_STATUS)
    _following = True
    return True
