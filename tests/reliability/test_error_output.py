"""What a user sees when ``ssl-rec fit`` meets a malformed Criteo row: the error is the last line.

The console command runs in a fresh process, its standard output and error sent to one pipe
(a log) or to a pseudo-terminal with a window size (where tqdm draws live bars), and the
output is read as a terminal shows it: a carriage return overwrites the line it is on.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import numpy as np
import pytest

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "ctr" / "criteo.yaml"
CONSOLE_SCRIPT = "import sys; from ssl_rec.cli import main; sys.exit(main())"
TIMEOUT_S = 240
BAD_LINE = 123  # 1-based, of 300 rows
# Colours are harmless; any other escape sequence (cursor moves) would defeat _screen.
_SGR = re.compile(r"\x1b\[[0-9;]*m")

MALFORMED = {
    "non-numeric dense": (
        lambda row: [*row[:3], "abc", *row[4:]],
        "column 'I3' must be a number, got 'abc'",
    ),
    "too few columns": (lambda row: row[:20], "expected 40 tab-separated columns, got 20"),
}


def _criteo_rows(n: int, seed: int = 0) -> list[list[str]]:
    """Rows in Criteo's raw layout: label, I1-I13 counts, C1-C26 hex hashes; empty = missing."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        dense = [str(v) if rng.random() > 0.2 else "" for v in rng.integers(-2, 500, 13)]
        cats = [f"{v:08x}" if rng.random() > 0.1 else "" for v in rng.integers(0, 60, 26) * 7919]
        rows.append([str(int(rng.random() < 0.25)), *dense, *cats])
    return rows


def _malformed_file(tmp_path: Path, case: str) -> Path:
    rows = _criteo_rows(300)
    rows[BAD_LINE - 1] = MALFORMED[case][0](rows[BAD_LINE - 1])
    path = tmp_path / "bad.txt"
    path.write_text("".join("\t".join(row) + "\n" for row in rows))
    return path


def _command(path: Path, tmp_path: Path) -> list[str]:
    return [sys.executable, "-c", CONSOLE_SCRIPT, "fit", "--config", str(CONFIG),
            "--data.path", str(path), "--trainer.max_steps", "2",
            f"--trainer.default_root_dir={tmp_path / 'run'}",
            f"--data.init_args.cache_dir={tmp_path / 'cache'}"]  # fmt: skip


def _run_to_pipe(command: list[str], cwd: Path) -> tuple[int, str]:
    """Exit status and output of ``command`` with stdout and stderr on one pipe, in order."""
    done = subprocess.run(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=TIMEOUT_S)  # fmt: skip
    return done.returncode, done.stdout


def _run_in_terminal(command: list[str], cwd: Path) -> tuple[int, str]:
    """Exit status and raw output of ``command`` on a 120x40 pseudo-terminal."""
    try:
        master, terminal = os.openpty()
    except OSError as e:
        pytest.skip(f"no pseudo-terminal here: {e}")
    # A pty starts 0x0, where tqdm draws nothing: give it a real terminal's size.
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(command, cwd=cwd, stdin=terminal, stdout=terminal, stderr=terminal,
                            start_new_session=True)  # fmt: skip
    os.close(terminal)
    chunks, deadline, quiet_since = [], time.monotonic() + TIMEOUT_S, None
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    data = os.read(master, 1 << 16)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 5:  # a leftover child holds the terminal
                    break
        else:
            proc.kill()
            pytest.fail(f"no exit in {TIMEOUT_S} s: {b''.join(chunks)!r}")
    finally:
        os.close(master)
    return proc.wait(timeout=30), b"".join(chunks).decode("utf-8", "replace")


def _screen(raw: str) -> list[str]:
    """The non-empty lines a terminal shows for ``raw`` (``\\r`` overwrites from column 0)."""
    text = _SGR.sub("", raw)
    assert "\x1b" not in text, f"cursor escape sequences in the output: {raw!r}"
    lines = []
    for line in text.replace("\r\n", "\n").split("\n"):
        shown = ""
        for part in line.split("\r"):
            shown = part + shown[len(part) :]
        if shown.strip():
            lines.append(shown.rstrip())
    return lines


@pytest.mark.parametrize(
    ("output", "case"), [("pipe", "non-numeric dense"), ("terminal", "too few columns")]
)
def test_a_malformed_row_ends_the_output_with_one_error_line(tmp_path, output, case) -> None:
    path = _malformed_file(tmp_path, case)
    run = _run_to_pipe if output == "pipe" else _run_in_terminal
    code, raw = run(_command(path, tmp_path), tmp_path)
    lines = _screen(raw)
    assert code == 2, raw
    assert "Traceback" not in raw, raw
    errors = [line for line in lines if "ssl-rec: error:" in line]
    assert len(errors) == 1, lines
    # The last line, and the whole of it: no bar drawn over it, nothing printed after it.
    assert lines[-1].startswith("ssl-rec: error: "), lines
    assert f"{path}, line {BAD_LINE}: {MALFORMED[case][1]}" in lines[-1], lines[-1]
    tail = raw[raw.index("ssl-rec: error:") :]
    assert "\r" not in tail.rstrip("\r\n") and "\n" not in tail.rstrip("\r\n"), repr(tail)
    # Each status line once: one preprocessing attempt, no line repeated.
    assert raw.count("preprocessing into") == 1, raw
    assert len(lines) == len(set(lines)), lines
    if output == "pipe":
        assert "\r" not in raw, repr(raw)  # plain lines in a log, no redrawn bar
    else:
        assert "\rcount:" in raw, repr(raw)  # the live bar was drawn (and closed above)
