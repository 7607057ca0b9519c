r"""One line instead of JAX's C++ abort when a cluster's coordination service is gone.

JAX runs its coordination service inside process 0. When process 0 dies (killed, its host
gone, or ended on an error of its own), every other process's client polls an error from
the service and jaxlib ends the process at once with LOG(FATAL): an `E... Polled an error`
line, an `F... Terminating process because the JAX distributed service detected fatal
errors` message of several lines and a `*** Check failure stack trace: ***` of C++ frames.
No Python code runs before that abort: `jax.distributed.initialize` passes no
`missed_heartbeat_callback`, and a Python callable given to jaxlib's client ends the
process with `std::bad_cast` (the absl::Status it receives has no Python form).

So the text is mended where it is read: `install()` (core/cluster.py, once a process has
joined a cluster) sends this process's stderr through a small guard process, this file
run as a script, which passes every byte on unchanged except that abort, which it replaces
with one `error: ...` line saying which process is gone and what to do. The C++ warnings
and errors that come just before it (the preemption watcher and the error poll losing the
service) go with it: each such line is held half a second and dropped if the abort
follows. The guard reads until the pipe closes, ignores SIGINT and SIGTERM (a Ctrl-C or a
preemption notice is the tool's to handle; a guard that died would leave the tool writing
into a closed pipe) and uses the standard library only. `restore()` (at exit, and before
`core.cluster.leave`) gives the process its stderr back and waits for the guard to write
what it still holds.
"""

from __future__ import annotations

import atexit
import os
import re
import select
import signal
import subprocess
import sys
import time

FATAL = b"Terminating process because the JAX distributed service detected fatal errors"
# What the client's status says when the service itself stopped answering.
SERVICE_GONE = (b"Failed to send RPC to coordination service", b"Socket closed")
_STATUS = re.compile(rb"absl::Status: (.*)")
# The start of a C++ log line (glog's form: "E1127 19:02:48.165320 ..."). Warnings and errors
# come in bursts just before the abort (the preemption watcher and the error poll both
# lose the service), so each is held this long, and dropped if the abort follows.
_GLOG = re.compile(rb"^[WEF]\d{4} ")
_GLOG_PREFIX = re.compile(rb"^[WEF]\d{0,4}$|^[WEF]\d{4} ")
HOLD_SECONDS = 0.5
LINE_SECONDS = 0.1
_RESUME = "restart every process with the same command to resume"


def abort_line(fatal: bytes, num_processes: int) -> bytes:
    """The one line that replaces the abort whose FATAL line is `fatal`."""
    status = _STATUS.search(fatal)
    detail = status.group(1).decode(errors="replace").strip() if status else ""
    if any(sign in fatal for sign in SERVICE_GONE):
        text = (
            f"process 0 of {num_processes}, which runs JAX's coordination service, has ended or "
            f"is gone (killed, its host lost, or an error of its own: see its output): {_RESUME}"
        )
    else:
        text = (
            f"JAX's coordination service ended this cluster ({detail[:200]}): see every "
            f"process's output, then {_RESUME}"
        )
    return f"error: {text}\n".encode()


class AbortFilter:
    """Bytes in, bytes out: everything unchanged until the abort, which becomes one line,
    and nothing after it. A C++ warning or error line, and whatever follows it, is held
    HOLD_SECONDS first; text without its newline yet, LINE_SECONDS (so that a line printed
    in two writes stays one line beside what the process writes to stdout meanwhile).
    `feed(data, now)` returns what can be written now, `due(now)` what has been held long
    enough, `close()` the rest; `deadline` is when `due` next has something (None: never)."""

    def __init__(self, num_processes: int):
        self.num_processes = num_processes
        self._held = b""  # complete lines held until `_held_until`
        self._held_until: float | None = None
        self._partial = b""  # the last line, not yet ended by a newline, since `_partial_since`
        self._partial_since = 0.0
        self._aborted = False

    @property
    def deadline(self) -> float | None:
        if self._held_until is not None:
            return self._held_until
        if self._partial and not _GLOG_PREFIX.match(self._partial):
            return self._partial_since + LINE_SECONDS
        return None  # nothing held, or the start of a C++ log line: its newline will come

    def feed(self, data: bytes, now: float) -> bytes:
        if self._aborted:
            return b""
        *lines, partial = (self._partial + data).split(b"\n")
        if lines or not self._partial:
            self._partial_since = now
        self._partial = partial
        out = []
        for line in lines:
            if FATAL in line:
                self._aborted, self._held, self._held_until, self._partial = True, b"", None, b""
                return b"".join(out) + abort_line(line, self.num_processes)
            if self._held_until is None and _GLOG.match(line):
                self._held_until = now + HOLD_SECONDS
            if self._held_until is None:
                out.append(line + b"\n")
            else:
                self._held += line + b"\n"
        return b"".join(out) + self.due(now)

    def due(self, now: float) -> bytes:
        out = b""
        if self._held_until is not None and now >= self._held_until:
            out, self._held, self._held_until = self._held, b"", None
        deadline = self.deadline
        if self._held_until is None and deadline is not None and now >= deadline:
            out, self._partial = out + self._partial, b""
        return out

    def close(self) -> bytes:
        if self._aborted:
            return b""
        rest, self._held, self._partial, self._held_until = self._held + self._partial, b"", b"", None
        return rest


def _guard(num_processes: int, ready_fd: int) -> None:
    """The guard process: stdin (this tool's stderr) to stdout (the real stderr); says it is
    ready (its signals ignored) by closing `ready_fd`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.close(ready_fd)
    text = AbortFilter(num_processes)

    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(1, view) :]

    while True:
        wait = None if text.deadline is None else max(0.0, text.deadline - time.monotonic())
        if select.select([0], [], [], wait)[0]:
            data = os.read(0, 1 << 16)
            if not data:
                break
            write(text.feed(data, time.monotonic()))
        write(text.due(time.monotonic()))
    write(text.close())


_installed: tuple[subprocess.Popen, int] | None = None


def install(num_processes: int) -> None:
    """Sends this process's stderr (fd 2: Python's and C++'s) through the guard; once."""
    global _installed
    if _installed is not None:
        return
    sys.stderr.flush()
    real = os.dup(2)
    ready_read, ready_write = os.pipe()
    guard = subprocess.Popen(
        [sys.executable, "-I", os.path.abspath(__file__), str(num_processes), str(ready_write)],
        stdin=subprocess.PIPE,
        stdout=real,
        stderr=real,
        pass_fds=(ready_write,),
        start_new_session=True,  # not in the terminal's process group: no Ctrl-C for it
    )
    os.close(ready_write)
    os.read(ready_read, 1)  # returns when the guard closes its end: it ignores signals now
    os.close(ready_read)
    if guard.poll() is not None:  # it could not start: keep the plain stderr
        guard.stdin.close()
        os.close(real)
        return
    os.dup2(guard.stdin.fileno(), 2)
    guard.stdin.close()  # fd 2 is now the pipe's only write end here
    _installed = (guard, real)
    atexit.register(restore)


def restore(timeout: float = 2.0) -> None:
    """Gives fd 2 back to the real stderr and waits (at most `timeout` s) for the guard to
    write what it holds."""
    global _installed
    if _installed is None:
        return
    guard, real = _installed
    _installed = None
    sys.stderr.flush()
    os.dup2(real, 2)
    os.close(real)
    try:
        guard.wait(timeout)
    except subprocess.TimeoutExpired:  # a child of this process still holds the pipe
        pass


if __name__ == "__main__":
    _guard(int(sys.argv[1]), int(sys.argv[2]))
