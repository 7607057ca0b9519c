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


def test_another_status_from_the_service_is_named():
    fatal = ABORT.replace(
        b"UNAVAILABLE: Failed to send RPC to coordination service. Either the leader task was "
        b"preempted/died/restarted unexpectedly or this task is experiencing network issues.",
        b"UNAVAILABLE: Task /job:jax_worker/replica:0/task:2 heartbeat timeout.",
    ).replace(b"Socket closed", b"heartbeat")
    assert _filtered([fatal], num_processes=4) == (
        b"error: JAX's coordination service ended this cluster (UNAVAILABLE: Task "
        b"/job:jax_worker/replica:0/task:2 heartbeat timeout.): see every process's output, then "
        b"restart every process with the same command to resume\n"
    )


def test_a_process_keeps_its_stderr_through_the_guard_and_back(tmp_path):
    """install() in a real process: Python's and C's writes to fd 2 come out in order, the
    guard outlives a Ctrl-C or a SIGTERM sent to it, the abort becomes the line, and
    restore() (at exit) leaves nothing behind in the guard."""
    program = (
        "import os, signal, sys, time\n"
        "from core import abort_line\n"
        "abort_line.install(2)\n"
        "print('from python', file=sys.stderr, flush=True)\n"
        "for signum in (signal.SIGINT, signal.SIGTERM):\n"
        "    os.kill(abort_line._installed[0].pid, signum)\n"
        "time.sleep(0.5)\n"
        "os.write(2, b'from fd 2\\n')\n"
        f"os.write(2, {ABORT!r})\n"
        "print('to stdout', flush=True)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run(
        [sys.executable, "-c", program], cwd=root, capture_output=True, timeout=60, check=True
    )
    assert result.stderr == b"from python\nfrom fd 2\n" + GONE and result.stdout == b"to stdout\n"
