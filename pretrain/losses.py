"""Pretraining losses and metrics, all in float32.

MLM: cross-entropy at the masked positions only, weighted by masked_lm_weights and
normalised by their sum (google-research/bert `get_masked_lm_output`). NSP/SOP:
mean cross-entropy over the batch. The total loss is their sum, as in BERT.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import optax


def mlm_loss_and_metrics(logits: jax.Array, ids: jax.Array, weights: jax.Array) -> dict[str, jax.Array]:
    """logits [B, P, V] float32, ids [B, P] int32, weights [B, P] float32 -> scalar sums.

    Returns sums (not means) so that values can be accumulated over microbatches or
    eval batches and divided once: mlm_loss_sum, mlm_correct, mlm_weight.
    """
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), ids)
    correct = (jnp.argmax(logits, axis=-1) == ids).astype(jnp.float32)
    return {
        "mlm_loss_sum": jnp.sum(losses * weights),
        "mlm_correct": jnp.sum(correct * weights),
        "mlm_weight": jnp.sum(weights),
    }


def sentence_loss_and_metrics(logits: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
    """logits [B, 2] float32, labels [B] int32 -> sentence_loss_sum, sentence_correct, sentence_count."""
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return {
        "sentence_loss_sum": jnp.sum(losses),
        "sentence_correct": jnp.sum(correct),
        "sentence_count": jnp.asarray(labels.shape[0], jnp.float32),
    }


def normalizers(batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """The denominators of the batch means: number of MLM predictions and of rows."""
    return {
        "mlm_weight": jnp.sum(batch["masked_lm_weights"]),
        "sentence_count": jnp.asarray(batch["input_ids"].shape[0], jnp.float32),
    }


def pretraining_loss(
    outputs: Mapping[str, jax.Array],
    batch: Mapping[str, jax.Array],
    denominators: Mapping[str, jax.Array] | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Total loss (MLM mean + sentence mean) and the metric sums of one batch.

    `denominators` (from `normalizers` of the whole batch) lets a microbatch compute its
    share of the whole batch's loss, so that accumulated gradients equal the full
    batch's; by default the means are over this batch.
    """
    sums = mlm_loss_and_metrics(outputs["mlm_logits"], batch["masked_lm_ids"], batch["masked_lm_weights"])
    denominators = denominators or normalizers(batch)
    # BERT adds 1e-5 to the denominator so a batch without predictions gives 0, not NaN.
    loss = sums["mlm_loss_sum"] / (denominators["mlm_weight"] + 1e-5)
    if "sentence_logits" in outputs:
        sentence = sentence_loss_and_metrics(outputs["sentence_logits"], batch["sentence_label"])
        sums.update(sentence)
        loss = loss + sentence["sentence_loss_sum"] / denominators["sentence_count"]
    return loss, sums


def summarize(sums: Mapping[str, float]) -> dict[str, float]:
    """Metric sums (possibly accumulated over batches) -> means: mlm_loss, mlm_accuracy, ..."""
    out = {
        "mlm_loss": sums["mlm_loss_sum"] / max(sums["mlm_weight"], 1e-5),
        "mlm_accuracy": sums["mlm_correct"] / max(sums["mlm_weight"], 1e-5),
    }
    if "sentence_count" in sums:
        out["sentence_loss"] = sums["sentence_loss_sum"] / sums["sentence_count"]
        out["sentence_accuracy"] = sums["sentence_correct"] / sums["sentence_count"]
    out["loss"] = out["mlm_loss"] + out.get("sentence_loss", 0.0)
    return out
