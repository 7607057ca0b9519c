"""Checkpoints: orbax for the train state, tf.train.Checkpoint for each host's data iterator.

Layout of a workdir:

    checkpoints/<step>/...            orbax (atomic: written to a temporary name, then renamed)
    data_iterators/<step>/process_<i>.*   tf.data iterator state of host i at that step

The iterator state is written *before* the orbax step is finalised, so every finalised
step has its iterator files; iterator folders of steps orbax no longer keeps are deleted.
Restoring both gives an exact resume: same step, parameters, optimizer state, schedule
position, and the next batch is the one the interrupted run would have seen.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp
import tensorflow as tf


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be restored (one line, user-facing)."""


class Checkpointer:
    """Saves and restores (train state, data iterator) pairs in `workdir`."""

    def __init__(self, workdir: str, *, max_to_keep: int = 3):
        self.workdir = workdir
        self._iterators_dir = os.path.join(workdir, "data_iterators")
        self.manager = ocp.CheckpointManager(
            os.path.join(os.path.abspath(workdir) if "://" not in workdir else workdir, "checkpoints"),
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def _iterator_prefix(self, step: int) -> str:
        return os.path.join(self._iterators_dir, str(step), f"process_{jax.process_index()}")

    def save(self, step: int, state: Any, iterator: tf.data.Iterator) -> None:
        tf.train.Checkpoint(iterator=iterator).write(self._iterator_prefix(step))
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
        self._delete_stale_iterators()

    def restore(self, step: int, abstract_state: Any, iterator: tf.data.Iterator) -> Any:
        """Restores step `step` into the shardings of `abstract_state`, and the iterator in place."""
        prefix = self._iterator_prefix(step)
        if not tf.io.gfile.glob(prefix + ".index"):
            raise CheckpointError(
                f"checkpoint step {step} in {self.workdir} has no data iterator state "
                f"({prefix}.index): delete checkpoints/{step} to resume from the one before"
            )
        restored = self.manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))
        )
        tf.train.Checkpoint(iterator=iterator).read(prefix).assert_consumed()
        return restored["state"]

    def _delete_stale_iterators(self) -> None:
        if jax.process_index() != 0 or not tf.io.gfile.isdir(self._iterators_dir):
            return
        keep = {str(s) for s in self.manager.all_steps()}
        # A step being saved asynchronously is not listed yet: keep anything newer than the latest.
        latest = self.manager.latest_step() or -1
        for name in tf.io.gfile.listdir(self._iterators_dir):
            name = name.rstrip("/")
            if name not in keep and name.isdigit() and int(name) < latest:
                tf.io.gfile.rmtree(os.path.join(self._iterators_dir, name))

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
