r"""One line instead of JAX's C++ abort when a cluster's coordination service is gone.

JAX runs its coordination service inside process 0. When process 0 dies (killed, its host
gone, or ended on an error of its own), every other process's client polls an error from
the service and jaxlib ends the process at once with LOG(FATAL): an `E... Polled an error`
line, an `F... Terminating process because the JAX distributed service detected fatal
errors` message of several lines and a `*** Check failure stack trace: ***` of C++ frames.
(The same abort, with another status naming the dead processes, ends every other process
when the service itself declares a process dead after its heartbeat timeout, which is
--peer_timeout: core/cluster.py passes it to `jax.distributed.initialize`.) No Python code
runs before that abort:
`jax.distributed.initialize` passes no `missed_heartbeat_callback`, and a Python callable
given to jaxlib's client ends the process with `std::bad_cast` (the absl::Status it receives
has no Python form).

So the text is mended where it is read: `install()` (core/cluster.py, once a process has
joined a cluster) sends this process's stderr through a small guard process, this file run
as a script, which passes every byte on unchanged except that abort, which it replaces
with one `error: ...` line saying which process is gone and what to do (none when the tool
has already printed its own `error:` line). The C++ warnings and errors that come just
before the abort (the preemption watcher and the error poll losing the service), with
their further lines, go with it: a C++ log line, and whatever follows it, is held
HOLD_SECONDS (longer while more come, MAX_HOLD_SECONDS at most); if the abort follows, the
C++ messages among them are dropped and the tool's own lines (its `error:` line, a traceback,
its log lines) written; any other line that follows a C++ line there is taken for part of
its message. The guard reads
until the pipe closes, ignores SIGINT and SIGTERM (a Ctrl-C or a preemption notice is the
tool's to handle; a guard that died would leave the tool writing into a closed pipe) and
uses the standard library only. A guard that cannot start leaves stderr as it was.

At the end: `restore()` (at exit) gives the process its stderr back and waits for the guard
to write what it holds; `core.cluster.leave` calls `silence()` instead, which sends fd 2 to
/dev/null, so that an abort racing with its `os._exit` adds nothing after the tool's line.
Exit handlers run in reverse order, so `restore()` runs before JAX's own shutdown (its
handler is registered when jax is imported): an abort inside that shutdown, at the end of
a successful run whose peer died in the same moment, is printed as JAX prints it.
The guard writes in its own process: a line it writes as its tool process dies can reach
the log a moment after that process's exit is seen (core/local_pod.py reads each process's
output until every writer has closed it).
"""

from __future__ import annotations

import atexit
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time

FATAL = b"Terminating process because the JAX distributed service detected fatal errors"
# What the client's status says when the service itself stopped answering.
SERVICE_GONE = b"Failed to send RPC to coordination service"
# ... and when the service declared a process dead (its heartbeat timeout, --peer_timeout),
# followed by the dead tasks' ids, one per line, and "The tasks have crashed ...".
HEARTBEATS_STOPPED = b"stopped sending heartbeats"
_DEAD_TASKS = re.compile(rb"stopped sending heartbeats\):(.*?)(?:The tasks have crashed|$)", re.S)
# The end of the abort's message: its stack trace.
_STACK_TRACE = b"*** Check failure stack trace"
_STATUS = re.compile(rb"absl::Status: (.*)")
# A C++ log line's prefix (glog's form: "E1127 19:02:48.165320   14318 agent.cc:289] "): at
# a line's start, or after text of the tool's that had no newline yet ("12:00:01
# progressE1127 ..."); and what may be the start of one, in a line not ended yet.
_CPP_LOG = re.compile(rb"[WEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\]\s]+\] ")
_CPP_LOG_START = re.compile(rb"^[WEF]\d{0,4}$|^[WEF]\d{4} ")
# The first line of a message of the tool's own (its `error:` line, a traceback, a log line
# of core/cli.py's form "12:00:01 ..."); any other line goes with the message before it: a
# C++ log message runs on over several lines (gRPC's details, a list of tasks).
_TOOLS_OWN = re.compile(rb"^(error: |Traceback \(most recent call last\):|\d\d:\d\d:\d\d )")
HOLD_SECONDS = 0.5
MAX_HOLD_SECONDS = 2.0
LINE_SECONDS = 0.1
_RESUME = "restart every process with the same command to resume"


