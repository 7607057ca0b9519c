"""core/abort_line.py: JAX's C++ abort when process 0 is gone becomes one line, and every
other byte of stderr passes unchanged. The abort below is what jaxlib 0.10.2 printed on this
machine in process 1 of 2 when process 0 was killed (frames shortened); the real kill is in
tests/test_local_pod.py."""

import os
import subprocess
import sys

from core import abort_line

PREEMPTION_WARNINGS = (
    b"W1127 19:04:14.041681   14588 preemption_sync_manager.cc:147] Failed to retrieve preemption "
    b"notice from coordination service: UNAVAILABLE: Socket closed\n"
    b"Additional GRPC error information from remote target coordination_service while calling "
    b"/xla.coordination.CoordinationService/GetKeyValue:\n"
    b':UNKNOWN:Error received from peer  {grpc_message:"Socket closed", grpc_status:14}. This is only '
    b"expected if one of the tasks is unhealthy. Check the logs for the actual root cause.\n"
)
ABORT = (
    b"E1127 19:02:48.165320   14318 coordination_service_agent.cc:289] Polled an error from coordination "
    b"service (this can be an error from this or another task).\n"
    b"F1127 19:02:48.165395   14318 client.h:80] Terminating process because the JAX distributed service "
    b"detected fatal errors. This most likely indicates that another task died; see the other task logs "
    b"for more details. Disable Python buffering, i.e. `python -u`, to be sure to see all the previous "
    b"output. absl::Status: UNAVAILABLE: Failed to send RPC to coordination service. Either the leader "
    b"task was preempted/died/restarted unexpectedly or this task is experiencing network issues.\n"
    b"Additional GRPC error information from remote target coordination_service while calling "
    b"/xla.coordination.CoordinationService/PollForError:\n"
    b':UNKNOWN:Error received from peer  {grpc_message:"Socket closed", grpc_status:14}\n'
    b"*** Check failure stack trace: ***\n"
    b"    @     0x7f95e2240634  absl::lts_20260107::log_internal::LogMessage::SendToLog()\n"
    b"    @     0x7f95de3040ee  xla::CoordinationServiceAgent::SetError()\n"
)
GONE = (
    b"error: process 0 of 2, which runs JAX's coordination service, has ended or is gone (killed, its "
    b"host lost, or an error of its own: see its output): restart every process with the same command "
    b"to resume\n"
)


def _filtered(chunks, num_processes=2, step=0.1):
    """What the filter writes for `chunks` fed `step` seconds apart, then closed."""
    text, out = abort_line.AbortFilter(num_processes), []
    for i, chunk in enumerate(chunks):
        out.append(text.due(i * step))
        out.append(text.feed(chunk, i * step))
    out.append(text.close())
    return b"".join(out)


def test_the_abort_and_the_warnings_just_before_it_become_one_line():
    before = b"12:00:01 step 6/10: loss 5.1\n"
    assert _filtered([before, PREEMPTION_WARNINGS, ABORT]) == before + GONE
    # Cut anywhere, byte by byte included, the stream gives the same.
    stream = before + PREEMPTION_WARNINGS + ABORT + b"written after the abort\n"
    for cut in (1, 7, 100, 1000):
        chunks = [stream[i : i + cut] for i in range(0, len(stream), cut)]
        assert _filtered(chunks, step=0.0) == before + GONE, cut


def test_a_longer_burst_before_the_abort_goes_too_and_the_tools_own_lines_stay():
    """Each C++ line holds what follows a little longer; on the abort, only the C++ lines
    (and gRPC's continuations of them) go: the tool's own lines stay, and a tool that has
    printed its own `error:` line gets no second one."""
    warning, polled = PREEMPTION_WARNINGS, ABORT[: ABORT.index(b"F1127")]
    fatal = ABORT[len(polled) :]
    text = abort_line.AbortFilter(2)
    assert text.feed(warning, 0.0) == b"" and text.feed(polled, 0.45) == b""
    assert text.due(0.6) == b"" and text.feed(fatal, 0.7) == GONE
    traceback = b'Traceback (most recent call last):\n  File "x.py", line 1\nZeroDivisionError: a bug\n'
    assert _filtered([warning, traceback, ABORT], step=0.1) == traceback + GONE
    mine = b"error: another process of this cluster stopped during a collective (...)\n"
    assert _filtered([warning, mine, ABORT], step=0.1) == mine
    assert _filtered([mine, b"12:00:01 more\n", ABORT], step=1.0) == mine + b"12:00:01 more\n"


