"""Hyperparameter grids x seeds, one resumable run each, and the choice of configuration.

A grid (gin: `Grid.learning_rates = (...)`, per task with a scope: `rte/Grid.num_epochs
= (10,)`) is the product learning rate x batch size x epochs; every configuration runs
once per seed. Each run writes

    WORKDIR/runs/<task>/<configuration>/seed_<s>/test_logits.npz
    WORKDIR/runs/<task>/<configuration>/seed_<s>/result.json   (written last: "finished")

and a run whose result.json exists is read back instead of trained again, so a stopped
sweep started again continues where it stopped (an interrupted run starts over).

Per configuration the report gives the median and the mean over seeds of every dev
metric; the configuration with the best median score is chosen (docs/recipes.md "GLUE":
report the median over >= 5 seeds), and its best-scoring seed provides the test predictions.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import gin
import jax
import numpy as np
import tensorflow as tf

from core import optim
from core.errors import ConfigError
from finetune import metrics
from finetune.tasks import Task
from finetune.trainer import OptimizerConfig, RunConfig, RunResult

log = logging.getLogger("finetune")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Grid:
    """The fine-tuning grid of one task (defaults: BERT's, docs/recipes.md "GLUE").

    Attributes:
      learning_rates, batch_sizes, num_epochs: the axes of the grid (global batch).
      seeds: every configuration runs once per seed (head init, dropout, data order).
      warmup_ratio: linear warmup over this fraction of the steps, then linear decay to 0.
      max_seq_length: tokens per example, [CLS] and [SEP]s included.
      dropout_rate: the encoder's hidden and attention dropout while fine-tuning (ALBERT v2: 0).
      classifier_dropout_rate: the head's dropout (models/classifier.py): before the classifier
        (0.1 in BERT and ALBERT); RoBERTa's head has it before and after its dense layer
        (fairseq's --pooler-dropout, 0 in configs/glue/roberta.gin).
      weight_decay, adam_b1, adam_b2, adam_eps, clip_norm: AdamW (RoBERTa: wd 0.1, b2 0.98).
      schedule: the decay form after warmup, "bert" (over the whole run, as BERT's
        run_classifier.py), "fairseq" (from the peak at the end of warmup; RoBERTa) or
        "electra" (BERT's decay times the warmup ramp; core/optim.py).
      decay_all_parameters: weight decay on biases and LayerNorm too (fairseq; RoBERTa).
      layerwise_lr_decay: ELECTRA's layer-wise learning-rate decay (core/optim.py
        `layer_depth`): the head trains at the learning rate, the top layer at lr * d^2,
        the embeddings at lr * d^(layers + 2); None or 1.0 = off. Not for models with
        cross-layer sharing (ALBERT).
    """

    learning_rates: tuple[float, ...] = (5e-5, 4e-5, 3e-5, 2e-5)
    batch_sizes: tuple[int, ...] = (32,)
    num_epochs: tuple[int, ...] = (3,)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    warmup_ratio: float = 0.1
    max_seq_length: int = 128
    dropout_rate: float = 0.1
    classifier_dropout_rate: float = 0.1
    weight_decay: float = 0.01
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-6
    clip_norm: float | None = 1.0
    schedule: str = "bert"
    decay_all_parameters: bool = False
    layerwise_lr_decay: float | None = None

    def __post_init__(self):
        for name in ("learning_rates", "batch_sizes", "num_epochs", "seeds"):
            if not getattr(self, name):
                raise ConfigError(f"Grid.{name} must not be empty")
        optim.layerwise_decay_on(self.layerwise_lr_decay)  # a bad value fails before any data is read

    def runs(self) -> list[RunConfig]:
        """Every (configuration, seed), configurations in grid order, seeds innermost."""
        return [
            RunConfig(lr, bs, ep, seed, self.warmup_ratio)
            for lr, bs, ep, seed in itertools.product(
                self.learning_rates, self.batch_sizes, self.num_epochs, self.seeds
            )
        ]

    @property
    def optimizer(self) -> OptimizerConfig:
        return OptimizerConfig(
            weight_decay=self.weight_decay,
            b1=self.adam_b1,
            b2=self.adam_b2,
            eps=self.adam_eps,
            clip_norm=self.clip_norm,
            schedule=self.schedule,
            decay_all_parameters=self.decay_all_parameters,
            layerwise_lr_decay=self.layerwise_lr_decay,
        )


def task_grid(task: Task) -> Grid:
    """The grid for `task`: the gin bindings of `Grid`, with `<task>/Grid.*` overriding them."""
    with gin.config_scope(task.name):
        return Grid()


def glue_task_score(task: Task, dev: Mapping[str, Mapping[str, float]]) -> float:
    """The task's GLUE score: its metric mean, averaged over dev files (MNLI: matched and mismatched)."""
    return float(np.mean([metrics.task_score(values, task.metrics) for values in dev.values()]))


def run_dir(workdir: str, task: Task, run: RunConfig) -> str:
    return os.path.join(workdir, "runs", task.name, run.name, f"seed_{run.seed}")


def _save(directory: str, run: RunConfig, result: RunResult) -> None:
    if jax.process_index() != 0:
        return
    tf.io.gfile.makedirs(directory)
    buffer = io.BytesIO()
    np.savez(buffer, **result.test_logits)
    with tf.io.gfile.GFile(os.path.join(directory, "test_logits.npz"), "wb") as f:
        f.write(buffer.getvalue())
    record = {
        "run": dataclasses.asdict(run),
        "epochs": result.epochs,
        "best_epoch": result.best_epoch,
        "dev": result.dev,
        "score": result.score,
        "seconds": result.seconds,
    }
    # Written last and renamed into place: its presence means the run finished.
    tmp = os.path.join(directory, "result.json.tmp")
    with tf.io.gfile.GFile(tmp, "w") as f:
        json.dump(record, f, indent=2)
    tf.io.gfile.rename(tmp, os.path.join(directory, "result.json"), overwrite=True)


def _load(directory: str) -> RunResult | None:
    path = os.path.join(directory, "result.json")
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        record = json.load(f)
    with tf.io.gfile.GFile(os.path.join(directory, "test_logits.npz"), "rb") as f:
        logits = dict(np.load(io.BytesIO(f.read())))
    return RunResult(
        record["epochs"], record["best_epoch"], record["dev"], record["score"], logits, record["seconds"]
    )


@dataclasses.dataclass
class SweepResult:
    """A task's sweep.

    configurations: per configuration {name, learning_rate, batch_size, num_epochs,
      seeds, per_seed: [{seed, score, glue_score, best_epoch, dev}], median/mean of the
      score and the GLUE score, and dev_median: {file: {metric: median over seeds}}}.
    chosen: the chosen configuration's entry; chosen_seed: the seed whose test
      predictions are submitted; test_logits: that run's {test file: [N, C]}.
    trained, reused: how many runs were trained now and read back from the workdir.
    """

    configurations: list[dict[str, Any]]
    chosen: dict[str, Any]
    chosen_seed: int
    test_logits: dict[str, np.ndarray]
    trained: int
    reused: int


def sweep(task: Task, grid: Grid, workdir: str, train_one: Callable[[RunConfig], RunResult]) -> SweepResult:
    """Runs (or reads back) every run of `grid` and chooses the configuration.

    train_one: trains one run (finetune.trainer.finetune with the task bound).
    """
    results: dict[RunConfig, RunResult] = {}
    trained = reused = 0
    for run in grid.runs():
        directory = run_dir(workdir, task, run)
        result = _load(directory)
        if result is None:
            result = train_one(run)
            _save(directory, run, result)
            trained += 1
        else:
            log.info("%s %s seed %d: finished earlier, read back", task.name, run.name, run.seed)
            reused += 1
        results[run] = result

    configurations = []
    for name in dict.fromkeys(run.name for run in results):
        runs = [run for run in results if run.name == name]
        per_seed = [
            {
                "seed": run.seed,
                "score": results[run].score,
                "glue_score": glue_task_score(task, results[run].dev),
                "best_epoch": results[run].best_epoch,
                "dev": results[run].dev,
            }
            for run in runs
        ]
        scores = [s["score"] for s in per_seed]
        glue_scores = [s["glue_score"] for s in per_seed]
        dev_median = {
            file: {m: float(np.median([s["dev"][file][m] for s in per_seed])) for m in values}
            for file, values in per_seed[0]["dev"].items()
        }
        configurations.append(
            {
                "name": name,
                "learning_rate": runs[0].learning_rate,
                "batch_size": runs[0].batch_size,
                "num_epochs": runs[0].num_epochs,
                "warmup_ratio": runs[0].warmup_ratio,
                "seeds": [run.seed for run in runs],
                "per_seed": per_seed,
                "score_median": float(np.median(scores)),
                "score_mean": float(np.mean(scores)),
                "glue_score_median": float(np.median(glue_scores)),
                "glue_score_mean": float(np.mean(glue_scores)),
                "dev_median": dev_median,
            }
        )
    # Best median; the mean breaks ties (then grid order).
    chosen = max(configurations, key=lambda c: (c["score_median"], c["score_mean"]))
    best_seed = max(chosen["per_seed"], key=lambda s: s["score"])["seed"]
    best_run = next(run for run in results if run.name == chosen["name"] and run.seed == best_seed)
    return SweepResult(configurations, chosen, best_seed, results[best_run].test_logits, trained, reused)
