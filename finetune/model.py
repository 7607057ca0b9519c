"""The fine-tuning model: the pretrained encoder and a head on the pooled [CLS].

As google-research/bert `run_classifier.py` (`create_model`): pooled output (the
pretrained pooler, dense + tanh on the first token) -> dropout 0.1 -> dense to the
classes (or to one score for STS-B regression, as HF's BertForSequenceClassification).

Parameter tree: `encoder` (models/encoder.py, loaded from the pretrained workdir) and
`classifier/{kernel, bias}` (new, truncated normal 0.02 / zeros).
"""

from __future__ import annotations

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
from models.encoder import Encoder, EncoderConfig, bias_init, kernel_init

log = logging.getLogger("finetune")


class PretrainedWeightsError(UserError):
    """Pretrained parameters that do not fit the fine-tuning model (one line)."""


class ClassifierModel(nn.Module):
    """Encoder + dropout + dense on the pooled [CLS]; `num_outputs` = classes, or 1 for regression."""

    config: EncoderConfig
    num_outputs: int
    classifier_dropout_rate: float = 0.1

    @nn.compact
    def __call__(self, batch: Mapping[str, jax.Array], *, deterministic: bool) -> jax.Array:
        """batch: int32 `input_ids`, `input_mask`, `segment_ids` [B, L].

        Returns [B, num_outputs] float32 logits (or [B, 1] scores).
        """
        cfg = self.config
        encoded = Encoder(cfg, name="encoder")(
            batch["input_ids"], batch["input_mask"], batch["segment_ids"], deterministic=deterministic
        )
        pooled = nn.Dropout(self.classifier_dropout_rate)(encoded.pooled_output, deterministic=deterministic)
        # A few thousand FLOPs per example: run in float32, like the loss it feeds.
        return nn.Dense(
            self.num_outputs,
            dtype=jnp.float32,
            param_dtype=cfg.storage_dtype,
            kernel_init=kernel_init(cfg, (axes.EMBED, None)),
            bias_init=bias_init((None,)),
            name="classifier",
        )(pooled)


def load_encoder(params: Any, pretrained: Mapping[str, Any], shardings: Any) -> Any:
    """`params` (the freshly initialised, sharded fine-tuning tree) with `encoder` replaced
    by the pretrained encoder, each array placed with its sharding.

    The pooler is taken from pretraining when the checkpoint has one (ours always do; an
    imported model without one keeps its fresh pooler, with a log line). Any other
    missing or differently shaped encoder parameter is an error.
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
    if unused:
        raise PretrainedWeightsError(f"pretrained encoder parameters the model does not use: {unused[:5]}")
    return {**params, "encoder": traverse_util.unflatten_dict(loaded)}