def test_the_hold_ends_after_two_seconds_and_a_fatal_line_glued_to_the_tools_text_is_found():
    warning = b"W1127 19:04:14.041681   14588 some.cc:1] a warning\n"
    text = abort_line.AbortFilter(2)
    out = b"".join(text.feed(warning, t) + text.due(t) for t in (0.0, 0.4, 0.8, 1.2, 1.6))
    assert out == b"" and text.deadline == abort_line.MAX_HOLD_SECONDS
    assert text.due(abort_line.MAX_HOLD_SECONDS) == warning * 5
    # A line of the tool's without its newline yet, then the abort in the same moment.
    assert _filtered([b"12:00:01 progress", ABORT], step=0.05) == b"12:00:01 progress\n" + GONE


def test_everything_else_passes_unchanged_and_a_warning_only_waits():
    warning = b"W1127 19:04:14.041681   14588 some.cc:1] a warning of no consequence\n"
    text = abort_line.AbortFilter(2)
    assert text.feed(b"a line\nprogress", 0.0) == b"a line\n"  # the rest of a line may follow
    assert text.feed(b" 10%", 0.05) == b"" and text.deadline == abort_line.LINE_SECONDS
    assert text.due(0.1) == b"progress 10%" and text.deadline is None  # it did not: shown
    assert text.feed(b"\n" + warning + b"printed after it\n", 1.0) == b"\n"  # held with what follows
    assert text.deadline == 1.0 + abort_line.HOLD_SECONDS and text.due(1.2) == b""
    assert text.due(1.6) == warning + b"printed after it\n" and text.deadline is None
    assert text.feed(b"E1127 19:04", 2.0) == b"" and text.deadline is None  # maybe the abort's start
    assert text.close() == b"E1127 19:04"
    assert _filtered([ABORT[: ABORT.index(b"F1127")], b"then the process went on\n"], step=1.0) == (
        ABORT[: ABORT.index(b"F1127")] + b"then the process went on\n"
    )
    # The abort's words in a line that is not a C++ fatal line (a log quoting them) pass.
    quoted = b"12:00:01 JAX said: " + abort_line.FATAL + b"\n"
    assert _filtered([quoted, b"and went on\n"]) == quoted + b"and went on\n"


# Process 0's output (the service's own process) when process 1 was killed: the service's
# heartbeat timeout (--peer_timeout), here JAX's default 100 s, later.
HEARTBEAT_ABORT = (
    b"E1127 19:53:09.538135   32441 coordination_service.cc:1549] [10136551220078150339] Use error "
    b"polling to propagate the following error to all tasks: UNAVAILABLE: The following tasks are "
    b"unhealthy (stopped sending heartbeats):\n1\nThe tasks have crashed. Check the task logs for an "
    b"earlier error, or scheduler events (e.g. preemption, eviction) to debug further. "
    b"[type.googleapis.com/tensorflow.CoordinationServiceError='']\n"
    b"E1127 19:53:09.539363   32452 coordination_service_agent.cc:289] Polled an error from coordination "
    b"service (this can be an error from this or another task).\n"
    b"F1127 19:53:09.539606   32452 client.h:80] Terminating process because the JAX distributed service "
    b"detected fatal errors. This most likely indicates that another task died; see the other task logs "
    b"for more details. Disable Python buffering, i.e. `python -u`, to be sure to see all the previous "
    b"output. absl::Status: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):\n"
    b"1\nThe tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. "
    b"preemption, eviction) to debug further.\n\nRPC: /xla.coordination.CoordinationService/PollForError "
    b"[type.googleapis.com/tensorflow.CoordinationServiceError='']\n*** Check failure stack trace: ***\n"
    b"    @     0x7f15e1840634  absl::lts_20260107::log_internal::LogMessage::SendToLog()\n"
)


