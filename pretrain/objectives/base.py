"""The interface every pretraining objective implements.

An objective is the unit of a family member: the Flax module it trains (one parameter
tree, which may hold two towers), the batch keys it reads, its loss and metric sums from a
batch and random keys, the whole-batch denominators of its means, the metrics it logs and
evaluates, and its model FLOPs per row. The trainer (pretrain/trainer.py, step.py),
evaluation, bench/, pretrain.ablate, pretrain.summary, checkpoints and the demo only ever
call this interface, so a new member (ELECTRA, SpanBERT, DeBERTa) is a new subclass, a gin
recipe binding `run.objective` and tests; nothing else changes.

How the known and coming members fit (docs/architecture.md has the full picture):

- MLM + NSP/SOP (BERT, RoBERTa, ALBERT): masked_lm.MaskedLM.
- ELECTRA (electra.ElectraRTD): `module` holds generator and discriminator sharing one
  embedding block; `rng_streams = ("dropout", "masking", "sampling")` gives the loss keys
  for masking and Gumbel sampling inside the step, drawn per row (`row_streams`); `loss`
  returns generator MLM + 50 x discriminator loss and the sums of both; `normalizers`
  counts real tokens and masked positions of the whole batch (both follow from the rows
  before any draw, so microbatching stays exact).
- SpanBERT (span_boundary.SpanBoundary, a MaskedLM): `batch_spec` adds the SBO keys that
  span masking writes (one per prediction slot); the module is BERT's with the span
  boundary head; the loss adds its sum / (targets + 1).
- DeBERTa v3: RTD as ELECTRA; gradient-disentangled embedding sharing is a stop_gradient
  inside the module (one optimizer, one parameter tree).
- XLNet (next): its Transformer-XL memories are carried state: `init_carry` declares them
  for a global batch (zeros, rows first) and `loss_with_carry` reads the rows' memories and
  returns the new ones, which the train state keeps (core/state.py `TrainState.carry`);
  its continuing data stream is a pipeline format (data/pipeline.py), not a trainer change.

Conventions every objective keeps:
- the pretraining tree's `encoder` subtree is the model that fine-tuning, export,
  feature extraction and fill-mask read (interop/bundle.py);
- `loss` works on any slice of rows of the batch, given `normalizers` of the whole batch:
  then the gradients of k microbatches sum to the gradient of the whole batch;
- metric values are sums (float32 scalars) so that they add across microbatches,
  steps and evaluation batches; `summarize` turns sums into means;
- carried state belongs to rows: every leaf has the batch's rows first, and row r's new
  carry depends only on row r (microbatches split and rejoin it by rows).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from models.attention import ATTENTION_DROPOUT

Batch = Mapping[str, jax.Array]


def dropout_rngs(rngs: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """The keys a module draws its dropout from in training: "dropout" (hidden states) and,
    where the step gives it, the attention probabilities' stream (models/attention.py
    ATTENTION_DROPOUT, shared by every microbatch)."""
    return {name: rngs[name] for name in ("dropout", ATTENTION_DROPOUT) if name in rngs}


class Objective(abc.ABC):
    """A pretraining objective (see the module docstring)."""

    #: The random streams `loss` draws from in training, one key each per step
    #: ("dropout" always; ELECTRA adds "sampling"). In evaluation every stream but
    #: "dropout" gets a fixed key, so evaluations repeat exactly.
    rng_streams: tuple[str, ...] = ("dropout",)

    #: The streams of `rng_streams` that `loss` draws from per row, folding in the batch's
    #: `row_index` [B] int32 (each row's place in the global batch, which the step adds).
    #: The step hands these keys unchanged to every microbatch, so a microbatched step draws
    #: exactly what the whole-batch step draws (ELECTRA's masking and sampling). The hidden
    #: states' dropout is not one (Flax draws it per call, per microbatch); the attention
    #: probabilities' is, always (`dropout_rngs`).
    row_streams: tuple[str, ...] = ()

    #: The metric that sums a run up: summary.json, ablation tables, the demo's report.
    headline_metric: str = "loss"

    @property
    @abc.abstractmethod
    def module(self) -> nn.Module:
        """The Flax module trained: `module.apply({"params": p}, batch, deterministic=...)`."""

    @abc.abstractmethod
    def batch_spec(
        self, batch_size: int, seq_len: int, num_predictions: int
    ) -> dict[str, jax.ShapeDtypeStruct]:
        """The batch keys this objective reads, with their shapes and dtypes (the pipeline
        must provide them; benchmarks and `init` make batches of this spec)."""

    @abc.abstractmethod
    def normalizers(self, batch: Batch) -> dict[str, jax.Array]:
        """The denominators of the loss's means over the whole batch, e.g. the number of
        predictions: computed once per step, before the batch is split into microbatches."""

    @abc.abstractmethod
    def loss(
        self,
        params: Any,
        batch: Batch,
        rngs: Mapping[str, jax.Array],
        normalizers: Mapping[str, jax.Array],
        *,
        train: bool,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """(scalar loss to differentiate, metric sums) of `batch`, a slice of the whole batch.

        rngs: one key per `rng_streams` entry. train: dropout on (evaluation: off).
        The loss is this slice's share of the whole batch's loss (its sums divided by
        `normalizers`), so shares add up over microbatches.
        """

    def init_carry(self, batch_size: int) -> Any:
        """The state carried from each step to the next for a global batch of `batch_size`
        rows, at its initial value (XLNet: zero memories), each leaf boxed with its logical
        axes (nn.LogicallyPartitioned, as the parameters are), the batch axis (core/axes.py
        BATCH) first; None (the default) carries nothing.

        The step keeps it in the train state; checkpoints hold it (unless the run says not
        to); a data stream that starts again (a warm start, a restarted or new phase's stream,
        a checkpoint without it) starts it from this value again, and so does a skipped
        non-finite step.
        """
        del batch_size
        return None

    def loss_with_carry(
        self,
        params: Any,
        batch: Batch,
        carry: Any,
        rngs: Mapping[str, jax.Array],
        normalizers: Mapping[str, jax.Array],
        *,
        train: bool,
    ) -> tuple[jax.Array, dict[str, jax.Array], Any]:
        """(loss, metric sums, new carry) of `batch`, a slice of rows, given `carry`, those
        rows' carried state (unboxed; None when nothing is carried). The step differentiates
        the loss only: the new carry is a constant to the next step, as Transformer-XL's
        stop-gradient memories are. The default, for objectives that carry nothing, is
        `loss` with the carry passed through."""
        loss, sums = self.loss(params, batch, rngs, normalizers, train=train)
        return loss, sums, carry

    @abc.abstractmethod
    def summarize(self, sums: Mapping[str, float]) -> dict[str, float]:
        """Metric sums (added over microbatches, steps or evaluation batches) -> the means
        that are logged and evaluated; always includes "loss" and `headline_metric`."""

    @abc.abstractmethod
    def log_labels(self) -> dict[str, str]:
        """{metric: short label} of the means shown in the console line after the loss."""

    @abc.abstractmethod
    def flops_per_row(self, seq_len: int, num_predictions: int) -> float:
        """Model FLOPs to train on one row (core/flops.py's counting)."""

    def paper_flops_per_row(self, seq_len: int, num_predictions: int) -> float | None:
        """Training FLOPs per row as the ELECTRA paper's flops_computation.py counts them
        (core/flops.py `paper_*`), reported beside ours when comparing with its tables;
        None where that script has no count for the objective."""
        del seq_len, num_predictions
        return None

    def example_batch(
        self, batch_size: int = 1, seq_len: int = 8, num_predictions: int = 2
    ) -> dict[str, np.ndarray]:
        """A batch of `batch_spec`'s keys, all zeros: for init and shape inference."""
        spec = self.batch_spec(batch_size, seq_len, num_predictions)
        return {key: np.zeros(s.shape, s.dtype) for key, s in spec.items()}

    def init(self, rng: jax.Array) -> Any:
        """The parameter tree (in nn.Partitioned boxes) from `rng`."""
        return self.module.init(rng, self.example_batch(), deterministic=True)["params"]
