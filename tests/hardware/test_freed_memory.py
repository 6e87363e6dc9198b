"""The ``ssl-rec`` command keeps freed memory for reuse instead of unmapping it each step."""

import subprocess
import sys

import pytest

from ssl_rec.hardware.freed_memory import keep_freed_memory

_PROBE = """
import torch
from ssl_rec.hardware.freed_memory import keep_freed_memory

def released_mib():
    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
    block = torch.ones(64 << 18)  # 64 MiB, every page written
    before = rss()
    del block
    return before - rss()

print(released_mib(), keep_freed_memory(), released_mib())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's allocator")
def test_freed_blocks_stay_in_the_process_once_asked():
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    released_before, accepted, released_after = float(out[0]), out[1], float(out[2])
    assert released_before > 48  # glibc's default: a 64 MiB block is unmapped when freed
    assert accepted == "True" and released_after < 8  # now it stays for the next step


def test_the_environment_variable_turns_it_off(monkeypatch):
    monkeypatch.setenv("SSL_REC_KEEP_FREED_MEMORY", "0")
    assert keep_freed_memory() is False