def test_the_heartbeat_timeout_names_the_dead_processes_and_another_status_is_named():
    """The dead processes' ids come on the lines after the abort's fatal line, whole or cut
    anywhere; the guard is told the cluster's heartbeat timeout."""
    before = b"12:00:01 step 6/10: loss 5.1\n"
    named = (
        b"error: process 1 of 2 stopped sending heartbeats to JAX's coordination service for 100 s "
        b"(killed, or its host is gone): restart every process with the same command to resume\n"
    )
    stream = before + HEARTBEAT_ABORT
    for cut in (len(stream), 1, 13, 500):
        chunks = [stream[i : i + cut] for i in range(0, len(stream), cut)]
        text, out = abort_line.AbortFilter(2, 100), []
        for chunk in chunks:
            out.append(text.feed(chunk, 0.0))
        assert b"".join(out) + text.close() == before + named, cut
    named = HEARTBEAT_ABORT.replace(
        b"heartbeats):\n1\nThe", b"heartbeats):\n/job:jax_worker/replica:0/task:1\nThe"
    )
    text = abort_line.AbortFilter(2, 100)
    assert text.feed(named, 0.0) + text.close() == (
        b"error: process 1 of 2 stopped sending heartbeats to JAX's coordination service for 100 s "
        b"(killed, or its host is gone): restart every process with the same command to resume\n"
    )
    several = HEARTBEAT_ABORT.replace(b"heartbeats):\n1\nThe", b"heartbeats):\n1\n3\nThe")
    text = abort_line.AbortFilter(4, 20)
    assert text.feed(several, 0.0) + text.close() == (
        b"error: processes 1, 3 of 4 stopped sending heartbeats to JAX's coordination service for 20 s "
        b"(killed, or its host is gone): restart every process with the same command to resume\n"
    )
    fatal = ABORT.replace(
        b"UNAVAILABLE: Failed to send RPC to coordination service. Either the leader task was "
        b"preempted/died/restarted unexpectedly or this task is experiencing network issues.",
        b"INTERNAL: something else.",
    )
    assert _filtered([fatal], num_processes=4) == (
        b"error: JAX's coordination service ended this cluster (INTERNAL: something else.): see every "
        b"process's output, then restart every process with the same command to resume\n"
    )


def test_a_status_without_detail_is_named_plainly():
    fatal = b"F1127 19:02:48.165395   14318 client.h:80] " + abort_line.FATAL + b".\n"
    assert _filtered([fatal]) == (
        b"error: JAX's coordination service ended this cluster: see every process's output, then "
        b"restart every process with the same command to resume\n"
    )


def _in_a_process(program: str) -> subprocess.CompletedProcess:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, "-c", program], cwd=root, capture_output=True, timeout=60)


def test_without_a_guard_or_without_stderr_the_process_goes_on_as_it_was():
    """A guard that cannot start (here: its script is missing) leaves stderr as it was;
    a process without stderr installs nothing."""
    result = _in_a_process(
        "import os, sys\n"
        "from core import abort_line\n"
        "abort_line.__file__ = '/nonexistent/abort_line.py'\n"
        "abort_line.install(2, 60)\n"
        "assert abort_line._installed is None\n"
        "print('still here', file=sys.stderr)\n"
    )
    assert result.returncode == 0 and result.stderr.endswith(b"still here\n"), result.stderr
    result = _in_a_process(
        "import os, sys\n"
        "sys.stderr = None\n"
        "from core import abort_line\n"
        "abort_line.install(2, 60)\n"
        "print(abort_line._installed)\n"
    )
    assert result.returncode == 0 and result.stdout == b"None\n", result.stderr


def test_a_process_keeps_its_stderr_through_the_guard_and_back(tmp_path):
    """install() in a real process: Python's and C's writes to fd 2 come out in order, the
    guard outlives a Ctrl-C or a SIGTERM sent to it, the abort becomes the line, and
    restore() (at exit) leaves nothing behind in the guard."""
    program = (
        "import os, signal, sys, time\n"
        "from core import abort_line\n"
        "abort_line.install(2, 60)\n"
        "print('from python', file=sys.stderr, flush=True)\n"
        "for signum in (signal.SIGINT, signal.SIGTERM):\n"
        "    os.kill(abort_line._installed[0].pid, signum)\n"
        "time.sleep(0.5)\n"
        "os.write(2, b'from fd 2\\n')\n"
        f"os.write(2, {ABORT!r})\n"
        "print('to stdout', flush=True)\n"
    )
    result = _in_a_process(program)
    assert (
        result.returncode == 0
        and result.stderr == b"from python\nfrom fd 2\n" + GONE
        and result.stdout == b"to stdout\n"
    )
