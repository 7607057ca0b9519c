"""Where a run's numbers go: WORKDIR/metrics.jsonl (one JSON object per line) and TensorBoard.

Written by process 0 only. Each record is {"step", "split" ("train" / "eval"), metric: value};
TensorBoard gets the same values as scalars named "<split>/<metric>".
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import jax
import tensorflow as tf


class MetricsWriter:
    """metrics.jsonl + TensorBoard, on process 0 only."""

    def __init__(self, workdir: str):
        self.enabled = jax.process_index() == 0
        if self.enabled:
            self._jsonl = tf.io.gfile.GFile(os.path.join(workdir, "metrics.jsonl"), "a")
            self._tb = tf.summary.create_file_writer(os.path.join(workdir, "tensorboard"))

    def write(self, step: int, split: str, values: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        self._jsonl.write(json.dumps({"step": step, "split": split, **values}) + "\n")
        self._jsonl.flush()
        with self._tb.as_default(step=step):
            for k, v in values.items():
                tf.summary.scalar(f"{split}/{k}", v)
        self._tb.flush()

    def text(self, name: str, value: str) -> None:
        if self.enabled:
            with self._tb.as_default(step=0):
                tf.summary.text(name, value)

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            self._tb.close()


def read(workdir: str, split: str | None = None) -> list[dict]:
    """The records of WORKDIR/metrics.jsonl, in order (only `split`'s when given)."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not tf.io.gfile.exists(path):
        return []
    with tf.io.gfile.GFile(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [r for r in records if split is None or r["split"] == split]
