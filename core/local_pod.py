r"""A pod on one machine: N processes of any of our tools as one JAX cluster.

    python -m core.local_pod --processes=2 --devices_per_process=4 [--log_dir=DIR] \
        [--timeout=600] -- pretrain.train --gin_file=configs/runs/demo.gin --workdir=W

Each process runs `python -m TOOL ARGS...` with its own fake CPU devices
(`--xla_force_host_platform_device_count`) and the settings a GPU cluster gives its
processes (core/cluster.py): JAX_COORDINATOR_ADDRESS=127.0.0.1:PORT (a free port),
JAX_NUM_PROCESSES and JAX_PROCESS_ID. The tool's own `--distributed=auto` reads them and
calls `jax.distributed.initialize`, so the path run here is the one users take on a cluster.
Collectives between the processes go through gloo.

Every process's output goes to DIR/process_<i>.log (kept); process 0's is also shown. The
pod exits with status 0 when every process did; otherwise with status 2 and one line
saying how each failed process ended and the last `error:` line it printed. When one
process has ended with an error and the others have not ended `--grace` seconds later, or
none has ended after `--timeout` seconds, the ones still running are killed and named: a
hang is a failure that names the process that hung, never a wait.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from core import cli
from core.cluster import ADDRESS_ENV, COUNT_ENV, ID_ENV
from core.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class PodError(UserError):
    """A local pod that could not start or whose processes failed or hung."""


@dataclasses.dataclass
class ProcessResult:
    """One process of the pod: its exit status (None: killed because it hung) and log file."""

    process_id: int
    returncode: int | None
    log_path: str

    def output(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()


def free_port() -> int:
    """A TCP port no one listens on now (the coordinator binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(process_id: int, processes: int, devices: int, port: int, base: dict | None = None) -> dict:
    """The environment of one process of the pod."""
    env = dict(os.environ if base is None else base)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    env.update(
        {
            "XLA_FLAGS": " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"]),
            "JAX_PLATFORMS": "cpu",
            "PYTHONUNBUFFERED": "1",  # the logs are complete up to a kill
            ADDRESS_ENV: f"127.0.0.1:{port}",
            COUNT_ENV: str(processes),
            ID_ENV: str(process_id),
        }
    )
    return env


class Pod:
    """Processes started as one cluster, one command each (`python -m command...`); see the
    module docstring. Send a process a signal with `send_signal`, read its output so far
    with `output`, and end with `wait` (or leave a `with Pod(...)` block, which kills what
    still runs)."""

    def __init__(self, commands: Sequence[Sequence[str]], devices_per_process: int, log_dir: str, echo=None):
        os.makedirs(log_dir, exist_ok=True)
        port = free_port()
        self.log_paths = [os.path.join(log_dir, f"process_{i}.log") for i in range(len(commands))]
        self._running, self._readers = [], []
        for i, command in enumerate(commands):
            open(self.log_paths[i], "w").close()  # there (empty) from the start, for `output`
            popen = subprocess.Popen(
                [sys.executable, "-m", *command],
                cwd=ROOT,
                env=process_env(i, len(commands), devices_per_process, port),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            )
            # Read through a pipe, not into the file directly: the pipe ends only when every
            # writer has closed it, the process's stderr guard (core/abort_line.py) included,
            # so `wait` returns with complete logs.
            reader = threading.Thread(
                target=_tee,
                args=(popen.stdout, self.log_paths[i], echo if i == 0 else None),
                daemon=True,
            )
            reader.start()
            self._running.append(popen)
            self._readers.append(reader)

    def __enter__(self) -> Pod:
        return self

    def __exit__(self, *exc) -> None:
        for popen in self._running:
            if popen.poll() is None:
                popen.kill()
        self._join()

    def send_signal(self, process_id: int, signum: int) -> None:
        self._running[process_id].send_signal(signum)

    def running(self, process_id: int) -> bool:
        return self._running[process_id].poll() is None

    def output(self, process_id: int) -> str:
        """What the process has printed so far."""
        with open(self.log_paths[process_id], errors="replace") as f:
            return f.read()

    def wait(self, timeout: float = 600.0, grace: float = 60.0) -> list[ProcessResult]:
        """Each process's result once every process has ended or been killed."""
        codes = _wait(self._running, timeout, grace)
        self._join()
        return [ProcessResult(i, code, path) for i, (code, path) in enumerate(zip(codes, self.log_paths))]

    def _join(self) -> None:
        for popen, reader in zip(self._running, self._readers):
            popen.wait()
            reader.join(READER_SECONDS)  # longer only if a child of the process holds its output


