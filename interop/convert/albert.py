"""ALBERT: HF model_type "albert" and google-research/albert's TF1 checkpoints
(albert_config.json, model.ckpt-*, 30k-clean.model): one layer shared by all
(EncoderConfig.sharing = "all") and a factorized embedding (E != H); the tokenizer is
SentencePiece. Its "gelu" is the tanh approximation (google-research/albert modeling.py;
HF's albert configs say "gelu_new")."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from data import tokenizers
from interop.convert.bert import EMBEDDING_ROWS, EMBEDDINGS
from interop.convert.format import ModelFormat
from interop.convert.layout import (
    BIAS,
    CLASSIFIER,
    DENSE,
    HEADS_IN,
    HEADS_OUT,
    NORM,
    ConversionError,
    Module,
    heads,
    rows,
)
from models.encoder import EncoderConfig

# ALBERT's one shared layer (sharing="all"): ours under encoder/shared_layer/, HF under
# {base}encoder.albert_layer_groups.0.albert_layers.0., TF under
# bert/encoder/transformer/group_0/inner_group_0/.
_LAYER = (
    ("attention/query", HEADS_IN, "attention.query", "attention_1/self/query"),
    ("attention/key", HEADS_IN, "attention.key", "attention_1/self/key"),
    ("attention/value", HEADS_IN, "attention.value", "attention_1/self/value"),
    ("attention/output", HEADS_OUT, "attention.dense", "attention_1/output/dense"),
    ("attention_layer_norm", NORM, "attention.LayerNorm", "LayerNorm"),
    ("intermediate", DENSE, "ffn", "ffn_1/intermediate/dense"),
    ("output", DENSE, "ffn_output", "ffn_1/intermediate/output/dense"),
    ("output_layer_norm", NORM, "full_layer_layer_norm", "LayerNorm_1"),
)


def albert_options(fields: Mapping[str, Any], where: str, name: str) -> dict[str, Any]:
    """embedding_size and sharing of an ALBERT config; refuses what our encoder cannot express."""
    groups, inner = fields.get("num_hidden_groups", 1), fields.get("inner_group_num", 1)
    if (groups, inner) != (1, 1):
        raise ConversionError(
            f"{where}: {name} num_hidden_groups={groups}, inner_group_num={inner} is not supported: "
            "our encoder shares one layer across all layers (sharing='all'), i.e. 1 and 1"
        )
    embedding_size = fields.get("embedding_size", 128)
    if embedding_size == fields.get("hidden_size"):
        # Our encoder has no E -> H projection when E = H (as google-research/albert), HF always has one.
        raise ConversionError(
            f"{where}: {name} embedding_size = hidden_size = {embedding_size} is not supported: "
            "our encoder has no embedding projection then"
        )
    return {"embedding_size": embedding_size, "sharing": "all"}


@dataclasses.dataclass(frozen=True)
class AlbertFormat(ModelFormat):
    tokenizer_class: type = tokenizers.SentencePieceTokenizer

    def describes(self, config: EncoderConfig) -> bool:
        return config.sharing == "all" and config.factorized_embedding and config.position_offset == 0

    def hf_options(self, hf: Mapping[str, Any], where: str) -> dict[str, Any]:
        return albert_options(hf, where, "config.json")

    def tf_options(self, tf_config: Mapping[str, Any], where: str) -> dict[str, Any]:
        return albert_options(tf_config, where, self.tf_config_file)

    def has_tokenizer_files(self, directory: str) -> bool:
        return any(n.endswith(".model") for n in os.listdir(directory))

    def read_tokenizer(self, directory: str, settings: Mapping[str, Any], where: str) -> tokenizers.Tokenizer:
        """spiece.model, or the one *.model (the TF release's 30k-clean.model)."""
        candidates = sorted(n for n in os.listdir(directory) if n.endswith(".model"))
        if tokenizers.SP_MODEL_FILE in candidates:
            candidates = [tokenizers.SP_MODEL_FILE]
        if len(candidates) != 1:
            raise ConversionError(
                f"{where}: {'no' if not candidates else 'more than one'} SentencePiece *.model: an ALBERT "
                "folder needs exactly one (spiece.model, or the TF release's 30k-clean.model)"
            )
        return self.tokenizer_class.from_model_file(
            os.path.join(directory, candidates[0]), lowercase=settings.get("do_lower_case", True)
        )

    def hf_config_keys(self, config: EncoderConfig, groups: set[str]) -> dict[str, Any]:
        return {"embedding_size": config.embedding_width, "num_hidden_groups": 1, "inner_group_num": 1}


ALBERT = AlbertFormat(
    model_type="albert",
    hf_base="albert.",
    table=(
        *rows(*EMBEDDING_ROWS, EMBEDDINGS),
        Module(
            "encoder",
            "encoder/embedding_projection",
            DENSE,
            "{base}encoder.embedding_hidden_mapping_in",
            "bert/encoder/embedding_hidden_mapping_in",
        ),
        *rows(
            "encoder",
            "encoder/shared_layer/",
            "{base}encoder.albert_layer_groups.0.albert_layers.0.",
            "bert/encoder/transformer/group_0/inner_group_0/",
            _LAYER,
        ),
        *heads(
            ("pooler", "encoder/pooler", DENSE, "{base}pooler", "bert/pooler/dense"),
            ("mlm_head", "mlm_head/transform", DENSE, "predictions.dense", "cls/predictions/transform/dense"),
            (
                "mlm_head",
                "mlm_head/transform_layer_norm",
                NORM,
                "predictions.LayerNorm",
                "cls/predictions/transform/LayerNorm",
            ),
            ("mlm_head", "mlm_head/output_bias", BIAS, "predictions.bias", "cls/predictions/output_bias"),
            (
                "sentence_head",
                "sentence_head/classifier",
                CLASSIFIER,
                "sop_classifier.classifier",
                "cls/seq_relationship",
            ),
        ),
    ),
    hf_tied={
        "predictions.decoder.weight": "{base}embeddings.word_embeddings.weight",
        "predictions.decoder.bias": "predictions.bias",
    },
    hf_classes={
        "sentence_head": "AlbertForPreTraining",
        "mlm_head": "AlbertForMaskedLM",
        None: "AlbertModel",
    },
    tf_config_file="albert_config.json",
    tf_activation="gelu_tanh",
    layout="albert sharing='all' with embedding_size != hidden_size",
)
