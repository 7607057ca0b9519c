"""The fine-tuning model: the pretrained encoder and the model family's classification head.

`EncoderConfig.classifier_head` (set by the family's model files, saved in the workdir):
  "pooler" (BERT, ALBERT): as google-research/bert `run_classifier.py` (`create_model`),
    pooled output (the pretrained pooler, dense + tanh on the first token) -> dropout ->
    dense to the classes (or to one score for STS-B regression, as HF's
    BertForSequenceClassification).
  "roberta": fairseq's RobertaClassificationHead (as HF's): first token -> dropout ->
    dense H -> tanh -> dropout -> dense to the classes. The dense layer is new: RoBERTa
    pretrains no pooler.
  "electra": google-research/electra `classification_tasks.py` (`get_prediction_module`):
    the first token's final hidden state (`get_pooled_output` is `sequence_output[:, 0]`,
    no dense or tanh) -> dropout -> dense to the classes (or the score). HF's
    ElectraClassificationHead adds a dense + GELU layer first; the original has none.

Parameter tree: `encoder` (models/encoder.py, loaded from the pretrained workdir; with a
pooler only for the "pooler" head), `classifier_dense/{kernel, bias}` ("roberta" only) and
`classifier/{kernel, bias}` (new; zero bias; kernel truncated normal 0.02, except
"electra": Glorot uniform, the default of the original's `tf.layers.dense`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from core import axes
from core.errors import UserError
from models.backbone import encoder_module
from models.dropout import Dropout
from models.encoder import EncoderConfig, bias_init, dense, kernel_init

log = logging.getLogger("finetune")


class PretrainedWeightsError(UserError):
    """Pretrained parameters that do not fit the fine-tuning model (one line)."""


class ClassifierModel(nn.Module):
    """Encoder + the family's head (`config.classifier_head`); `num_outputs` = classes, or 1
    for regression."""

    config: EncoderConfig
    num_outputs: int
    classifier_dropout_rate: float = 0.1

    @nn.compact
    def __call__(self, batch: Mapping[str, jax.Array], *, deterministic: bool) -> jax.Array:
        """batch: int32 `input_ids`, `input_mask`, `segment_ids` [B, L].

        Returns [B, num_outputs] float32 logits (or [B, 1] scores).
        """
        cfg = self.config
        uses_pooler = cfg.classifier_head == "pooler"
        encoded = encoder_module(dataclasses.replace(cfg, pooler=uses_pooler), name="encoder")(
            batch["input_ids"], batch["input_mask"], batch["segment_ids"], deterministic=deterministic
        )
        dropout = Dropout(self.classifier_dropout_rate, bits=cfg.dropout_bits)
        classifier_init = kernel_init(cfg, (axes.EMBED, None))
        if uses_pooler:
            features = encoded.pooled_output
        elif cfg.classifier_head == "electra":
            features = encoded.sequence_output[:, 0]
            classifier_init = nn.with_logical_partitioning(
                nn.initializers.glorot_uniform(), (axes.EMBED, None)
            )
        elif cfg.classifier_head == "deberta":
            # The original's ContextPooler (DeBERTa/deberta/pooling.py; HF ContextPooler):
            # dense -> GELU on the first token, its pooler_dropout 0; the dropout below is
            # its cls_dropout (the hidden dropout unless a task sets it).
            features = cfg.activation(
                dense(cfg, cfg.hidden_size, (axes.EMBED, axes.MLP), name="classifier_dense")(
                    encoded.sequence_output[:, 0]
                )
            )
        else:  # "roberta"
            first = dropout(encoded.sequence_output[:, 0], deterministic=deterministic)
            features = jnp.tanh(
                dense(cfg, cfg.hidden_size, (axes.EMBED, axes.MLP), name="classifier_dense")(first)
            )
        features = dropout(features, deterministic=deterministic)
        # A few thousand FLOPs per example: run in float32, like the loss it feeds.
        return nn.Dense(
            self.num_outputs,
            dtype=jnp.float32,
            param_dtype=cfg.storage_dtype,
            kernel_init=classifier_init,
            bias_init=bias_init((None,)),
            name="classifier",
        )(features)


# A BERT encoder always has its position table; a DeBERTa encoder has one only where the
# enhanced mask decoder reads it (pretraining), so fine-tuning leaves it out.
_EMD_POSITION_TABLE = "embeddings/position_embeddings/embedding"


def load_encoder(params: Any, pretrained: Mapping[str, Any], shardings: Any) -> Any:
    """`params` (the freshly initialised, sharded fine-tuning tree) with `encoder` replaced
    by the pretrained encoder, each array placed with its sharding.

    The pooler is taken from pretraining when the head reads it and the checkpoint has
    one (an imported model without one keeps its fresh pooler, with a log line); a
    pretrained pooler that the head does not read (RoBERTa's head, on a checkpoint of a
    RoBERTa-with-NSP ablation arm) is left out, with a log line. An encoder without a
    pooler (ELECTRA's discriminator) meets a head that reads none and loads as is. DeBERTa's
    absolute position table, which only its pretraining decoder reads, is left out. Other
    subtrees of the pretraining tree (MLM head, ELECTRA's generator) are not read. Any
    other missing, unused or differently shaped encoder parameter is an error.
    """
    source = traverse_util.flatten_dict(pretrained["encoder"])
    target = traverse_util.flatten_dict(params["encoder"])
    target_shardings = traverse_util.flatten_dict(shardings["encoder"])
    loaded = {}
    for path, fresh in target.items():
        name = "/".join(path)
        if path not in source:
            if path[0] == "pooler":
                log.info("pretrained checkpoint has no %s: the pooler starts from a random init", name)
                loaded[path] = fresh
                continue
            raise PretrainedWeightsError(
                f"pretrained checkpoint has no encoder parameter {name}: is it a different architecture?"
            )
        value = np.asarray(source[path])
        if value.shape != fresh.shape:
            raise PretrainedWeightsError(
                f"pretrained encoder/{name} has shape {value.shape} but the model wants {fresh.shape}"
            )
        loaded[path] = jax.device_put(value.astype(fresh.dtype), target_shardings[path])
    unused = sorted("/".join(p) for p in source if p not in target)
    if _EMD_POSITION_TABLE in unused:
        log.info("DeBERTa's absolute position table (read only by its pretraining mask decoder): left out")
        unused.remove(_EMD_POSITION_TABLE)
    if unused and all(name.startswith("pooler/") for name in unused):
        log.info("the classifier head does not read the pretrained pooler: left out")
        unused = []
    if unused:
        raise PretrainedWeightsError(f"pretrained encoder parameters the model does not use: {unused[:5]}")
    return {**params, "encoder": traverse_util.unflatten_dict(loaded)}