def abort_line(fatal: bytes, num_processes: int, heartbeat_seconds: float | None = None) -> bytes:
    """The one line that replaces the abort whose message (its FATAL line and the lines after
    it, up to its stack trace) is `fatal`; `heartbeat_seconds`: the cluster's heartbeat
    timeout (JAX's `heartbeat_timeout_seconds`, --peer_timeout)."""
    if SERVICE_GONE in fatal:
        text = (
            f"process 0 of {num_processes}, which runs JAX's coordination service, has ended or "
            f"is gone (killed, its host lost, or an error of its own: see its output): {_RESUME}"
        )
    elif HEARTBEATS_STOPPED in fatal:
        listed = _DEAD_TASKS.search(fatal)
        listed = listed.group(1) if listed else b""
        # Task names (/job:jax_worker/replica:0/task:1) or, as jaxlib 0.10 prints them, bare ids.
        found = re.findall(rb"task:(\d+)", listed) or re.findall(rb"^\s*(\d+)\s*$", listed, re.M)
        ids = sorted({int(i) for i in found})
        who = (
            f"process{'es' if len(ids) > 1 else ''} {', '.join(map(str, ids))} of {num_processes}"
            if ids
            else "a process of this cluster"
        )
        seconds = f" for {heartbeat_seconds:g} s" if heartbeat_seconds else ""
        text = (
            f"{who} stopped sending heartbeats to JAX's coordination service{seconds} (killed, or its "
            f"host is gone): {_RESUME}"
        )
    else:
        status = _STATUS.search(fatal)
        detail = status.group(1).decode(errors="replace").strip()[:200] if status else ""
        text = (
            f"JAX's coordination service ended this cluster{f' ({detail})' if detail else ''}: "
            f"see every process's output, then {_RESUME}"
        )
    return f"error: {text}\n".encode()


class AbortFilter:
    """Bytes in, bytes out: everything unchanged until the abort, which becomes one line,
    and nothing after it. A C++ warning or error line, and whatever follows it, is held
    HOLD_SECONDS first; text without its newline yet, LINE_SECONDS (so that a line printed
    in two writes stays one line beside what the process writes to stdout meanwhile).
    `feed(data, now)` returns what can be written now, `due(now)` what has been held long
    enough, `close()` the rest; `deadline` is when `due` next has something (None: never)."""

    def __init__(self, num_processes: int, heartbeat_seconds: float | None = None):
        self.num_processes, self.heartbeat_seconds = num_processes, heartbeat_seconds
        self._fatal: list[bytes] | None = None  # the abort's message, while it comes
        self._held: list[tuple[bytes, bool]] = []  # (line, from C++), held until _held_until
        self._held_since = self._held_until = None
        self._in_cpp = False  # the last line was part of a C++ log message
        self._partial = b""  # the last line, not yet ended by a newline, since `_partial_since`
        self._partial_since = 0.0
        self._said_error = False  # the tool has written its own `error:` line
        self._aborted = False

    @property
    def deadline(self) -> float | None:
        if self._fatal is not None:
            return None  # the abort's message: its stack trace or the pipe's end will come
        if self._held_until is not None:
            return self._held_until
        if self._partial and not _CPP_LOG_START.match(self._partial):
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
        for line in _unglued(lines):
            if self._fatal is not None:  # the abort's message goes on to its stack trace
                if line.startswith(_STACK_TRACE):
                    return b"".join(out) + self._abort()
                self._fatal.append(line)
                continue
            cpp = bool(_CPP_LOG.match(line))
            if cpp and line.startswith(b"F") and FATAL in line:
                out.append(self._keep_the_tools_own())
                self._fatal = [line]
                continue
            self._in_cpp = cpp or (self._in_cpp and not _TOOLS_OWN.match(line))
            if cpp:
                self._held_since = now if self._held_since is None else self._held_since
                self._held_until = min(now + HOLD_SECONDS, self._held_since + MAX_HOLD_SECONDS)
            if self._held_until is None:
                out.append(self._written(line + b"\n"))
            else:
                self._held.append((line + b"\n", self._in_cpp))
        return b"".join(out) + self.due(now)

    def due(self, now: float) -> bytes:
        out = b""
        if self._held_until is not None and now >= self._held_until:
            out = b"".join(self._written(line) for line, _ in self._held)
            self._held, self._held_since, self._held_until = [], None, None
        deadline = self.deadline
        if self._held_until is None and deadline is not None and now >= deadline:
            out, self._partial = out + self._written(self._partial), b""
        return out

    def close(self) -> bytes:
        if self._aborted:
            return b""
        if self._fatal is not None:  # the process ended before the abort's stack trace
            self._fatal.append(self._partial)
            return self._abort()
        rest = b"".join(line for line, _ in self._held) + self._partial
        self._held, self._held_until, self._partial = [], None, b""
        return rest

    def _written(self, text: bytes) -> bytes:
        self._said_error = self._said_error or text.startswith(b"error: ")
        return text

    def _keep_the_tools_own(self) -> bytes:
        """At the abort's fatal line: the tool's own held lines, without the C++ ones."""
        kept = b"".join(self._written(line) for line, cpp in self._held if not cpp)
        self._held, self._held_until = [], None
        return kept

    def _abort(self) -> bytes:
        # Everything after the abort's message (its stack trace, `_partial`) is the abort's own.
        fatal = b"\n".join(self._fatal)
        self._aborted, self._fatal, self._partial = True, None, b""
        return b"" if self._said_error else abort_line(fatal, self.num_processes, self.heartbeat_seconds)


