"""Fine-tuning one task with one hyperparameter setting: featurize, train, evaluate each epoch.

As google-research/bert `run_classifier.py`: `[CLS] A [SEP] B [SEP]` (segment 0 for A,
1 for B), the longer side truncated token by token (`_truncate_seq_pair`); AdamW
(decoupled weight decay, none on LayerNorm and biases, clip 1.0), linear warmup over
`warmup_ratio` of the steps then linear decay to 0; softmax cross-entropy, or squared
error for the STS-B score. Dev is evaluated after every epoch; the epoch with the best
score on the first dev file (the task's own metric) is kept and its test predictions
are the run's.

Deviations: the last batch of an epoch is padded with zero-weight rows instead of
dropped (so small tasks see every example every epoch); the best epoch is kept (the
original code evaluated only the final model).

The step is compiled once per task (`TaskSteps`): the optimizer is core/optim.py's AdamW
with BERT's schedule (or the family's form, and ELECTRA's layer-wise lr decay), and a
grid point's learning rate, warmup and length are optax hyperparameters in the
optimizer state (`grid_adamw`), so every point of a grid reuses the same executable.
The train state and its sharded creation are core/state.py's, as in pretraining.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from core import optim, sharding
from core.errors import UserError
from core.sharding import Partitioner
from core.state import StateFactory, TrainState
from core.throughput import Throughput
from data import pair_layout, tokenizers
from data.tokenizers import Tokenizer
from finetune import metrics
from finetune.model import load_encoder
from finetune.tasks import Example, Task
from models.classifier import ClassifierModel
from models.encoder import EncoderConfig

log = logging.getLogger("finetune")


class FinetuneError(UserError):
    """A fine-tuning setting that cannot work (one line, user-facing)."""


# ----------------------------------------------------------------------------- features


@dataclasses.dataclass
class Features:
    """Model inputs of a list of examples.

    input_ids, input_mask, segment_ids: [N, L] int32. labels: [N] int32 class ids,
    float32 scores (regression) or zeros (test rows). truncated: rows cut to fit L.
    """

    input_ids: np.ndarray
    input_mask: np.ndarray
    segment_ids: np.ndarray
    labels: np.ndarray
    truncated: int

    def __len__(self) -> int:
        return len(self.labels)


def featurize(examples: Sequence[Example], task: Task, tokenizer: Tokenizer, max_seq_length: int) -> Features:
    """Tokenizes and packs examples into fixed-length [N, max_seq_length] int32 arrays, in
    the tokenizer's pair format (`tokenizers.pair_inputs`: BERT's `[CLS] A [SEP] B [SEP]`,
    RoBERTa's `<s> A </s></s> B </s>`, XLNet's `A <sep> B <sep> <cls>` padded on the left)."""
    n = len(examples)
    layout = pair_layout.get(tokenizer.pair_format)
    ids = np.full((n, max_seq_length), tokenizer.pad_id, np.int32)
    mask = np.zeros((n, max_seq_length), np.int32)
    segments = np.full((n, max_seq_length), layout.pad_segment, np.int32)
    labels = np.zeros(n, np.float32 if task.is_regression else np.int32)
    texts_a = tokenizer.encode_batch([e.text_a for e in examples])
    pair = n and examples[0].text_b is not None
    texts_b = tokenizer.encode_batch([e.text_b for e in examples]) if pair else [None] * n
    truncated = 0
    for i, (example, a, b) in enumerate(zip(examples, texts_a, texts_b)):
        tokens, types, cut = tokenizers.pair_inputs(tokenizer, a, b, max_seq_length)
        truncated += cut
        place = layout.placement(len(tokens), max_seq_length)
        ids[i, place] = tokens
        mask[i, place] = 1
        segments[i, place] = types
        if example.label is not None:
            labels[i] = example.label
    return Features(ids, mask, segments, labels, truncated)


def batches(
    features: Features, batch_size: int, order: np.ndarray | None = None
) -> Iterator[dict[str, np.ndarray]]:
    """Global batches of `batch_size` rows in `order` (default: as stored); the last is padded
    with zero-weight copies of row 0, so every row is used and every batch has one shape.

    Yields: input_ids, input_mask, segment_ids [B, L] int32, labels [B], weights [B] float32.
    Built one at a time, so an epoch of MNLI never sits in memory twice.
    """
    order = np.arange(len(features)) if order is None else order
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        weights = np.ones(batch_size, np.float32)
        if len(rows) < batch_size:
            weights[len(rows) :] = 0.0
            rows = np.concatenate([rows, np.zeros(batch_size - len(rows), rows.dtype)])
        yield {
            "input_ids": features.input_ids[rows],
            "input_mask": features.input_mask[rows],
            "segment_ids": features.segment_ids[rows],
            "labels": features.labels[rows],
            "weights": weights,
        }


def _local_rows(batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """This host's contiguous slice of a global batch (every host builds the same global batch)."""
    n = len(batch["weights"]) // jax.process_count()
    start = jax.process_index() * n
    return {k: v[start : start + n] for k, v in batch.items()}


