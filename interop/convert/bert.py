"""BERT: HF model_type "bert" and google-research/bert's TF1 checkpoints
(bert_config.json, bert_model.ckpt.*, vocab.txt); also SpanBERT's releases, whose
config.json (pytorch-pretrained-bert's) has no model_type.

The embedding and layer rows here are shared by the families built on BERT's encoder
(RoBERTa, ALBERT's embeddings, ELECTRA, DeBERTa's layers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from interop.convert.format import ModelFormat
from interop.convert.layout import BIAS, CLASSIFIER, DENSE, EMBED, HEADS_IN, HEADS_OUT, NORM, heads, rows
from models.encoder import EncoderConfig

# Embeddings of BERT, RoBERTa, ALBERT, ELECTRA and DeBERTa: ours under encoder/embeddings/,
# HF under {base}embeddings., TF under bert/embeddings/ (google-research/bert and /albert
# modeling.py). ALBERT's are E wide.
EMBEDDINGS = (
    ("word_embeddings", EMBED, "word_embeddings", "word_embeddings"),
    ("position_embeddings", EMBED, "position_embeddings", "position_embeddings"),
    ("token_type_embeddings", EMBED, "token_type_embeddings", "token_type_embeddings"),
    ("layer_norm", NORM, "LayerNorm", "LayerNorm"),
)
EMBEDDING_ROWS = ("encoder", "encoder/embeddings/", "{base}embeddings.", "bert/embeddings/")
# A BERT / RoBERTa layer: ours under encoder/layer_{i}/, HF under {base}encoder.layer.{i}.,
# TF under bert/encoder/layer_{i}/.
LAYER = (
    ("attention/query", HEADS_IN, "attention.self.query", "attention/self/query"),
    ("attention/key", HEADS_IN, "attention.self.key", "attention/self/key"),
    ("attention/value", HEADS_IN, "attention.self.value", "attention/self/value"),
    ("attention/output", HEADS_OUT, "attention.output.dense", "attention/output/dense"),
    ("attention_layer_norm", NORM, "attention.output.LayerNorm", "attention/output/LayerNorm"),
    ("intermediate", DENSE, "intermediate.dense", "intermediate/dense"),
    ("output", DENSE, "output.dense", "output/dense"),
    ("output_layer_norm", NORM, "output.LayerNorm", "output/LayerNorm"),
)
# The heads: (group, our path, kind, HF name, TF name), full names.
_HEADS = (
    ("pooler", "encoder/pooler", DENSE, "{base}pooler.dense", "bert/pooler/dense"),
    (
        "mlm_head",
        "mlm_head/transform",
        DENSE,
        "cls.predictions.transform.dense",
        "cls/predictions/transform/dense",
    ),
    (
        "mlm_head",
        "mlm_head/transform_layer_norm",
        NORM,
        "cls.predictions.transform.LayerNorm",
        "cls/predictions/transform/LayerNorm",
    ),
    ("mlm_head", "mlm_head/output_bias", BIAS, "cls.predictions.bias", "cls/predictions/output_bias"),
    ("sentence_head", "sentence_head/classifier", CLASSIFIER, "cls.seq_relationship", "cls/seq_relationship"),
)

# A config.json without model_type is read as BERT only when it has the keys of
# pytorch-pretrained-bert's BertConfig (which wrote no model_type: e.g. SpanBERT's release,
# spanbert_hf*.tar.gz / SpanBERT/spanbert-*-cased), none that only other families' configs
# have, and weights with BERT's encoder names.
_LEGACY_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
_NOT_BERT_KEYS = ("embedding_size", "num_hidden_groups", "inner_group_num")


@dataclasses.dataclass(frozen=True)
class BertFormat(ModelFormat):
    """BERT's format: the base class's behaviour, plus reading untyped legacy folders and
    TF1 checkpoints (its "gelu" is the exact erf form: google-research/bert's modeling.py
    when the released checkpoints were trained, and HF's converted BERT configs say "gelu")."""

    def describes(self, config: EncoderConfig) -> bool:
        return config.sharing == "none" and not config.factorized_embedding and config.position_offset == 0

    def untyped_config(self, hf: Mapping[str, Any]) -> bool:
        """A config.json without model_type whose keys are BERT's (the weights decide:
        `untyped_weights`)."""
        return (
            "model_type" not in hf
            and all(k in hf for k in _LEGACY_KEYS)
            and not any(k in hf for k in _NOT_BERT_KEYS)
        )

    def untyped_weights(self, tensors: Mapping[str, np.ndarray], other_prefixes: Iterable[str]) -> bool:
        """Weights named as BERT's encoder (bert.embeddings.* or, a bare BertModel,
        embeddings.*) and none of another family's prefix."""
        others = tuple(other_prefixes)
        return any(
            f"{base}embeddings.word_embeddings.weight" in tensors for base in (self.hf_base, "")
        ) and not any(k.startswith(others) for k in tensors)


BERT = BertFormat(
    model_type="bert",
    hf_base="bert.",
    table=(
        *rows(*EMBEDDING_ROWS, EMBEDDINGS),
        *rows("encoder", "encoder/layer_{i}/", "{base}encoder.layer.{i}.", "bert/encoder/layer_{i}/", LAYER),
        *heads(*_HEADS),
    ),
    hf_tied={
        "cls.predictions.decoder.weight": "{base}embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    },
    hf_classes={"sentence_head": "BertForPreTraining", "mlm_head": "BertForMaskedLM", None: "BertModel"},
    tf_config_file="bert_config.json",
    layout="bert sharing='none' without factorization",
)
