"""The families this converter reads and writes, one format each (a new family is a module
beside this one, named in `FORMATS` and `_BY_LAYOUT`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from interop.convert.albert import ALBERT
from interop.convert.bert import BERT
from interop.convert.deberta import DEBERTA, DEBERTA_V2
from interop.convert.electra import ELECTRA
from interop.convert.format import ModelFormat
from interop.convert.layout import ConversionError
from interop.convert.roberta import ROBERTA
from interop.convert.xlnet import XLNET
from models.encoder import EncoderConfig

# By config.json's model_type; an ELECTRA folder is read as the discriminator.
FORMATS: Mapping[str, ModelFormat] = {
    f.model_type: f for f in (BERT, ROBERTA, ALBERT, ELECTRA, DEBERTA, DEBERTA_V2, XLNET)
}
# The most specific layout first: `format_of` takes the first family that describes a config,
# and a TF1 folder is read as the first family whose config file it has.
_BY_LAYOUT = (XLNET, DEBERTA, DEBERTA_V2, ELECTRA, ALBERT, ROBERTA, BERT)
# Families with original TF1 checkpoints, by the config file of their folders.
TF_FORMATS: Mapping[str, ModelFormat] = {f.tf_config_file: f for f in _BY_LAYOUT if f.tf_config_file}


def by_model_type(hf: Mapping[str, Any], where: str) -> ModelFormat:
    """The format of an HF config.json's model_type."""
    model_type = hf.get("model_type")
    if model_type not in FORMATS:
        raise ConversionError(
            f"{where}: model_type {model_type!r} is not supported: this converter reads {', '.join(FORMATS)}"
        )
    return FORMATS[model_type]


def untyped_candidate(hf: Mapping[str, Any]) -> ModelFormat | None:
    """The family whose old folders wrote a config.json like `hf` without model_type
    (pytorch-pretrained-bert's BERT), if any; its weights decide (`claims_untyped`)."""
    return next((f for f in _BY_LAYOUT if f.untyped_config(hf)), None)


def claims_untyped(fmt: ModelFormat, tensors: Mapping[str, np.ndarray]) -> bool:
    """Whether an untyped folder's weights are named as `fmt`'s (and no other family's)."""
    others = {f.hf_base for f in _BY_LAYOUT if f.hf_base != fmt.hf_base}
    return fmt.untyped_weights(tensors, others)


def format_of(config: EncoderConfig) -> ModelFormat:
    """The published family whose layout `config` has (for export)."""
    found = next((f for f in _BY_LAYOUT if f.describes(config)), None)
    if found is None:
        raise ConversionError(
            f"no published model family has this layout (sharing={config.sharing!r}, embedding_size="
            f"{config.embedding_size}, position_offset={config.position_offset}, classifier_head="
            f"{config.classifier_head!r}): {'; '.join(f.layout for f in _BY_LAYOUT)}"
        )
    return found
