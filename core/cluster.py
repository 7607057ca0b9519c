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
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import jax

from core.errors import UserError

ADDRESS_ENV, COUNT_ENV, ID_ENV = "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"
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


def initialize_distributed(mode: str = "auto", cluster: Cluster | None = None) -> bool:
    """Joins the other processes (`jax.distributed.initialize`) when there are any.

    mode "auto" initialises when the settings or the environment describe several
    processes: a Cloud TPU pod slice (TPU_WORKER_HOSTNAMES lists more than one worker) or
    an explicit cluster (`cluster`, default from the environment); "on" always (JAX then
    also detects SLURM, Open MPI, Kubernetes), "off" never. Must run before any other JAX
    call. Returns whether it initialised.
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
    jax.distributed.initialize(
        coordinator_address=cluster.coordinator_address,
        num_processes=cluster.num_processes,
        process_id=cluster.process_id,
    )
    return True
