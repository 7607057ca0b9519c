"""BERT's objective: masked-LM, plus next-sentence (NSP) or sentence-order (SOP)
prediction when the data has sentence labels. BERT, RoBERTa (MLM only) and ALBERT (SOP).

MLM: cross-entropy at the masked positions only, weighted by masked_lm_weights and
normalised by their sum over the batch (google-research/bert `get_masked_lm_output`).
NSP/SOP: mean cross-entropy over the rows. The total loss is their sum, as in BERT. All
losses and metrics are float32.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax

from core import flops
from core.errors import ConfigError
from data.pipeline_config import PipelineConfig
from models.encoder import EncoderConfig
from models.pretraining import BertPretrainingModel
from pretrain.objectives.base import Batch, Objective, dropout_rngs


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


def _check_pooler_possible(model_config: EncoderConfig, sentence_objective: str) -> None:
    """The sentence head reads a pooler, which the pretraining model adds to the encoder
    (models/pretraining.py); an encoder that cannot have one (XLNet's) is refused here, in
    words about the sentence objective, the real cause (a model file alone gets the default
    recipe's NSP)."""
    try:
        dataclasses.replace(model_config, pooler=True)
    except ConfigError as e:
        reason = str(e).split(": set ", 1)[0].split(", but ", 1)[-1]
        raise ConfigError(
            f"PipelineConfig.sentence_objective = {sentence_objective!r} puts a sentence head on the "
            f"pooler, but {reason}: add the model's recipe (--gin_file=configs/recipes/...), or bind "
            "PipelineConfig.sentence_objective = 'none'"
        ) from None


@gin.configurable
class MaskedLM(Objective):
    """MLM (+ NSP/SOP): the sentence head exists iff the pipeline makes sentence labels
    (`PipelineConfig.sentence_objective` "nsp" or "sop"; both are the same 2-way head on
    the pooled [CLS]), so model and data cannot disagree.

    Args:
      model_config: the encoder.
      pipeline_config: the data recipe (sentence labels; packed rows with example_ids).
    """

    headline_metric = "mlm_accuracy"

    def __init__(self, model_config: EncoderConfig, pipeline_config: PipelineConfig):
        self.model_config = model_config
        self.sentence_objective = pipeline_config.sentence_objective
        self.sentence_head = self.sentence_objective != "none"
        if self.sentence_head:
            _check_pooler_possible(model_config, self.sentence_objective)
        self.packed = pipeline_config.packed
        self._module = self.make_module()

    def make_module(self) -> BertPretrainingModel:
        """The module trained (built once, by __init__): where a subclass adds heads."""
        return BertPretrainingModel(self.model_config, sentence_head=self.sentence_head)

    @property
    def module(self) -> BertPretrainingModel:
        return self._module

    def batch_spec(
        self, batch_size: int, seq_len: int, num_predictions: int
    ) -> dict[str, jax.ShapeDtypeStruct]:
        rows = (batch_size, seq_len)
        predictions = (batch_size, num_predictions)
        spec = {
            "input_ids": jax.ShapeDtypeStruct(rows, np.int32),
            "input_mask": jax.ShapeDtypeStruct(rows, np.int32),
            "segment_ids": jax.ShapeDtypeStruct(rows, np.int32),
            "positions": jax.ShapeDtypeStruct(rows, np.int32),
            "masked_lm_positions": jax.ShapeDtypeStruct(predictions, np.int32),
            "masked_lm_ids": jax.ShapeDtypeStruct(predictions, np.int32),
            "masked_lm_weights": jax.ShapeDtypeStruct(predictions, np.float32),
        }
        if self.packed:
            spec["example_ids"] = jax.ShapeDtypeStruct(rows, np.int32)
        if self.sentence_head:
            spec["sentence_label"] = jax.ShapeDtypeStruct((batch_size,), np.int32)
        return spec

    def normalizers(self, batch: Batch) -> dict[str, jax.Array]:
        """The number of MLM predictions and of rows in the whole batch."""
        return {
            "mlm_weight": jnp.sum(batch["masked_lm_weights"]),
            "sentence_count": jnp.asarray(batch["input_ids"].shape[0], jnp.float32),
        }

    def loss(
        self,
        params: Any,
        batch: Batch,
        rngs: Mapping[str, jax.Array],
        normalizers: Mapping[str, jax.Array],
        *,
        train: bool,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """MLM mean + sentence mean of the whole batch, restricted to this slice's rows."""
        outputs = self.module.apply(
            {"params": params},
            batch,
            deterministic=not train,
            rngs=dropout_rngs(rngs) if train else {},
        )
        return self.loss_of_outputs(outputs, batch, normalizers)

    def loss_of_outputs(
        self, outputs: Mapping[str, jax.Array], batch: Batch, normalizers: Mapping[str, jax.Array]
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """(loss, sums) of the module's logits: where a subclass adds its heads' terms."""
        sums = mlm_loss_and_metrics(outputs["mlm_logits"], batch["masked_lm_ids"], batch["masked_lm_weights"])
        # BERT adds 1e-5 to the denominator so a batch without predictions gives 0, not NaN.
        loss = sums["mlm_loss_sum"] / (normalizers["mlm_weight"] + 1e-5)
        if self.sentence_head:
            sentence = sentence_loss_and_metrics(outputs["sentence_logits"], batch["sentence_label"])
            sums.update(sentence)
            loss = loss + sentence["sentence_loss_sum"] / normalizers["sentence_count"]
        return loss, sums

    def summarize(self, sums: Mapping[str, float]) -> dict[str, float]:
        """mlm_loss, mlm_accuracy (+ sentence_loss, sentence_accuracy) and loss, their sum."""
        out = {
            "mlm_loss": sums["mlm_loss_sum"] / max(sums["mlm_weight"], 1e-5),
            "mlm_accuracy": sums["mlm_correct"] / max(sums["mlm_weight"], 1e-5),
        }
        if "sentence_count" in sums:
            out["sentence_loss"] = sums["sentence_loss_sum"] / sums["sentence_count"]
            out["sentence_accuracy"] = sums["sentence_correct"] / sums["sentence_count"]
        out["loss"] = out["mlm_loss"] + out.get("sentence_loss", 0.0)
        return out

    def log_labels(self) -> dict[str, str]:
        labels = {"mlm_accuracy": "mlm_acc"}
        if self.sentence_head:
            labels["sentence_accuracy"] = f"{self.sentence_objective}_acc"
        return labels

    def flops_per_row(self, seq_len: int, num_predictions: int) -> float:
        """BERT-style MLM training FLOPs (core/flops.py); NSP/SOP's 2-way head is negligible."""
        c = self.model_config
        return flops.bert_pretraining(
            hidden=c.hidden_size,
            layers=c.num_layers,
            intermediate=c.intermediate_size,
            vocab=c.vocab_size,
            seq=seq_len,
            predictions=num_predictions,
            embedding=c.embedding_width,
        )

    def paper_flops_per_row(self, seq_len: int, num_predictions: int) -> float:
        """flops_computation.py's count of a BERT masked LM (with its output_frac, 0.15625, as the
        paper counted every model)."""
        del num_predictions
        c = self.model_config
        return flops.paper_train(
            hidden=c.hidden_size,
            layers=c.num_layers,
            seq=seq_len,
            vocab=c.vocab_size,
            embedding=c.embedding_width,
        )
