"""Loading a pretrained encoder into the fine-tuning model (models/classifier.py: the
encoder and the family's classification head)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from flax import traverse_util

from core.errors import UserError
from models import trees
from models.encoder import EncoderConfig

log = logging.getLogger("finetune")


class PretrainedWeightsError(UserError):
    """Pretrained parameters that do not fit the fine-tuning model (one line)."""


def load_encoder(config: EncoderConfig, params: Any, pretrained: Mapping[str, Any], shardings: Any) -> Any:
    """`params` (the freshly initialised, sharded fine-tuning tree) with `encoder` replaced
    by the pretrained encoder, each array placed with its sharding.

    The pooler is taken from pretraining when the head reads it and the checkpoint has
    one (an imported model without one keeps its fresh pooler, with a log line); a
    pretrained pooler that the head does not read (RoBERTa's head, on a checkpoint of a
    RoBERTa-with-NSP ablation arm) is left out, with a log line. An encoder without a
    pooler (ELECTRA's discriminator) meets a head that reads none and loads as is. Arrays
    that only pretraining reads (`models.trees.encoder_for_finetuning`: DeBERTa's mask
    decoder's position table) are left out. Other
    subtrees of the pretraining tree (MLM head, ELECTRA's generator) are not read. Any
    other missing, unused or differently shaped encoder parameter is an error.
    """
    source = traverse_util.flatten_dict(trees.encoder_for_finetuning(config, pretrained["encoder"]))
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
    if unused and all(name.startswith("pooler/") for name in unused):
        log.info("the classifier head does not read the pretrained pooler: left out")
        unused = []
    if unused:
        raise PretrainedWeightsError(f"pretrained encoder parameters the model does not use: {unused[:5]}")
    return {**params, "encoder": traverse_util.unflatten_dict(loaded)}