# How long `wait` waits for a process's output to end after the process has ended.
READER_SECONDS = 10.0


def run_pod(
    command: Sequence[str],
    processes: int,
    devices_per_process: int,
    log_dir: str,
    *,
    timeout: float = 600.0,
    grace: float = 60.0,
    echo=None,
) -> list[ProcessResult]:
    """Runs `python -m command...` as `processes` processes of one cluster; returns each
    process's result once every process has ended or been killed (see the module
    docstring). `echo(line)` receives process 0's output as it comes."""
    return Pod([command] * processes, devices_per_process, log_dir, echo).wait(timeout, grace)


def _tee(stream, path: str, echo) -> None:
    with stream, open(path, "a") as log:
        for line in stream:
            log.write(line)
            log.flush()
            if echo:
                echo(line.rstrip("\n"))


def _wait(running, timeout: float, grace: float) -> list[int | None]:
    """Exit statuses; None for a process killed because it outlived the others' failure by
    `grace` seconds, or the pod's `timeout`."""
    start, first_failure = time.monotonic(), None
    codes: list[int | None] = [None] * len(running)
    while any(c is None for c in codes):
        for i, popen in enumerate(running):
            if codes[i] is None and popen.poll() is not None:
                codes[i] = popen.returncode
                if popen.returncode != 0 and first_failure is None:
                    first_failure = time.monotonic()
        now = time.monotonic()
        if now - start > timeout or (first_failure is not None and now - first_failure > grace):
            break
        time.sleep(0.2)
    for i, popen in enumerate(running):
        if codes[i] is None:
            popen.kill()
    return codes


def build_parser():
    parser = cli.parser(__doc__, "core.local_pod")
    parser.add_argument("--processes", type=cli.positive_int, default=2, help="processes in the pod")
    parser.add_argument(
        "--devices_per_process", type=cli.positive_int, default=4, help="fake CPU devices of each process"
    )
    parser.add_argument(
        "--log_dir", default=None, help="where process_<i>.log go (default: a new temp folder)"
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds before a pod still running is killed"
    )
    parser.add_argument(
        "--grace", type=float, default=60.0, help="seconds the others get after one process fails"
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="-- TOOL ARGS...: the module each process runs"
    )
    return parser


def _run(args) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise PodError(
            "no command: write the tool and its flags after --, e.g. -- pretrain.train --workdir=W"
        )
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="local_pod_")
    results = run_pod(
        command,
        args.processes,
        args.devices_per_process,
        log_dir,
        timeout=args.timeout,
        grace=args.grace,
        echo=print,
    )
    failure = failure_line(results, args.grace, args.timeout, log_dir)
    if failure:
        raise PodError(failure)
    print(f"local pod: {args.processes} processes ended with status 0; logs in {log_dir}")
    return 0


def failure_line(results: Sequence[ProcessResult], grace: float, timeout: float, log_dir: str) -> str | None:
    """What went wrong in a pod, in one line (None: nothing): how each failed process ended,
    with the last `error:` line it printed, and which processes hung."""
    hung = [r for r in results if r.returncode is None]
    failed = [r for r in results if r.returncode not in (0, None)]
    if not (hung or failed):
        return None
    parts = []
    for r in failed:
        ended = (
            f"exited with status {r.returncode}" if r.returncode > 0 else f"ended by {_signal(-r.returncode)}"
        )
        said = [line for line in r.output().splitlines() if line.startswith("error: ")]
        parts.append(f"process {r.process_id} {ended}{f' ({said[-1]})' if said else ''}")
    if hung:
        waited = f"{grace:g} s after that" if failed else f"within {timeout:g} s"
        ids = ", ".join(str(r.process_id) for r in hung)
        parts.append(f"process {ids} did not end {waited} and {'was' if len(hung) == 1 else 'were'} killed")
    return f"{'; '.join(parts)}: see {(failed or hung)[0].log_path} (all logs in {log_dir})"


def _signal(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal has no name
        return f"signal {number}"


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
