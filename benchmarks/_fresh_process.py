"""The one way a benchmark runs a measurement in a fresh process.

A measurement needs a process of its own when it reads process-wide state: peak resident
memory, glibc's malloc settings (read at start-up), environment variables, a torchrun world.
The parent names a module-level function of a benchmark and its arguments; the child,
``python -m benchmarks._fresh_process MODULE FUNCTION ARGS_JSON`` (behind an optional
launcher such as torchrun), imports the module, calls the function and sends its return
value back as one JSON line on the process's original stdout. Everything else the child
prints goes to its stderr: the parent's terminal, or a file whose tail a failure reports.

    run_in_fresh_process(measure, rows, steps)           # -> measure(rows, steps) there
    with FreshProcess(worker, seed, quiet=False) as child:  # a conversation
        val = child.recv(); child.send(wanted); test = child.recv()

Arguments and results travel as JSON (tuples arrive as lists). A worker talks back with
:func:`to_parent` / :func:`from_parent`; its return value is the last message.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "@benchmark-message "  # marks a message line (a launcher may print lines of its own)
_channel: TextIO | None = None  # in a child: the original stdout, where messages go


class ChildError(RuntimeError):
    """The fresh process failed: its error, or its exit status and the tail of its output."""


def _address(target: Callable) -> tuple[str, str]:
    """Module and name by which a fresh interpreter finds ``target``."""
    module, name = target.__module__, target.__qualname__
    if "." in name or "<" in name:
        raise ValueError(f"{name}: only a module-level function can run in a fresh process")
    if module == "__main__":  # a benchmark run as `python benchmarks/x.py`
        module = f"benchmarks.{Path(sys.modules['__main__'].__file__).stem}"
    return module, name


class FreshProcess:
    """``target(*args)`` running in a fresh interpreter, with a JSON channel to it.

    Args:
        target: a module-level function (of a benchmark, or any importable module).
        *args: its JSON-serializable arguments.
        env: the child's environment (default: this one); the repository root is put on its
            ``PYTHONPATH`` so that ``benchmarks`` imports.
        cwd: the child's working directory (default: this one's).
        launcher: arguments between the interpreter and ``-m``, e.g. ``("-m",
            "torch.distributed.run", "--nproc_per_node", "2")``: each process it starts runs
            the child; the first message sent wins.
        quiet: keep the child's output in a file (its tail goes into a failure's message)
            instead of passing it through to this process's stderr.

    """

    def __init__(
        self,
        target: Callable,
        *args: Any,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        launcher: Sequence[str] = (),
        quiet: bool = True,
    ) -> None:
        module, name = _address(target)
        self.label = f"{module}.{name}"
        env = dict(os.environ if env is None else env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        self._log = tempfile.TemporaryFile() if quiet else None  # noqa: SIM115 - closed in wait
        command = [sys.executable, *launcher, "-m", __name__, module, name, json.dumps(args)]
        # A session of its own: kill() reaches a launcher's workers too, and nothing else.
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        self._buffer = b""

    def send(self, value: Any) -> None:
        """Send ``value`` to the child (it reads it with :func:`from_parent`)."""
        self.process.stdin.write((json.dumps({"value": value}) + "\n").encode())
        self.process.stdin.flush()

    def recv(self, timeout: float | None = None) -> Any:
        """The child's next message; raises :class:`ChildError` if it failed or ended first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            line = self._line(deadline)
            if line is None:
                self.process.wait()
                raise ChildError(
                    self._failure(
                        f"ended (exit status {self.process.returncode}) without sending a result"
                    )
                )
            at = line.find(PREFIX)
            if at < 0:
                continue  # a launcher's own line
            message = json.loads(line[at + len(PREFIX) :])
            if "error" in message:
                self.kill()
                raise ChildError(self._failure(f"raised:\n{message['error']}"))
            return message["value"]

    def _line(self, deadline: float | None) -> str | None:
        """The next line of the child's message channel, None at its end."""
        fd = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], wait)[0]:
                self.kill()
                raise ChildError(self._failure("timed out"))
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the child to exit; raises :class:`ChildError` unless it exited with 0."""
        if self.process.stdin and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ChildError(self._failure("timed out")) from None
        if code != 0:
            raise ChildError(self._failure(f"exited with status {code}"))
        self._close_log()

    def kill(self) -> None:
        """Stop the child now, with every process it started (its process group)."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def _failure(self, what: str) -> str:
        tail = ""
        if self._log is not None and not self._log.closed:
            self._log.seek(0)
            tail = self._log.read().decode(errors="replace")[-4000:]
        output = f"\n--- its output:\n{tail}" if tail else ""
        return f"{self.label} in a fresh process {what}{output}"

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()

    def __enter__(self) -> FreshProcess:
        return self

    def __exit__(self, kind: type | None, *_: object) -> None:
        if kind is not None:
            self.kill()
            self._close_log()
        else:
            self.wait()


def run_in_fresh_process(
    target: Callable, *args: Any, timeout: float | None = None, **options: Any
) -> Any:
    """``target(*args)`` computed in a fresh interpreter: its JSON return value.

    Args:
        target: a module-level function.
        *args: its JSON-serializable arguments.
        timeout: seconds for the whole run (None: no limit); then :class:`ChildError`.
        **options: ``env``, ``cwd``, ``launcher``, ``quiet`` of :class:`FreshProcess`.

    Raises:
        ChildError: the function raised, the process died or timed out.

    """
    start = time.monotonic()
    with FreshProcess(target, *args, **options) as child:
        value = child.recv(timeout)
        child.wait(None if timeout is None else max(0.0, timeout - (time.monotonic() - start)))
    return value


def to_parent(value: Any) -> None:
    """In a fresh process: send ``value`` to the parent (its :meth:`FreshProcess.recv`)."""
    if _channel is None:
        raise RuntimeError("to_parent: this process was not started by FreshProcess")
    _channel.write(PREFIX + json.dumps({"value": value}) + "\n")
    _channel.flush()


def from_parent() -> Any:
    """In a fresh process: the next value the parent sent (:meth:`FreshProcess.send`)."""
    line = sys.stdin.readline()
    if not line:
        raise EOFError("the parent closed the channel")
    return json.loads(line)["value"]


def serve(argv: Sequence[str]) -> None:
    """The child's side: ``MODULE FUNCTION ARGS_JSON`` -> call it, send the result or error."""
    global _channel
    module, name, args = argv[0], argv[1], json.loads(argv[2])
    sys.stdout.flush()
    _channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the function's own output, Python's and C's, goes to stderr
    try:
        value = getattr(importlib.import_module(module), name)(*args)
    except BaseException:  # noqa: BLE001 - every failure goes back to the parent
        _channel.write(PREFIX + json.dumps({"error": traceback.format_exc()}) + "\n")
        _channel.flush()
        sys.stdout.flush()
        sys.exit(1)
    to_parent(value)
    sys.stdout.flush()


if __name__ == "__main__":
    # Run as this package module's copy: the function's to_parent() reaches the channel that
    # copy holds (this `__main__` is a second module object).
    from benchmarks._fresh_process import serve as _serve

    _serve(sys.argv[1:])