def _unglued(lines: list[bytes]) -> list[bytes]:
    """`lines`, with a C++ log line that follows other text on its line made a line of its own."""
    out = []
    for line in lines:
        inside = _CPP_LOG.search(line, 1)
        while inside:
            out.append(line[: inside.start()])
            line = line[inside.start() :]
            inside = _CPP_LOG.search(line, 1)
        out.append(line)
    return out


def _guard(num_processes: int, heartbeat_seconds: float, ready_fd: int) -> None:
    """The guard process: stdin (this tool's stderr) to stdout (the real stderr); says it is
    ready (its signals ignored) on `ready_fd`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.write(ready_fd, b"1")
    os.close(ready_fd)
    text = AbortFilter(num_processes, heartbeat_seconds)

    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(1, view) :]

    while True:
        wait = None if text.deadline is None else max(0.0, text.deadline - time.monotonic())
        if not select.select([0], [], [], wait)[0]:
            write(text.due(time.monotonic()))  # a deadline passed (`feed` also writes what is due)
            continue
        data = os.read(0, 1 << 16)
        if not data:
            break
        write(text.feed(data, time.monotonic()))
    write(text.close())


_lock = threading.Lock()  # install, restore and silence, from whichever thread ends the process
_installed: tuple[subprocess.Popen, int] | None = None
GUARD_START_SECONDS = 30.0


def install(num_processes: int, heartbeat_seconds: float) -> None:
    """Sends this process's stderr (fd 2: Python's and C++'s) through the guard; once. Leaves
    stderr as it is when there is none or the guard cannot start."""
    global _installed
    with _lock:
        if _installed is not None or sys.stderr is None:
            return
        try:
            sys.stderr.flush()
            real = os.dup(2)
        except (OSError, ValueError):
            return
        ready_read, ready_write = os.pipe()
        try:
            guard = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    os.path.abspath(__file__),
                    str(num_processes),
                    str(heartbeat_seconds),
                    str(ready_write),
                ],
                stdin=subprocess.PIPE,
                stdout=real,
                stderr=real,
                pass_fds=(ready_write,),
                start_new_session=True,  # not in the terminal's process group: no Ctrl-C for it
            )
        except OSError:
            os.close(real)
            os.close(ready_read)
            return
        finally:
            os.close(ready_write)
        try:
            started = select.select([ready_read], [], [], GUARD_START_SECONDS)[0]
            ready = os.read(ready_read, 1) if started else b""
        finally:
            os.close(ready_read)
        if ready != b"1":
            guard.kill()
            guard.stdin.close()
            guard.wait()
            os.close(real)
            return
        os.dup2(guard.stdin.fileno(), 2)
        guard.stdin.close()  # fd 2 is now the pipe's only write end here
        _installed = (guard, real)
    atexit.register(restore)


def restore(timeout: float = 2.0) -> None:
    """Gives fd 2 back to the real stderr and waits (at most `timeout` s) for the guard to
    write what it holds."""
    _end(None, timeout)


def silence(timeout: float = 2.0) -> None:
    """Like `restore`, but fd 2 goes to /dev/null: for a process about to `os._exit` after
    its own line, so that nothing written after it (an abort racing with the exit) shows."""
    _end(os.devnull, timeout)


def _end(target: str | None, timeout: float) -> None:
    global _installed
    with _lock:
        if _installed is None:
            return
        guard, real = _installed
        _installed = None
        sys.stderr.flush()
        if target is None:
            os.dup2(real, 2)
        else:
            null = os.open(target, os.O_WRONLY)
            os.dup2(null, 2)
            os.close(null)
        os.close(real)
        try:
            guard.wait(timeout)
        except subprocess.TimeoutExpired:  # a child of this process still holds the pipe
            pass


if __name__ == "__main__":
    _guard(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))