# ----------------------------------------------------------------------------- steps


def _loss(logits: jax.Array, batch: Mapping[str, jax.Array], regression: bool) -> jax.Array:
    """Weighted mean loss, float32: squared error of the score, or softmax cross-entropy."""
    if regression:
        per_row = jnp.square(logits[:, 0] - batch["labels"])
    else:
        per_row = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
    weights = batch["weights"]
    return jnp.sum(per_row * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def train_step(state: TrainState, batch, rng, *, model, optimizer, regression):
    """One AdamW step (the grid point's schedule is in the optimizer state)."""

    def loss_fn(params):
        logits = model.apply(
            {"params": params},
            batch,
            deterministic=False,
            rngs={"dropout": jax.random.fold_in(rng, state.step)},
        )
        return _loss(logits, batch, regression)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), loss


def predict_step(params, batch, *, model):
    return model.apply({"params": params}, batch, deterministic=True)


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """The parts of AdamW that stay fixed across a grid (BERT: b2 0.999; RoBERTa: 0.98,
    fairseq's schedule form, weight decay on every parameter; ELECTRA: its warmup form and
    layer-wise lr decay; see core/optim.py)."""

    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-6
    clip_norm: float | None = 1.0
    schedule: str = "bert"
    decay_all_parameters: bool = False
    layerwise_lr_decay: float | None = None


class TaskSteps:
    """The model of one task on a mesh, with its state factory and train and predict
    steps, each compiled once for every run of the task's grid."""

    def __init__(
        self,
        config: EncoderConfig,
        task: Task,
        optimizer_config: OptimizerConfig,
        max_seq_length: int,
        partitioner: Partitioner,
        classifier_dropout_rate: float = 0.1,
    ):
        config.check_length(max_seq_length, "Grid.max_seq_length")
        self.partitioner, self.task, self.config = partitioner, task, config
        self.model = ClassifierModel(config, task.num_outputs, classifier_dropout_rate)
        self._make_optimizer = optim.grid_adamw(
            **dataclasses.asdict(optimizer_config), num_layers=config.num_layers
        )
        # Any grid point's transformation has the same update; the values come from the state.
        optimizer = self._make_optimizer(learning_rate=0.0, warmup_steps=0, total_steps=1)
        example = {
            k: np.zeros((1, max_seq_length), np.int32) for k in ("input_ids", "input_mask", "segment_ids")
        }
        self.states = StateFactory(
            lambda rng: self.model.init(rng, example, deterministic=True)["params"], optimizer, partitioner
        )
        data = partitioner.batch_sharding
        self.train_step = jax.jit(
            functools.partial(
                train_step, model=self.model, optimizer=optimizer, regression=task.is_regression
            ),
            in_shardings=(self.states.shardings, data, None),
            out_shardings=(self.states.shardings, None),
            donate_argnums=0,
        )
        self.predict_step = jax.jit(
            functools.partial(predict_step, model=self.model),
            in_shardings=(self.states.shardings.params, data),
            # Replicated, so that every host gets every row's prediction.
            out_shardings=NamedSharding(partitioner.mesh, PartitionSpec()),
        )

    def init(
        self,
        seed: int,
        pretrained_params: Mapping[str, Any],
        learning_rate: float,
        warmup_steps: int,
        total_steps: int,
    ) -> TrainState:
        """A fresh state: new head from `seed`, encoder from pretraining, zero Adam moments,
        and the grid point's schedule (peak learning rate, warmup, total steps)."""
        state = self.states(jax.random.key(seed))
        with self.partitioner:
            params = load_encoder(self.config, state.params, pretrained_params, self.states.shardings.params)
        opt_state = optim.set_hyperparams(
            state.opt_state, learning_rate=learning_rate, warmup_steps=warmup_steps, total_steps=total_steps
        )
        return state.replace(params=params, opt_state=opt_state)

    def predict(self, params, features: Features, batch_size: int) -> np.ndarray:
        """[N, num_outputs] float32 logits for every row of `features`."""
        outputs = []
        with self.partitioner:
            for batch in batches(features, batch_size):
                inputs = self.partitioner.global_batch(_local_rows(batch))
                outputs.append(np.asarray(jax.device_get(self.predict_step(params, inputs))))
        return np.concatenate(outputs)[: len(features)]


