"""Joining the other processes of a multi-host run: `jax.distributed.initialize` with the
cluster's coordinator address, process count and process id.

Where those come from, in order:
1. the flags `--coordinator_address`, `--num_processes`, `--process_id` (core/cli.py
   `add_mesh_flags`), else the environment variables `JAX_COORDINATOR_ADDRESS` (JAX's own
   name), `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID`: GPU clusters without a scheduler JAX
   knows, and the local pod (core/local_pod.py);
2. what JAX detects itself: a Cloud TPU pod slice, SLURM, Open MPI, Kubernetes.

A half-given cluster (an address without a count or an id, or a count without an address,
outside a scheduler JAX detects) is a one-line ClusterError before JAX is called: JAX
would fail with a traceback ("Number of processes must be defined") or wait for peers
that never come. On CPU, the processes' collectives go through gloo
(`jax_cpu_collectives_implementation`, JAX's default).

Once joined, a cluster's failures stay one line too (docs/pods.md, "When a host dies"):
`check_same_everywhere` stops every process started with other settings than process 0;
JAX's own heartbeat (`heartbeat_timeout_seconds`, our --peer_timeout) ends the others when
one process is gone, and core/abort_line.py makes that abort, and the one when process 0 is
gone, one line naming the process; `peer_lost` recognises the error a collective raises
when a peer's connection closes; `leave` exits without JAX's shutdown barrier after an
error.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import sys
import time
from collections.abc import Mapping

import jax
import numpy as np

from core import abort_line
from core.errors import UserError, one_line

ADDRESS_ENV, COUNT_ENV, ID_ENV = "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"
# jax.distributed.initialize's default heartbeat_timeout_seconds (--peer_timeout=0).
JAX_HEARTBEAT_SECONDS = 100
# Environments in which jax.distributed.initialize() finds the count and id itself.
_DETECTED_BY_JAX = {
    "SLURM_JOB_ID": "SLURM",
    "OMPI_MCA_orte_hnp_uri": "Open MPI",
    "OMPI_COMM_WORLD_SIZE": "Open MPI",
    "KUBERNETES_SERVICE_HOST": "Kubernetes",
}


class ClusterError(UserError):
    """Cluster settings that cannot form a cluster (one line, user-facing)."""


@dataclasses.dataclass(frozen=True)
class Cluster:
    """What this process was told about its cluster (None: not given)."""

    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None

    @classmethod
    def from_settings(
        cls,
        coordinator_address: str | None = None,
        num_processes: int | None = None,
        process_id: int | None = None,
        env: Mapping[str, str] = os.environ,
    ) -> Cluster:
        """The flags' values, else the environment's."""

        def number(value: int | None, name: str, flag: str) -> int | None:
            if value is not None:
                return value
            text = env.get(name, "").strip()
            if not text:
                return None
            if not text.isdigit():
                raise ClusterError(f"{name}={text!r} (or {flag}) must be a whole number")
            return int(text)

        return cls(
            coordinator_address or env.get(ADDRESS_ENV, "").strip() or None,
            number(num_processes, COUNT_ENV, "--num_processes"),
            number(process_id, ID_ENV, "--process_id"),
        )

    @property
    def given(self) -> bool:
        return any(v is not None for v in dataclasses.astuple(self))

    def check(self, env: Mapping[str, str] = os.environ) -> None:
        """Raises ClusterError for settings that cannot form a cluster."""
        if not self.given:
            return
        scheduler = next((name for var, name in _DETECTED_BY_JAX.items() if env.get(var)), None)
        if self.coordinator_address is None and scheduler is None:
            raise ClusterError(
                f"--num_processes / --process_id ({COUNT_ENV} / {ID_ENV}) need the coordinator's "
                f"address too: set --coordinator_address=HOST:PORT (or {ADDRESS_ENV}) on every process"
            )
        missing = [
            flag
            for flag, value in (("--num_processes", self.num_processes), ("--process_id", self.process_id))
            if value is None
        ]
        if missing and scheduler is None:
            raise ClusterError(
                f"the coordinator address {self.coordinator_address} is set but not {' and '.join(missing)}: "
                f"give every process the cluster's size and its own id ({COUNT_ENV}, {ID_ENV}), "
                "or start it under SLURM, Open MPI or Kubernetes"
            )
        if self.num_processes is not None and self.num_processes < 1:
            raise ClusterError(f"--num_processes={self.num_processes}: a cluster has at least 1 process")
        if (
            None not in (self.num_processes, self.process_id)
            and not 0 <= self.process_id < self.num_processes
        ):
            raise ClusterError(
                f"--process_id={self.process_id} is not in 0..{self.num_processes - 1} "
                f"(--num_processes={self.num_processes})"
            )


def initialize_distributed(
    mode: str = "auto", cluster: Cluster | None = None, peer_timeout: float = 60.0
) -> bool:
    """Joins the other processes (`jax.distributed.initialize`) when there are any.

    mode "auto" initialises when the settings or the environment describe several
    processes: a Cloud TPU pod slice (TPU_WORKER_HOSTNAMES lists more than one worker) or
    an explicit cluster (`cluster`, default from the environment); "on" always (JAX then
    also detects SLURM, Open MPI, Kubernetes), "off" never. Must run before any other JAX
    call. `peer_timeout` is JAX's heartbeat timeout: a process silent that long (killed, its
    host gone) is declared dead and the others end (0: JAX's default, 100 s). Returns
    whether it initialised.
    """
    if mode not in ("auto", "on", "off"):
        raise ClusterError(f"--distributed must be auto, on or off, got {mode!r}")
    cluster = Cluster.from_settings() if cluster is None else cluster
    if mode == "off":
        return False
    cluster.check()
    workers = [w for w in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if w.strip()]
    if not (mode == "on" or len(workers) > 1 or cluster.given):
        return False
    heartbeat = math.ceil(peer_timeout) if peer_timeout > 0 else JAX_HEARTBEAT_SECONDS
    jax.distributed.initialize(
        coordinator_address=cluster.coordinator_address,
        num_processes=cluster.num_processes,
        process_id=cluster.process_id,
        heartbeat_timeout_seconds=heartbeat,
    )
    if in_cluster():
        abort_line.install(jax.process_count(), heartbeat)
    return True


class PeerLostError(UserError):
    """Another process of the cluster stopped (killed, preempted, crashed) while this one
    needed it."""


# What the runtimes say when a peer is gone: gloo (CPU collectives) when a peer's socket
# closes, JAX's coordination service when a peer stops sending heartbeats, NCCL when a
# remote process exits.
_PEER_LOST_SIGNS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "heartbeat timeout",
    "stopped sending heartbeats",
    "remote process exited",
)


def in_cluster() -> bool:
    """Whether this process joined other processes (`jax.distributed.initialize`); does not
    start a JAX backend."""
    return jax.distributed.is_initialized() and jax.process_count() > 1


def peer_lost(error: BaseException) -> bool:
    """Whether `error` (raised by a collective, a checkpoint save ...) means that another
    process of the cluster has gone."""
    text = str(error)
    return in_cluster() and any(sign in text for sign in _PEER_LOST_SIGNS)


def lost_peer_error(during: str, error: BaseException, then: str = "") -> PeerLostError:
    """The one-line error for a peer lost `during` something; `then` says what is kept."""
    return PeerLostError(
        f"another process of this cluster stopped during {during} ({one_line(error)}); "
        f"{then + ': ' if then else ''}restart every process with the same command to resume"
    )


# How long process 0 stays after an error before it leaves (see `leave`).
COORDINATOR_LINGER_SECONDS = 3.0


def leave(status: int) -> None:
    """Ends this process of a cluster after its output, without JAX's shutdown barrier: that
    would wait for peers that are gone or stuck in a collective with this process (up to
    its 300 s timeout), then abort with a C++ stack. Process 0 runs the coordination service,
    whose end makes JAX abort every other process at once (a line saying process 0 is gone,
    core/abort_line.py): it lingers a few seconds, so that peers ending on the same error
    print their own line and leave first. stderr goes to /dev/null before (abort_line's
    `silence`): an abort racing with this exit adds nothing after the process's own line."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    logging.shutdown()
    abort_line.silence()
    if jax.process_index() == 0:
        time.sleep(COORDINATOR_LINGER_SECONDS)
    os._exit(status)


def check_same_everywhere(text: str) -> None:
    """Raises ClusterError on every process unless every process passed the same `text`
    (its flags and whole gin config): processes started with other settings than their
    peers would train a model none of them asked for, or wait forever in mismatched
    collectives."""
    if not in_cluster():
        return
    from jax.experimental import multihost_utils

    digest = np.frombuffer(hashlib.sha256(text.encode()).digest(), np.uint8)
    digests = np.asarray(multihost_utils.process_allgather(digest))
    others = [i for i in range(len(digests)) if not np.array_equal(digests[i], digests[0])]
    if others:
        raise ClusterError(
            f"process{'es' if len(others) > 1 else ''} {', '.join(map(str, others))} of {len(digests)} "
            f"{'were' if len(others) > 1 else 'was'} started with other flags or gin config (files, "
            "bindings, data directory, workdir) than process 0: start every process with the same "
            "command and files"
        )
