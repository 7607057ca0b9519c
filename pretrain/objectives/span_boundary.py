"""SpanBERT's objective: MLM on span-masked rows plus the span boundary objective (SBO).

facebookresearch/SpanBERT pretraining/fairseq/criterions/spanbert_loss.py: the loss is
the MLM mean over the masked tokens plus the SBO sum over the span targets divided by
(targets + 1), weight 1.0 (`--pair-loss-weight 1.0`), no NSP (`--no-nsp`). The pipeline
masks spans (`PipelineConfig.masking_unit = 'span'`, data/masking.py mask_spans), which
also writes the SBO keys; the model is BERT's with the SBO head (models/heads.py
SpanBoundaryHead). Both denominators are counts of the whole batch (the original's are
per GPU batch), so microbatching stays exact.
"""

from __future__ import annotations

from collections.abc import Mapping

import gin
import jax
import jax.numpy as jnp
import numpy as np

from core import flops
from core.errors import ConfigError
from data.pipeline_config import PipelineConfig
from models.encoder import EncoderConfig
from models.heads import SBO_POSITION_WIDTH
from models.pretraining import BertPretrainingModel
from pretrain.objectives.base import Batch
from pretrain.objectives.masked_lm import MaskedLM, mlm_loss_and_metrics

SBO_KEYS = ("sbo_left", "sbo_right", "sbo_offset")


@gin.configurable
class SpanBoundary(MaskedLM):
    """MLM + SBO (`make_objective.objective = @SpanBoundary`, configs/recipes/spanbert.gin).

    Args:
      model_config: the encoder.
      pipeline_config: must mask spans (masking_unit 'span'), which makes the SBO keys;
        its sbo_max_targets sizes the head's position table. SpanBERT's run has no sentence
        objective; with NSP/SOP the sentence mean is added too (the original's
        mlm_nsp_sbo_loss.py), as in the masking-unit grid's span_sbo arm.
      sbo_weight: the SBO term's weight (SpanBERT: 1.0).
    """

    def __init__(self, model_config: EncoderConfig, pipeline_config: PipelineConfig, sbo_weight: float = 1.0):
        if pipeline_config.masking_unit != "span":
            raise ConfigError(
                "the span boundary objective needs span masking: set PipelineConfig.masking_unit = 'span' "
                f"(got {pipeline_config.masking_unit!r})"
            )
        self.sbo_weight = sbo_weight
        self.sbo_max_targets = pipeline_config.sbo_max_targets
        super().__init__(model_config, pipeline_config)

    def make_module(self) -> BertPretrainingModel:
        return BertPretrainingModel(
            self.model_config, sentence_head=self.sentence_head, sbo_max_targets=self.sbo_max_targets
        )

    def batch_spec(
        self, batch_size: int, seq_len: int, num_predictions: int
    ) -> dict[str, jax.ShapeDtypeStruct]:
        spec = super().batch_spec(batch_size, seq_len, num_predictions)
        predictions = (batch_size, num_predictions)
        for key in SBO_KEYS:
            spec[key] = jax.ShapeDtypeStruct(predictions, np.int32)
        spec["sbo_weights"] = jax.ShapeDtypeStruct(predictions, np.float32)
        return spec

    def normalizers(self, batch: Batch) -> dict[str, jax.Array]:
        """MLM predictions and SBO targets of the whole batch."""
        return dict(super().normalizers(batch), sbo_weight=jnp.sum(batch["sbo_weights"]))

    def loss_of_outputs(
        self, outputs: Mapping[str, jax.Array], batch: Batch, normalizers: Mapping[str, jax.Array]
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """MaskedLM's loss (MLM mean [+ sentence mean]) + sbo_weight x SBO sum / (SBO targets + 1)."""
        loss, sums = super().loss_of_outputs(outputs, batch, normalizers)
        sums.update(sbo_loss_and_metrics(outputs["sbo_logits"], batch["masked_lm_ids"], batch["sbo_weights"]))
        # spanbert_loss.py / mlm_nsp_sbo_loss.py: npairs = non-pad pair targets + 1.
        loss = loss + self.sbo_weight * sums["sbo_loss_sum"] / (normalizers["sbo_weight"] + 1.0)
        return loss, sums

    def summarize(self, sums: Mapping[str, float]) -> dict[str, float]:
        """MaskedLM's means plus sbo_loss (per target, the original's +1 left out) and
        sbo_accuracy; loss gains sbo_weight x sbo_loss."""
        out = super().summarize(sums)
        targets = max(sums["sbo_weight"], 1e-5)
        out["sbo_loss"] = sums["sbo_loss_sum"] / targets
        out["sbo_accuracy"] = sums["sbo_correct"] / targets
        out["loss"] += self.sbo_weight * out["sbo_loss"]
        return out

    def log_labels(self) -> dict[str, str]:
        return {**super().log_labels(), "sbo_accuracy": "sbo_acc"}

    def flops_per_row(self, seq_len: int, num_predictions: int) -> float:
        """BERT's MLM count plus the SBO head at every prediction slot."""
        c = self.model_config
        head = flops.span_boundary_head(
            hidden=c.hidden_size,
            embedding=c.embedding_width,
            vocab=c.vocab_size,
            predictions=num_predictions,
            position_width=SBO_POSITION_WIDTH,
        )
        return super().flops_per_row(seq_len, num_predictions) + flops.training(head)

    def paper_flops_per_row(self, seq_len: int, num_predictions: int) -> None:
        """flops_computation.py has no count for the SBO head."""
        del seq_len, num_predictions
        return None


def sbo_loss_and_metrics(logits: jax.Array, ids: jax.Array, weights: jax.Array) -> dict[str, jax.Array]:
    """logits [B, P, V] float32, ids [B, P] int32, weights [B, P] float32 -> sbo_loss_sum,
    sbo_correct, sbo_weight (sums, as `mlm_loss_and_metrics`)."""
    sums = mlm_loss_and_metrics(logits, ids, weights)
    return {
        "sbo_loss_sum": sums["mlm_loss_sum"],
        "sbo_correct": sums["mlm_correct"],
        "sbo_weight": sums["mlm_weight"],
    }