# ----------------------------------------------------------------------------- one run


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One point of a grid: peak learning rate, global batch size, epochs, seed."""

    learning_rate: float
    batch_size: int
    num_epochs: int
    seed: int
    warmup_ratio: float = 0.1

    @property
    def name(self) -> str:
        return f"lr{self.learning_rate:g}_bs{self.batch_size}_ep{self.num_epochs}"


def decode_predictions(task: Task, logits: np.ndarray) -> np.ndarray:
    """[N, C] logits -> [N] class ids, or [N] float scores for regression."""
    return logits[:, 0] if task.is_regression else np.argmax(logits, axis=-1)


def evaluate(task: Task, logits: np.ndarray, features: Features) -> dict[str, float]:
    return metrics.compute(task.metrics, decode_predictions(task, logits), features.labels)


@dataclasses.dataclass
class RunResult:
    """What one run gives.

    epochs: per epoch {epoch, train_loss, dev: {file: {metric: value}}, score}.
    best_epoch: 1-based; dev: the dev metrics at that epoch; score: its selection score
    (the task's metric mean on the first dev file).
    test_logits: {test file: [N, C] float32} at the best epoch.
    """

    epochs: list[dict[str, Any]]
    best_epoch: int
    dev: dict[str, dict[str, float]]
    score: float
    test_logits: dict[str, np.ndarray]
    seconds: float


def finetune(
    steps: TaskSteps,
    pretrained_params: Mapping[str, Any],
    train: Features,
    dev: Mapping[str, Features],
    test: Mapping[str, Features],
    run: RunConfig,
) -> RunResult:
    """Trains `run.num_epochs` epochs from the pretrained encoder; dev after every epoch."""
    start = time.time()
    if not len(train):
        raise FinetuneError(f"task {steps.task.name} has no training examples")
    sharding.check_batch_size(run.batch_size, steps.partitioner.mesh, jax.process_count())
    steps_per_epoch = math.ceil(len(train) / run.batch_size)
    total = steps_per_epoch * run.num_epochs
    warmup = int(total * run.warmup_ratio)
    state = steps.init(
        run.seed, pretrained_params, learning_rate=run.learning_rate, warmup_steps=warmup, total_steps=total
    )
    rng = jax.random.key(run.seed + 1)
    shuffle = np.random.default_rng(run.seed)
    history: list[dict[str, Any]] = []
    best: tuple[float, int, dict, dict] | None = None
    rates = Throughput(total)
    rates.start()
    step = 0
    for epoch in range(1, run.num_epochs + 1):
        losses = []
        with steps.partitioner:
            for batch in batches(train, run.batch_size, shuffle.permutation(len(train))):
                inputs = steps.partitioner.global_batch(_local_rows(batch))
                state, loss = steps.train_step(state, inputs, rng)
                rates.add(int(batch["input_mask"][batch["weights"] > 0].sum()), 0.0)
                losses.append(loss)
                step += 1
                if not rates.started:  # the first step compiles: keep it out of the rates
                    jax.block_until_ready(loss)
                    rates.begin()
        train_loss = float(np.mean(jax.device_get(losses)))  # a sync: the epoch's steps are done
        speed = {k: v for k, v in rates.close(step).items() if k in ("steps_per_second", "tokens_per_second")}
        if not np.isfinite(train_loss):
            raise FinetuneError(
                f"{steps.task.name} {run.name} seed {run.seed}: non-finite training loss in epoch {epoch}: "
                "lower the learning rate"
            )
        with rates.paused():
            dev_values = {
                name: evaluate(steps.task, steps.predict(state.params, features, run.batch_size), features)
                for name, features in dev.items()
            }
        score = metrics.task_score(dev_values[steps.task.dev_files[0]], steps.task.metrics)
        history.append({"epoch": epoch, "train_loss": train_loss, "dev": dev_values, "score": score, **speed})
        log.info(
            "%s %s seed %d epoch %d/%d: train loss %.4f  dev %s  %s",
            steps.task.name,
            run.name,
            run.seed,
            epoch,
            run.num_epochs,
            train_loss,
            _dev_text(dev_values),
            f"{speed['steps_per_second']:.2f} steps/s  {speed['tokens_per_second']:.0f} tokens/s"
            if speed
            else "",
        )
        if best is None or score > best[0]:
            # Predict the test files now rather than keep a copy of the parameters.
            test_logits = {name: steps.predict(state.params, f, run.batch_size) for name, f in test.items()}
            best = (score, epoch, dev_values, test_logits)
    score, best_epoch, dev_values, test_logits = best
    return RunResult(history, best_epoch, dev_values, score, test_logits, time.time() - start)


def _dev_text(dev_values: dict[str, dict[str, float]]) -> str:
    """'accuracy=0.9180' for a task's one dev file; each metric named with its file where there
    are several (MNLI: 'dev_matched:accuracy=0.8412  dev_mismatched:accuracy=0.8390')."""
    named = len(dev_values) > 1
    return "  ".join(
        f"{f + ':' if named else ''}{m}={v:.4f}"
        for f, values in dev_values.items()
        for m, v in values.items()
    )
