"""Checkpoint import and export: Hugging Face folders and original TF1 checkpoints <-> our workdirs.

    python -m models.convert import --from=hf:DIR --workdir=OUT   # config.json + model.safetensors
    python -m models.convert import --from=tf:DIR --workdir=OUT   # {bert,albert}_config.json + model.ckpt
    python -m models.convert export --workdir=W --to=hf:OUT
    # ELECTRA: the discriminator (ElectraForPreTraining) and, optionally, the generator
    # (ElectraForMaskedLM), published as two folders, are one workdir here
    python -m models.convert import --from=hf:DISC --generator_from=hf:GEN --workdir=OUT
    python -m models.convert export --workdir=W --to=hf:DISC --generator_to=hf:GEN

Families: HF model_type bert, roberta, albert, electra, deberta and deberta-v2 (DeBERTa-v2
and v3); TF1 checkpoints of google-research/bert and google-research/albert. A config.json
without model_type (old pytorch-pretrained-bert folders, e.g. SpanBERT's published
checkpoints) is read as BERT when its keys and weight names are BERT's. SpanBERT's span
boundary (SBO) head has no transformers counterpart: an export writes the BERT parts and
leaves it out, with a warning. An imported workdir is what
`models.pretrained.load_pretrained` reads (model_config.json, tokenizer/, checkpoints/0/state),
so `finetune.glue --init_checkpoint`, `models.encode` and `models.predict` take it as it is.
`converted_from.json` beside it records the source and which optional parts (pooler, MLM
head, NSP/SOP head, ELECTRA's discriminator head and generator, DeBERTa-v3's RTD head) the
source had; parts it lacked are left out of the parameters rather than filled with random
values.

ELECTRA (models/electra.py): the workdir's `encoder` + `discriminator_head` are the
discriminator; `generator` + `generator_head` the generator, which reads the discriminator's
embedding block. A published generator folder holds its own copy of that block: the import
keeps the discriminator's (and warns if the copies differ), the export writes the copy.
model_config.json is the discriminator's; the generator's shape is read from its parameters
(models.pretrained.electra_generator). With a generator only hidden_act='gelu' converts:
transformers' generator head applies the exact GELU whatever the config says.

DeBERTa (models/deberta.py; `EncoderConfig.disentangled` from config.json's relative-attention
keys): v1's fused in_proj is split into our query/key/value; the MLM head is read under
transformers' legacy=False names (lm_predictions.lm_head.*, the original's checkpoints) or
legacy=True ones (cls.predictions.*) and written as legacy=False (with tie_word_embeddings
false, which transformers 5.18 needs to load it: that head reads the word table itself), or
legacy=True when E != H, which only that head expresses. The absolute position table, which
transformers keeps only with position_biased_input, is imported when the file has it (the
enhanced mask decoder reads it) and exported when the tree has it (transformers ignores it
unless position_biased_input, as it does in the original's checkpoints). DeBERTa-v3's
replaced-token-detection head (`rtd_head`, HF mask_predictions.*, which no transformers
class reads) is imported and exported when present. Options our encoder lacks (talking
heads, p2p attention, grouped convolutions, ...) are refused on import; a pooler is refused
on export.

Parameter names map one-to-one by the tables below (`BERT`, `ROBERTA`, `ALBERT`, `ELECTRA`,
`ELECTRA_GENERATOR`, `DEBERTA`, `DEBERTA_V2`): one row per module, with our path, its HF
name ("{base}" = the `bert.` / `roberta.` / `albert.` / `electra.` / `deberta.` prefix that
HF models with heads put before the encoder) and its TF1 name. `{i}` is the layer index;
ALBERT's one shared layer is `encoder/shared_layer` (EncoderConfig.sharing = "all"). How a
module's arrays are laid out differs by framework:

    ours             HF (torch)                 TF1
    dense kernel     [in, out]                  weight [out, in]          kernel [in, out]
    q/k/v kernel     [H, N, D]                  weight [N*D, H]           kernel [H, N*D]
    attn out kernel  [N, D, H]                  weight [H, N*D]           kernel [N*D, H]
    q/k/v bias       [N, D]                     bias [N*D]                bias [N*D]
    LayerNorm        scale, bias                weight, bias              gamma, beta
    NSP/SOP head     kernel [H, 2]              weight [2, H]             output_weights [2, H]
    DeBERTa conv     kernel [K, H_in, H_out]    weight [H_out, H_in, K]
    DeBERTa v1 q/k/v 3 kernels [H, N, D]        in_proj.weight [3*N*D, H], rows [q_n; k_n; v_n] per head n

The MLM decoder is tied to the word embeddings everywhere, so it has no row: an HF file that
stores it must hold a copy of the embeddings (an untied decoder is refused).

Weights are read without torch: `model.safetensors` (or a sharded `model.safetensors.index.json`)
through safetensors' NumPy API; only a folder that has nothing but `pytorch_model.bin`
needs torch. TF checkpoints are read with `tf.train.load_checkpoint`.

Tokenizers: BERT's WordPiece, RoBERTa's byte-level BPE and ALBERT's SentencePiece (the
backends of data/tokenizers.py) are imported into the workdir's tokenizer/ and exported
with the tokenizer_config.json keys transformers reads.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import tensorflow as tf
from flax import traverse_util

from core import cli
from core import workdir as workdir_lib
from core.errors import UserError
from data import tokenizers
from models import pretrained as pretrained_lib
from models.deberta_rtd import RTDHead
from models.disentangled import DisentangledConfig
from models.electra import DiscriminatorHead
from models.encoder import EncoderConfig
from models.pretraining import abstract_params, resize_vocab_rows

log = logging.getLogger("convert")

CONVERTED_FROM = "converted_from.json"
# Optional parts of a published model, each all-or-nothing: BertModel has no heads,
# BertForMaskedLM no pooler and no NSP head, BertForPreTraining everything. ELECTRA's
# discriminator head comes with ElectraForPreTraining, its generator (the top-level
# `generator` and `generator_head`) from a second folder, an ElectraForMaskedLM.
# DeBERTa-v3's replaced-token-detection head (`rtd_head`) is in the original's checkpoints
# (mask_predictions.*) though no transformers class reads it.
OPTIONAL_GROUPS = ("pooler", "mlm_head", "sentence_head", "discriminator_head", "generator", "rtd_head")
# The top-level subtrees of an ELECTRA tree that are its generator.
GENERATOR_PARTS = ("generator", "generator_head")
# Top-level subtrees of our pretraining trees that no transformers class has: an export
# writes the rest of the model and leaves these out with a warning. SpanBERT's span boundary
# objective head exists only in pretraining (facebookresearch/SpanBERT's releases drop it too).
NOT_EXPORTED = {"sbo_head": "the span boundary (SBO) head"}


class ConversionError(UserError):
    """A checkpoint, config or tokenizer that cannot be converted (one line, user-facing)."""


# --- the name tables ---------------------------------------------------------------

# Module kinds: how a module's parameters are named and laid out (see the module docstring).
EMBED = "embed"  # ours: embedding [rows, H]
DENSE = "dense"  # ours: kernel [in, out], bias [out]
HEADS_IN = "heads_in"  # q/k/v projection, ours: kernel [H, N, D], bias [N, D]
HEADS_OUT = "heads_out"  # attention output projection, ours: kernel [N, D, H], bias [H]
NORM = "norm"  # ours: scale, bias
BIAS = "bias"  # a lone vector (the MLM output bias)
CLASSIFIER = "classifier"  # DENSE, but TF names it output_weights [out, in] / output_bias
KERNEL = "kernel"  # DENSE without a bias (DeBERTa's embed_proj, v1's pos_proj)
# DeBERTa v1's query/key/value: one HF `in_proj.weight` [3*N*D, H] (no bias) holding head n's
# query, key and value rows at n*3D + {0, D, 2D} + d, and separate `q_bias`, `v_bias` [N*D]
# (the key has no bias). Ours: attention/{query, key, value}/kernel [H, N, D], query and
# value bias [N, D].
FUSED_QKV = "fused_qkv"
CONV1D = "conv1d"  # DeBERTa-v2's convolution, ours: kernel [K, H_in, H_out]; torch [H_out, H_in, K]


@dataclasses.dataclass(frozen=True)
class Module:
    """One row of a name table.

    ours: path in the PretrainingModel parameter tree; hf: name in an HF state dict,
    where "{base}" stands for the encoder prefix ("bert." in models with heads, "" in
    BertModel); tf: variable name in the original TF checkpoint (None: the family has
    none, e.g. RoBERTa). "{i}" is the layer index.
    """

    group: str  # "encoder" (required) or one of OPTIONAL_GROUPS
    ours: str
    kind: str
    hf: str
    tf: str | None


def _rows(group: str, ours: str, hf: str, tf_: str | None, rows) -> list[Module]:
    """Modules from (our suffix, kind, HF suffix[, TF suffix]) rows under common prefixes."""
    return [
        Module(group, ours + o, kind, hf + h, None if tf_ is None else tf_ + t[0]) for o, kind, h, *t in rows
    ]


# Embeddings of all three families: ours under encoder/embeddings/, HF under {base}embeddings.,
# TF under bert/embeddings/ (google-research/bert and /albert modeling.py). ALBERT's are E wide.
_EMBEDDINGS = (
    ("word_embeddings", EMBED, "word_embeddings", "word_embeddings"),
    ("position_embeddings", EMBED, "position_embeddings", "position_embeddings"),
    ("token_type_embeddings", EMBED, "token_type_embeddings", "token_type_embeddings"),
    ("layer_norm", NORM, "LayerNorm", "LayerNorm"),
)
# A BERT / RoBERTa layer: ours under encoder/layer_{i}/, HF under {base}encoder.layer.{i}.,
# TF under bert/encoder/layer_{i}/.
_BERT_LAYER = (
    ("attention/query", HEADS_IN, "attention.self.query", "attention/self/query"),
    ("attention/key", HEADS_IN, "attention.self.key", "attention/self/key"),
    ("attention/value", HEADS_IN, "attention.self.value", "attention/self/value"),
    ("attention/output", HEADS_OUT, "attention.output.dense", "attention/output/dense"),
    ("attention_layer_norm", NORM, "attention.output.LayerNorm", "attention/output/LayerNorm"),
    ("intermediate", DENSE, "intermediate.dense", "intermediate/dense"),
    ("output", DENSE, "output.dense", "output/dense"),
    ("output_layer_norm", NORM, "output.LayerNorm", "output/LayerNorm"),
)
# ALBERT's one shared layer (sharing="all"): ours under encoder/shared_layer/, HF under
# {base}encoder.albert_layer_groups.0.albert_layers.0., TF under
# bert/encoder/transformer/group_0/inner_group_0/.
_ALBERT_LAYER = (
    ("attention/query", HEADS_IN, "attention.query", "attention_1/self/query"),
    ("attention/key", HEADS_IN, "attention.key", "attention_1/self/key"),
    ("attention/value", HEADS_IN, "attention.value", "attention_1/self/value"),
    ("attention/output", HEADS_OUT, "attention.dense", "attention_1/output/dense"),
    ("attention_layer_norm", NORM, "attention.LayerNorm", "LayerNorm"),
    ("intermediate", DENSE, "ffn", "ffn_1/intermediate/dense"),
    ("output", DENSE, "ffn_output", "ffn_1/intermediate/output/dense"),
    ("output_layer_norm", NORM, "full_layer_layer_norm", "LayerNorm_1"),
)
# The heads: (group, our path, kind, HF name, TF name), full names.
_BERT_HEADS = (
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
_ROBERTA_HEADS = (
    ("pooler", "encoder/pooler", DENSE, "{base}pooler.dense", None),
    ("mlm_head", "mlm_head/transform", DENSE, "lm_head.dense", None),
    ("mlm_head", "mlm_head/transform_layer_norm", NORM, "lm_head.layer_norm", None),
    ("mlm_head", "mlm_head/output_bias", BIAS, "lm_head.bias", None),
)
_ALBERT_HEADS = (
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
)
# ELECTRA's heads (HF ElectraDiscriminatorPredictions, ElectraGeneratorPredictions and
# generator_lm_head), the generator's as the mlm_head of its standalone tree (see ELECTRA_GENERATOR).
_ELECTRA_HEADS = (
    ("discriminator_head", "discriminator_head/dense", DENSE, "discriminator_predictions.dense", None),
    (
        "discriminator_head",
        "discriminator_head/prediction",
        DENSE,
        "discriminator_predictions.dense_prediction",
        None,
    ),
)
_ELECTRA_GENERATOR_HEADS = (
    ("mlm_head", "mlm_head/transform", DENSE, "generator_predictions.dense", None),
    ("mlm_head", "mlm_head/transform_layer_norm", NORM, "generator_predictions.LayerNorm", None),
    ("mlm_head", "mlm_head/output_bias", BIAS, "generator_lm_head.bias", None),
)
_EMBEDDING_ROWS = ("encoder", "encoder/embeddings/", "{base}embeddings.", "bert/embeddings/")


@dataclasses.dataclass(frozen=True)
class ModelFormat:
    """How one published model family is laid out in HF and TF checkpoints."""

    model_type: str  # HF config.json `model_type`
    hf_base: str  # the encoder prefix in HF models with heads
    table: tuple[Module, ...]
    # HF names that duplicate a tied parameter: stored copy -> the name it must equal.
    hf_tied: Mapping[str, str]
    # HF class for config.json's "architectures" by head, the class with the most heads
    # first; under None the bare model's. A None class: transformers has no such model.
    hf_classes: Mapping[str | None, str | None]
    # Older HF names of the table's arrays, (old prefix, the table's prefix), the most specific
    # first: imports read either (DeBERTa's legacy=True MLM head, `cls.predictions.*`).
    hf_renamed: tuple[tuple[str, str], ...] = ()

    def hf_architecture(self, groups: set[str]) -> str | None:
        """The HF class with exactly these heads (None: transformers has none, e.g. RoBERTa
        with a sentence head)."""
        return next(cls for head, cls in self.hf_classes.items() if head is None or head in groups)


BERT = ModelFormat(
    model_type="bert",
    hf_base="bert.",
    table=(
        *_rows(*_EMBEDDING_ROWS, _EMBEDDINGS),
        *_rows(
            "encoder",
            "encoder/layer_{i}/",
            "{base}encoder.layer.{i}.",
            "bert/encoder/layer_{i}/",
            _BERT_LAYER,
        ),
        *(Module(*row) for row in _BERT_HEADS),
    ),
    hf_tied={
        "cls.predictions.decoder.weight": "{base}embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    },
    hf_classes={"sentence_head": "BertForPreTraining", "mlm_head": "BertForMaskedLM", None: "BertModel"},
)
# fairseq's RoBERTa has no TF checkpoints, and no sentence head (no NSP).
ROBERTA = ModelFormat(
    model_type="roberta",
    hf_base="roberta.",
    table=(
        *_rows("encoder", "encoder/embeddings/", "{base}embeddings.", None, _EMBEDDINGS),
        *_rows("encoder", "encoder/layer_{i}/", "{base}encoder.layer.{i}.", None, _BERT_LAYER),
        *(Module(*row) for row in _ROBERTA_HEADS),
    ),
    hf_tied={
        "lm_head.decoder.weight": "{base}embeddings.word_embeddings.weight",
        "lm_head.decoder.bias": "lm_head.bias",
    },
    hf_classes={"sentence_head": None, "mlm_head": "RobertaForMaskedLM", None: "RobertaModel"},
)
ALBERT = ModelFormat(
    model_type="albert",
    hf_base="albert.",
    table=(
        *_rows(*_EMBEDDING_ROWS, _EMBEDDINGS),
        Module(
            "encoder",
            "encoder/embedding_projection",
            DENSE,
            "{base}encoder.embedding_hidden_mapping_in",
            "bert/encoder/embedding_hidden_mapping_in",
        ),
        *_rows(
            "encoder",
            "encoder/shared_layer/",
            "{base}encoder.albert_layer_groups.0.albert_layers.0.",
            "bert/encoder/transformer/group_0/inner_group_0/",
            _ALBERT_LAYER,
        ),
        *(Module(*row) for row in _ALBERT_HEADS),
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
)
# ELECTRA's encoder (HF ElectraModel): BERT's with an E -> H projection, `embeddings_project`,
# which exists only when E != H (the rows of arrays a config lacks are skipped). No pooler,
# no TF1 names (google-research/electra's checkpoints are not read).
_ELECTRA_ENCODER = (
    *_rows("encoder", "encoder/embeddings/", "{base}embeddings.", None, _EMBEDDINGS),
    Module("encoder", "encoder/embedding_projection", DENSE, "{base}embeddings_project", None),
    *_rows("encoder", "encoder/layer_{i}/", "{base}encoder.layer.{i}.", None, _BERT_LAYER),
)
# The discriminator: our `encoder` and `discriminator_head`.
ELECTRA = ModelFormat(
    model_type="electra",
    hf_base="electra.",
    table=(*_ELECTRA_ENCODER, *(Module(*row) for row in _ELECTRA_HEADS)),
    hf_tied={},
    hf_classes={"discriminator_head": "ElectraForPreTraining", None: "ElectraModel"},
)
# The generator, as the standalone masked-LM tree of models.pretrained.electra_generator
# (encoder = the shared embeddings + the generator's projection and layers, mlm_head =
# generator_head): the layout of an ElectraForMaskedLM folder.
ELECTRA_GENERATOR = ModelFormat(
    model_type="electra",
    hf_base="electra.",
    table=(*_ELECTRA_ENCODER, *(Module(*row) for row in _ELECTRA_GENERATOR_HEADS)),
    hf_tied={"generator_lm_head.weight": "{base}embeddings.word_embeddings.weight"},
    hf_classes={"mlm_head": "ElectraForMaskedLM", None: "ElectraModel"},
)
# DeBERTa (models/deberta.py; HF modeling_deberta{,_v2}.py). Embeddings: BERT's rows and the
# E -> H projection, which has no bias. The position table exists in HF only with
# position_biased_input; our pretraining tree has it for the enhanced mask decoder (see
# `_optional_arrays`).
# The encoder's own arrays: ours under encoder/, HF under {base}encoder.: the relative table
# shared by all layers, its LayerNorm (v2 norm_rel_ebd) and v2's convolution after layer 0.
_DEBERTA_ENCODER = (
    ("rel_embeddings", EMBED, "rel_embeddings"),
    ("rel_layer_norm", NORM, "LayerNorm"),
    ("conv", CONV1D, "conv.conv"),
    ("conv/layer_norm", NORM, "conv.LayerNorm"),
)
# A layer: ours under encoder/layer_{i}/, HF under {base}encoder.layer.{i}.; pos_key /
# pos_query exist only without share_att_key (and only for the terms of pos_att_type); the
# rest (attention output, FFN, LayerNorms) is BERT's.
_DEBERTA_LAYER_REST = _BERT_LAYER[3:]
_DEBERTA_V2_LAYER = (
    ("attention/query", HEADS_IN, "attention.self.query_proj"),
    ("attention/key", HEADS_IN, "attention.self.key_proj"),
    ("attention/value", HEADS_IN, "attention.self.value_proj"),
    ("attention/pos_key", HEADS_IN, "attention.self.pos_key_proj"),
    ("attention/pos_query", HEADS_IN, "attention.self.pos_query_proj"),
    *_DEBERTA_LAYER_REST,
)
# v1: the fused in_proj (+ q_bias, v_bias; no key bias), pos_proj without a bias (c2p),
# pos_q_proj with one (p2c).
_DEBERTA_V1_LAYER = (
    ("attention", FUSED_QKV, "attention.self"),
    ("attention/pos_key", KERNEL, "attention.self.pos_proj"),
    ("attention/pos_query", HEADS_IN, "attention.self.pos_q_proj"),
    *_DEBERTA_LAYER_REST,
)
# The heads: the MLM head under HF's legacy=False names (the original's checkpoints; a
# legacy=True folder's cls.predictions.* are read too, `DEBERTA_V2.hf_renamed`), and
# DeBERTa-v3's replaced-token-detection head, which HF has no class for (DebertaV2ForMaskedLM
# ignores mask_predictions.* on load): LayerNorm(h + h_CLS) -> dense -> act -> classifier
# H -> 1 (the original's replaced_token_detection_model.py).
_DEBERTA_HEADS = (
    ("mlm_head", "mlm_head/transform", DENSE, "lm_predictions.lm_head.dense", None),
    ("mlm_head", "mlm_head/transform_layer_norm", NORM, "lm_predictions.lm_head.LayerNorm", None),
    ("mlm_head", "mlm_head/output_bias", BIAS, "lm_predictions.lm_head.bias", None),
    ("rtd_head", "rtd_head/layer_norm", NORM, "mask_predictions.LayerNorm", None),
    ("rtd_head", "rtd_head/dense", DENSE, "mask_predictions.dense", None),
    ("rtd_head", "rtd_head/classifier", DENSE, "mask_predictions.classifier", None),
)
# HF's legacy=True MLM head (the default of DebertaForMaskedLM / DebertaV2ForMaskedLM): a BERT
# head of the same arrays (its dense is H -> E, as ours; the legacy=False dense is H -> H, so
# a model with E != H has only this form).
_DEBERTA_LEGACY_HEAD = (  # the most specific pair first: renaming takes the first match
    ("cls.predictions.bias", "lm_predictions.lm_head.bias"),
    ("cls.predictions.transform.", "lm_predictions.lm_head."),
)
_DEBERTA_TIED = {
    "lm_predictions.lm_head.weight": "{base}embeddings.word_embeddings.weight",
    "cls.predictions.decoder.weight": "{base}embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}


def _deberta_table(layer: tuple) -> tuple[Module, ...]:
    """The table of a DeBERTa version with its `layer` rows (no TF1 names)."""
    return (
        *_rows("encoder", "encoder/embeddings/", "{base}embeddings.", None, _EMBEDDINGS),
        Module(
            "encoder", "encoder/embeddings/embedding_projection", KERNEL, "{base}embeddings.embed_proj", None
        ),
        *_rows("encoder", "encoder/", "{base}encoder.", None, _DEBERTA_ENCODER),
        *_rows("encoder", "encoder/layer_{i}/", "{base}encoder.layer.{i}.", None, layer),
        *(Module(*row) for row in _DEBERTA_HEADS),
    )


# DeBERTa (v1): HF model_type "deberta".
DEBERTA = ModelFormat(
    model_type="deberta",
    hf_base="deberta.",
    table=_deberta_table(_DEBERTA_V1_LAYER),
    hf_tied=_DEBERTA_TIED,
    hf_classes={"mlm_head": "DebertaForMaskedLM", None: "DebertaModel"},
    hf_renamed=_DEBERTA_LEGACY_HEAD,
)
# DeBERTa-v2 and v3 (the same architecture; v3 differs in pretraining): "deberta-v2".
DEBERTA_V2 = ModelFormat(
    model_type="deberta-v2",
    hf_base="deberta.",
    table=_deberta_table(_DEBERTA_V2_LAYER),
    hf_tied=_DEBERTA_TIED,
    hf_classes={"mlm_head": "DebertaV2ForMaskedLM", None: "DebertaV2Model"},
    hf_renamed=_DEBERTA_LEGACY_HEAD,
)
DEBERTA_FORMATS = (DEBERTA, DEBERTA_V2)
# By config.json's model_type; an ELECTRA folder is read as the discriminator.
FORMATS = {f.model_type: f for f in (BERT, ROBERTA, ALBERT, ELECTRA, DEBERTA, DEBERTA_V2)}


# --- one parameter: names and layouts -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Param:
    """One array: our path, its name in the other framework, and how it is laid out there.

    layout: "table" (same shape), "vector" (flattened), "in_out" (2-D kernel [in, out]),
    "out_in" (2-D kernel [out, in]), "reversed" (axes in reverse order: torch's Conv1d
    weight [H_out, H_in, K] for our [K, H_in, H_out]) or "fused_qkv" (our [H, N, D] kernel is
    part `part` (0 query, 1 key, 2 value) of DeBERTa v1's in_proj.weight [3*N*D, H], whose
    rows are [q_n; k_n; v_n] per head n); in_axes: how many leading axes of ours form `in`.
    """

    group: str
    ours: tuple[str, ...]
    theirs: str
    layout: str
    in_axes: int = 1
    part: int = 0

    def their_shape(self, our_shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.layout == "table":
            return tuple(our_shape)
        if self.layout == "vector":
            return (math.prod(our_shape),)
        if self.layout == "reversed":
            return tuple(our_shape)[::-1]
        if self.layout == "fused_qkv":
            hidden, heads, head_dim = our_shape
            return (3 * heads * head_dim, hidden)
        shape = (math.prod(our_shape[: self.in_axes]), math.prod(our_shape[self.in_axes :]))
        return shape if self.layout == "in_out" else shape[::-1]

    def to_ours(self, array: np.ndarray, our_shape: tuple[int, ...]) -> np.ndarray:
        if self.layout == "reversed":
            array = np.transpose(array)
        elif self.layout == "fused_qkv":
            hidden, heads, head_dim = our_shape
            # [N, 3, D, H][:, part] = this projection's [N, D, H] -> [H, N, D]
            array = array.reshape(heads, 3, head_dim, hidden)[:, self.part].transpose(2, 0, 1)
        elif self.layout == "out_in":
            array = array.T
        return np.ascontiguousarray(array.reshape(our_shape), dtype=np.float32)

    def to_theirs(self, array: np.ndarray, into: np.ndarray | None = None) -> np.ndarray:
        """Their array of ours. A "fused_qkv" part is written into `into` (the fused array of
        the parts converted so far; None: zeros), which is returned."""
        array = np.asarray(array, np.float32)
        shape = self.their_shape(array.shape)
        if self.layout == "reversed":
            return np.ascontiguousarray(np.transpose(array))
        if self.layout == "fused_qkv":
            hidden, heads, head_dim = array.shape
            fused = np.zeros(shape, np.float32) if into is None else np.array(into, np.float32)
            fused.reshape(heads, 3, head_dim, hidden)[:, self.part] = array.transpose(1, 2, 0)
            return fused
        if self.layout == "out_in":  # [in, out] first, then transposed
            return np.ascontiguousarray(array.reshape(shape[::-1]).T)
        return np.ascontiguousarray(array.reshape(shape))


def expand(fmt: ModelFormat, framework: str, num_layers: int, hf_base: str = "") -> list[Param]:
    """The table of `fmt` as one `Param` per array, for "hf" or "tf", layers 0..num_layers-1."""
    params = []
    for module in fmt.table:
        indices = range(num_layers) if "{i}" in module.ours else [None]
        for i in indices:
            ours = module.ours.format(i=i)
            name = module.hf if framework == "hf" else module.tf
            if name is None:
                raise ConversionError(f"{fmt.model_type} has no {framework.upper()} checkpoints")
            name = name.format(i=i, base=hf_base)
            params.extend(_module_params(module.group, module.kind, tuple(ours.split("/")), name, framework))
    return params


def _module_params(group: str, kind: str, ours: tuple[str, ...], name: str, framework: str) -> list[Param]:
    hf = framework == "hf"
    join = (lambda leaf: f"{name}.{leaf}") if hf else (lambda leaf: f"{name}/{leaf}")
    if kind == EMBED:
        return [Param(group, (*ours, "embedding"), join("weight") if hf else name, "table")]
    if kind == BIAS:
        return [Param(group, ours, name, "vector")]
    if kind == NORM:
        return [
            Param(group, (*ours, "scale"), join("weight" if hf else "gamma"), "vector"),
            Param(group, (*ours, "bias"), join("bias" if hf else "beta"), "vector"),
        ]
    if kind == KERNEL:
        return [Param(group, (*ours, "kernel"), join("weight"), "out_in")]
    if kind == CONV1D:
        return [
            Param(group, (*ours, "kernel"), join("weight"), "reversed"),
            Param(group, (*ours, "bias"), join("bias"), "vector"),
        ]
    if kind == FUSED_QKV:  # ours: the attention module; name: HF's attention.self
        kernels = [
            Param(group, (*ours, proj, "kernel"), join("in_proj.weight"), "fused_qkv", part=part)
            for part, proj in enumerate(("query", "key", "value"))
        ]
        return [
            *kernels,
            Param(group, (*ours, "query", "bias"), join("q_bias"), "vector"),
            Param(group, (*ours, "value", "bias"), join("v_bias"), "vector"),
        ]
    in_axes = 2 if kind == HEADS_OUT else 1
    if kind == CLASSIFIER and not hf:
        return [
            Param(group, (*ours, "kernel"), join("output_weights"), "out_in"),
            Param(group, (*ours, "bias"), join("output_bias"), "vector"),
        ]
    return [
        Param(
            group,
            (*ours, "kernel"),
            join("weight" if hf else "kernel"),
            "out_in" if hf else "in_out",
            in_axes,
        ),
        Param(group, (*ours, "bias"), join("bias"), "vector"),
    ]


# DeBERTa's absolute position table: in HF only with position_biased_input; in our pretraining
# tree also for the enhanced mask decoder, which adds it to the decoder's queries.
DEBERTA_POSITION_TABLE = ("encoder", "embeddings", "position_embeddings", "embedding")


def our_shapes(config: EncoderConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
    """Shape of every array a file of `config`'s family may hold, in our tree. Allocates nothing.

    BERT, RoBERTa, ALBERT: the full PretrainingModel (pooler, NSP head); ELECTRA (classifier
    head 'electra'): plus the discriminator head; DeBERTa (`disentangled` set): the MLM model
    without pooler and sentence head (transformers' DeBERTa has neither: its ContextPooler is a
    fine-tuning head), plus the absolute position table [max positions, E] (`_optional_arrays`)
    and DeBERTa-v3's RTD head `rtd_head` (models/deberta_rtd.py: layer_norm [H]; dense,
    classifier kernels H -> H, H -> 1)."""
    deberta = config.disentangled is not None
    tree = nn.meta.unbox(
        abstract_params(dataclasses.replace(config, pooler=not deberta), sentence_head=not deberta)
    )
    head = ("rtd_head", RTDHead) if deberta else ("discriminator_head", DiscriminatorHead)
    if deberta or config.classifier_head == "electra":
        hidden = jax.ShapeDtypeStruct((1, 1, config.hidden_size), jnp.float32)
        params = jax.eval_shape(head[1](config).init, jax.random.key(0), hidden)["params"]
        tree = {**tree, head[0]: nn.meta.unbox(params)}
    shapes = {path: tuple(x.shape) for path, x in traverse_util.flatten_dict(tree).items()}
    if deberta:
        shapes.setdefault(DEBERTA_POSITION_TABLE, (config.max_position_embeddings, config.embedding_width))
    return shapes


def _optional_arrays(fmt: ModelFormat, config: EncoderConfig) -> set[tuple[str, ...]]:
    """Arrays of the encoder that a file of `fmt` may lack, in which case our tree lacks
    them too (absent rather than random): DeBERTa's position table when the input is not
    position-biased (HF then drops it; the original's checkpoints keep it for the EMD)."""
    if fmt in DEBERTA_FORMATS and not config.disentangled.position_biased_input:
        return {DEBERTA_POSITION_TABLE}
    return set()


# --- building our parameters from theirs --------------------------------------------


@dataclasses.dataclass
class Imported:
    """A converted model, ready for `write_workdir`.

    params: the PretrainingModel tree as float32 NumPy arrays, without the optional
    groups the source lacked; groups: the optional groups present.
    """

    model_type: str
    config: EncoderConfig
    params: dict[str, Any]
    tokenizer: tokenizers.Tokenizer
    groups: list[str]
    source: str


def build_params(
    params_spec: list[Param],
    read: Callable[[str], np.ndarray],
    names: set[str],
    config: EncoderConfig,
    where: str,
    what: str,
    config_name: str,
) -> tuple[dict[str, Any], list[str], set[str]]:
    """Our parameter tree from a checkpoint's arrays.

    Args:
      params_spec: `expand(...)`; read: name -> array; names: every name in the source.
      where: the source in error messages ("hf:DIR"); what: "tensor" or "variable";
      config_name: the config file the shapes came from ("config.json").
    Returns:
      (nested params, optional groups present, the source names used).
    Raises:
      ConversionError: a required array is missing or has the wrong shape.
    """
    shapes = our_shapes(config)
    by_group: dict[str, list[Param]] = {}
    # Rows of arrays this config does not have (ELECTRA's embeddings_project when E = H).
    for p in (p for p in params_spec if p.ours in shapes):
        by_group.setdefault(p.group, []).append(p)
    flat, groups, used = {}, [], set()
    for group, members in by_group.items():
        present = [p for p in members if p.theirs in names]
        if group != "encoder" and not present:
            continue
        for p in members:
            if p.theirs not in names:
                raise ConversionError(
                    f"{where}: the checkpoint has no {what} '{p.theirs}' (for our {'/'.join(p.ours)}): "
                    f"is {config_name} the config of this checkpoint?"
                )
            array = read(p.theirs)
            expected = p.their_shape(shapes[p.ours])
            if tuple(array.shape) != expected:
                raise ConversionError(
                    f"{where}: {what} '{p.theirs}' has shape {tuple(array.shape)} but {config_name} "
                    f"implies {expected}: the weights do not belong to this config"
                )
            flat[p.ours] = p.to_ours(np.asarray(array), shapes[p.ours])
            used.add(p.theirs)
        if group != "encoder":
            groups.append(group)
    return traverse_util.unflatten_dict(flat), sorted(groups, key=OPTIONAL_GROUPS.index), used


# --- configs --------------------------------------------------------------------------

# HF `hidden_act` -> ours. gelu_new / gelu_pytorch_tanh are the tanh approximation.
_HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
_OUR_ACTIVATIONS_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new"}


def _read_json(path: str, where: str) -> dict:
    try:
        with tf.io.gfile.GFile(path) as f:
            value = json.load(f)
    except json.JSONDecodeError as e:
        raise ConversionError(f"{where}: {os.path.basename(path)} is not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise ConversionError(f"{where}: {os.path.basename(path)} is not a JSON object")
    return value


def _encoder_config(
    fields: Mapping[str, Any], hidden_act: str, where: str, name: str, **extra
) -> EncoderConfig:
    """EncoderConfig from the keys that HF and TF configs share (HF's names)."""
    try:
        return EncoderConfig(
            vocab_size=fields["vocab_size"],
            hidden_size=fields["hidden_size"],
            num_layers=fields["num_hidden_layers"],
            num_heads=fields["num_attention_heads"],
            intermediate_size=fields["intermediate_size"],
            max_position_embeddings=fields.get("max_position_embeddings", 512),
            type_vocab_size=fields.get("type_vocab_size", 2),
            dropout_rate=fields.get("hidden_dropout_prob", 0.1),
            attention_dropout_rate=fields.get("attention_probs_dropout_prob", 0.1),
            hidden_act=hidden_act,
            initializer_range=fields.get("initializer_range", 0.02),
            **extra,
        )
    except KeyError as e:
        raise ConversionError(f"{where}: {name} has no {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise ConversionError(f"{where}: {name}: {e}") from None


def _albert_options(fields: Mapping[str, Any], where: str, name: str) -> dict[str, Any]:
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


_NORM_REL_EBD = {"layer_norm": True, "none": False}


def _deberta_options(hf: Mapping[str, Any], model_type: str, where: str) -> dict[str, Any]:
    """The EncoderConfig fields of a DeBERTa config.json: `disentangled`, no pooler, the
    "deberta" classifier head, embedding_size when E != H. Absent keys take the value
    transformers gives them (its `getattr(config, key, default)`); v1 reads none of v2's
    keys (buckets, shared key, rel-LN, convolution), so they are ignored there. Refuses
    what our encoder cannot reproduce."""

    def refuse(key: str, why: str, default: Any = None) -> None:
        raise ConversionError(f"{where}: config.json {key}={hf.get(key, default)!r} is not supported: {why}")

    if not hf.get("relative_attention", False):
        why = "without relative attention this is not DeBERTa (our encoder always has it)"
        refuse("relative_attention", why, default=False)
    if hf.get("talking_head", False):
        refuse("talking_head", "talking-head attention (used by no published DeBERTa) is not implemented")
    hidden, heads = hf.get("hidden_size"), hf.get("num_attention_heads")
    if "attention_head_size" in hf and heads and hf["attention_head_size"] * heads != hidden:
        refuse(
            "attention_head_size", f"our heads are hidden_size / num_attention_heads = {hidden}/{heads} wide"
        )
    terms = hf.get("pos_att_type") or []
    if isinstance(terms, str):  # "p2c|c2p", as DebertaConfig splits it
        terms = [t.strip() for t in terms.lower().split("|")]
    if any(t not in ("c2p", "p2c") for t in terms) or len(set(terms)) != len(terms):
        refuse("pos_att_type", "only distinct 'c2p' and 'p2c' terms are implemented")
    max_relative = hf.get("max_relative_positions", -1)
    options: dict[str, Any] = {
        "version": 1,
        "position_buckets": 0,
        "max_relative_positions": max_relative if max_relative >= 1 else -1,
        "share_att_key": False,
        "norm_rel_ebd": False,
        "position_biased_input": hf.get("position_biased_input", True),
        "pos_att_type": tuple(terms),
    }
    if model_type == "deberta-v2":
        norm = str(hf.get("norm_rel_ebd", "none")).lower()
        if norm not in _NORM_REL_EBD:
            refuse("norm_rel_ebd", f"use one of {sorted(_NORM_REL_EBD)}")
        if hf.get("conv_kernel_size", 0) > 0:
            if hf.get("conv_groups", 1) != 1:
                refuse("conv_groups", "the convolution is implemented with 1 group only")
            if hf.get("conv_act", "tanh") not in ("gelu", "tanh"):
                refuse("conv_act", "use 'gelu' or 'tanh'")
        options.update(
            version=2,
            position_buckets=max(hf.get("position_buckets", -1), 0),
            share_att_key=hf.get("share_att_key", False),
            norm_rel_ebd=_NORM_REL_EBD[norm],
            conv_kernel_size=max(hf.get("conv_kernel_size", 0), 0),
            conv_act=hf.get("conv_act", "tanh"),
        )
    try:
        disentangled = DisentangledConfig(**options)
    except (TypeError, ValueError) as e:
        raise ConversionError(f"{where}: config.json: {e}") from None
    embedding_size = hf.get("embedding_size", hidden)
    return {
        "disentangled": disentangled,
        "embedding_size": None if embedding_size == hidden else embedding_size,
        "pooler": False,
        "classifier_head": "deberta",
    }


def _deberta_hf_config(config: EncoderConfig, groups: set[str]) -> dict[str, Any]:
    """The DeBERTa keys of an exported config.json (transformers reads the undeclared ones,
    position_buckets and the rest, with getattr). The MLM head is written under its
    legacy=False names (those of the original's checkpoints), except with E != H, which only
    the legacy=True head can express (`hf_model_files`).

    legacy=False goes with tie_word_embeddings=False: transformers 5.18 cannot load a
    legacy=False DebertaForMaskedLM / DebertaV2ForMaskedLM with tied embeddings (its tying
    looks for a parameter lm_predictions.lm_head.weight that the head does not have), and
    that head multiplies by the word table itself, so the flag changes nothing else.
    """
    opts = config.disentangled
    legacy = config.factorized_embedding and "mlm_head" in groups
    keys: dict[str, Any] = {
        "relative_attention": True,
        "max_relative_positions": opts.max_relative_positions,
        "position_biased_input": opts.position_biased_input,
        "pos_att_type": list(opts.pos_att_type),
        "legacy": legacy,
        "tie_word_embeddings": legacy,
        "pooler_hidden_act": _OUR_ACTIVATIONS_TO_HF[config.hidden_act],
    }
    if config.factorized_embedding:
        keys["embedding_size"] = config.embedding_width
    if opts.version == 2:
        keys.update(
            position_buckets=opts.position_buckets if opts.position_buckets else -1,
            share_att_key=opts.share_att_key,
            norm_rel_ebd="layer_norm" if opts.norm_rel_ebd else "none",
        )
        if opts.conv_kernel_size:
            keys.update(conv_kernel_size=opts.conv_kernel_size, conv_act=opts.conv_act, conv_groups=1)
    return keys


def hf_config_to_ours(hf: Mapping[str, Any], where: str) -> tuple[ModelFormat, EncoderConfig]:
    """EncoderConfig of an HF config.json; refuses model types and options we cannot reproduce."""
    model_type = hf.get("model_type")
    if model_type not in FORMATS:
        raise ConversionError(
            f"{where}: model_type {model_type!r} is not supported: this converter reads {', '.join(FORMATS)}"
        )
    refusals = {
        "position_embedding_type": ("absolute", "this encoder has learned absolute positions only"),
        "is_decoder": (False, "this is an encoder-only codebase"),
        "add_cross_attention": (False, "this is an encoder-only codebase"),
        "tie_word_embeddings": (True, "our MLM decoder is tied to the word embeddings"),
    }
    if FORMATS[model_type] in DEBERTA_FORMATS and hf.get("legacy", True) is False:
        # HF's legacy=False DeBERTa head multiplies by the word table itself whatever
        # tie_word_embeddings says (our exports write False: `_deberta_hf_config`).
        del refusals["tie_word_embeddings"]
    for key, (wanted, why) in refusals.items():
        if key in hf and hf[key] != wanted:
            raise ConversionError(f"{where}: config.json {key}={hf[key]!r} is not supported: {why}")
    act = hf.get("hidden_act", "gelu")
    if act not in _HF_ACTIVATIONS:
        raise ConversionError(
            f"{where}: config.json hidden_act={act!r} is not supported: use one of {sorted(_HF_ACTIVATIONS)}"
        )
    extra: dict[str, Any] = {"layer_norm_eps": hf.get("layer_norm_eps", 1e-12)}
    if FORMATS[model_type] in DEBERTA_FORMATS:
        # DebertaConfig's defaults for what a config.json may leave out.
        extra.update(_deberta_options(hf, model_type, where), layer_norm_eps=hf.get("layer_norm_eps", 1e-7))
        hf = {"type_vocab_size": 0, **hf}
    if model_type == "roberta":
        # HF (as fairseq) numbers positions from padding_idx + 1 (create_position_ids_from_input_ids).
        extra["position_offset"] = hf.get("pad_token_id", 1) + 1
    if model_type == "albert":
        extra.update(_albert_options(hf, where, "config.json"))
    if model_type == "electra":
        # No pooler; fine-tuning reads the first token through ELECTRA's head. E = H is
        # written as no embedding_size (no projection), as configs/models/electra_base.gin.
        embedding_size = hf.get("embedding_size", 128)  # ElectraConfig's default
        extra.update(
            embedding_size=None if embedding_size == hf.get("hidden_size") else embedding_size,
            pooler=False,
            classifier_head="electra",
        )
    return FORMATS[model_type], _encoder_config(hf, _HF_ACTIVATIONS[act], where, "config.json", **extra)


def tf_config_to_ours(tf_config: Mapping[str, Any], albert: bool, where: str) -> EncoderConfig:
    """EncoderConfig of a bert_config.json / albert_config.json.

    Their "gelu" is the exact erf form for BERT (google-research/bert's modeling.py when the
    released checkpoints were trained; it took the tanh approximation only later, and HF's
    converted BERT checkpoints say "gelu" = erf) and the tanh approximation for ALBERT
    (google-research/albert modeling.py; HF's albert configs say "gelu_new").
    """
    name = "albert_config.json" if albert else "bert_config.json"
    act = tf_config.get("hidden_act", "gelu")
    if act != "gelu":
        raise ConversionError(f"{where}: {name} hidden_act={act!r} is not supported: use 'gelu'")
    # modeling.py's layer_norm (tf.contrib.layers.layer_norm) uses epsilon 1e-12.
    extra: dict[str, Any] = {"layer_norm_eps": 1e-12}
    if albert:
        extra.update(_albert_options(tf_config, where, name))
    fields = {"type_vocab_size": 16, **tf_config}  # modeling.py's BertConfig default
    return _encoder_config(fields, "gelu_tanh" if albert else "gelu", where, name, **extra)


def format_of(config: EncoderConfig) -> ModelFormat:
    """The published family whose layout `config` has (for export); ELECTRA's discriminator
    is recognised by its classifier head, DeBERTa by `disentangled` (its version: v1 or
    v2/v3; EncoderConfig allows DeBERTa no sharing and no position offset)."""
    if config.disentangled is not None:
        return DEBERTA if config.disentangled.version == 1 else DEBERTA_V2
    if config.classifier_head == "electra" and config.sharing == "none" and config.position_offset == 0:
        return ELECTRA
    if config.sharing == "all" and config.factorized_embedding and config.position_offset == 0:
        return ALBERT
    if config.sharing == "none" and not config.factorized_embedding:
        return ROBERTA if config.position_offset else BERT
    raise ConversionError(
        f"no published model family has this layout (sharing={config.sharing!r}, embedding_size="
        f"{config.embedding_size}, position_offset={config.position_offset}): HF bert and roberta "
        "need sharing='none' without factorization, albert sharing='all' with embedding_size != hidden_size, "
        "electra classifier_head='electra' with sharing='none'"
    )


# --- tokenizers ---------------------------------------------------------------------------


# HF tokenizer_config.json settings our DeBERTa tokenizers do not implement, with the value
# every published model has (microsoft/DeBERTa spm_tokenizer.py and HF's defaults).
_DEBERTA_FIXED_SETTINGS = {
    "deberta": {"add_prefix_space": False},
    "deberta-v2": {"do_lower_case": False, "split_by_punct": False},
}


def read_tokenizer(fmt: ModelFormat, directory: str, where: str) -> tokenizers.Tokenizer:
    """The tokenizer files of a model folder: BERT's vocab.txt (casing from HF's
    tokenizer_config.json, else inferred from the vocab), RoBERTa's vocab.json + merges.txt,
    ALBERT's spiece.model (or the one *.model, e.g. the TF release's 30k-clean.model), DeBERTa's
    vocab.json + merges.txt (v1) or spm.model (v2/v3)."""
    settings_path = os.path.join(directory, "tokenizer_config.json")
    settings = _read_json(settings_path, where) if os.path.exists(settings_path) else {}
    if fmt in DEBERTA_FORMATS:
        for key, value in _DEBERTA_FIXED_SETTINGS[fmt.model_type].items():
            if settings.get(key, value) != value:
                raise ConversionError(
                    f"{where}: tokenizer_config.json has {key}={settings[key]!r}: only {key}={value!r} "
                    "(every published DeBERTa) is supported"
                )
    if fmt in (ROBERTA, DEBERTA):
        family, bpe = ("RoBERTa", tokenizers.ByteLevelBPETokenizer)
        if fmt is DEBERTA:
            family, bpe = ("DeBERTa", tokenizers.DebertaBPETokenizer)
        vocab, merges = (
            os.path.join(directory, n) for n in (tokenizers.BPE_VOCAB_FILE, tokenizers.BPE_MERGES_FILE)
        )
        if not (os.path.exists(vocab) and os.path.exists(merges)):
            raise ConversionError(
                f"{where}: no vocab.json + merges.txt: a {family} folder needs its BPE files"
            )
        return bpe.from_files(vocab, merges)
    if fmt is DEBERTA_V2:
        model = os.path.join(directory, tokenizers.DEBERTA_SPM_FILE)
        if not os.path.exists(model):
            raise ConversionError(
                f"{where}: no {tokenizers.DEBERTA_SPM_FILE}: a DeBERTa-v2/v3 folder needs its "
                "SentencePiece model"
            )
        return tokenizers.DebertaSentencePieceTokenizer.from_model_file(model)
    if fmt is ALBERT:
        candidates = sorted(n for n in os.listdir(directory) if n.endswith(".model"))
        if tokenizers.SP_MODEL_FILE in candidates:
            candidates = [tokenizers.SP_MODEL_FILE]
        if len(candidates) != 1:
            raise ConversionError(
                f"{where}: {'no' if not candidates else 'more than one'} SentencePiece *.model: an ALBERT "
                "folder needs exactly one (spiece.model, or the TF release's 30k-clean.model)"
            )
        return tokenizers.SentencePieceTokenizer.from_model_file(
            os.path.join(directory, candidates[0]), lowercase=settings.get("do_lower_case", True)
        )
    vocab = os.path.join(directory, tokenizers.VOCAB_FILE)
    if not os.path.exists(vocab):
        raise ConversionError(f"{where}: no {tokenizers.VOCAB_FILE}: a BERT folder needs its WordPiece vocab")
    return tokenizers.WordPieceTokenizer.from_vocab_file(
        vocab, lowercase=settings.get("do_lower_case"), strip_accents=settings.get("strip_accents")
    )


def _check_vocab(config: EncoderConfig, tokenizer: tokenizers.Tokenizer, where: str, name: str) -> None:
    # DeBERTa-v2/v3's tables have spare rows (128100 for 128001 tokens): models/pretrained.py.
    if not pretrained_lib.vocab_fits(tokenizer, config.vocab_size):
        raise ConversionError(
            f"{where}: {name} has vocab_size={config.vocab_size} but the tokenizer has "
            f"{tokenizer.vocab_size} tokens: the vocab file does not belong to this model"
        )


# Our tokenizer kind -> the transformers class that reads the same files.
_HF_TOKENIZER_CLASSES = {
    "wordpiece": "BertTokenizer",
    "bpe": "RobertaTokenizer",
    "sentencepiece": "AlbertTokenizer",
    "deberta_bpe": "DebertaTokenizer",
    "deberta_spm": "DebertaV2Tokenizer",
}


def write_hf_tokenizer(tokenizer: tokenizers.Tokenizer, config: EncoderConfig, output: str) -> None:
    """Our tokenizer's files plus the tokenizer_config.json / special_tokens_map.json keys that
    transformers' AutoTokenizer reads (our load_tokenizer reads the same folder)."""
    tokenizer.save(output)
    identity = tokenizer.identity()
    kind = identity["kind"]
    if kind not in _HF_TOKENIZER_CLASSES:
        raise ConversionError(f"exporting a {kind!r} tokenizer is not supported")
    roles = {
        "unk": tokenizer.unk_id,
        "sep": tokenizer.sep_id,
        "pad": tokenizer.pad_id,
        "cls": tokenizer.cls_id,
    }
    specials = {f"{role}_token": tokenizer.id_to_token(i) for role, i in roles.items()}
    specials["mask_token"] = tokenizer.id_to_token(tokenizer.mask_id)
    if kind in ("bpe", "deberta_bpe", "deberta_spm"):  # <s> / </s>, DeBERTa's [CLS] / [SEP]: also bos / eos
        specials.update(bos_token=specials["cls_token"], eos_token=specials["sep_token"])
    settings = {
        "tokenizer_class": _HF_TOKENIZER_CLASSES[kind],
        "model_max_length": config.max_length,
        **specials,
    }
    if kind == "wordpiece":
        settings.update(
            do_lower_case=identity["lowercase"],
            strip_accents=identity["strip_accents"],
            tokenize_chinese_chars=True,
        )
    elif kind in ("bpe", "deberta_bpe"):
        settings["add_prefix_space"] = False
    elif kind == "deberta_spm":
        settings.update(_DEBERTA_FIXED_SETTINGS["deberta-v2"])
    else:
        settings["do_lower_case"] = identity.get("lowercase", True)
    path = os.path.join(output, "tokenizer_config.json")
    ours = _read_json(path, output) if os.path.exists(path) else {}
    with open(path, "w") as f:
        json.dump({**ours, **settings}, f, indent=2)
    with open(os.path.join(output, "special_tokens_map.json"), "w") as f:
        json.dump(specials, f, indent=2)


# --- Hugging Face folders -----------------------------------------------------------


def read_hf_weights(directory: str, where: str) -> dict[str, np.ndarray]:
    """Every tensor of an HF folder as NumPy: model.safetensors, a sharded safetensors index,
    or (needs torch) pytorch_model.bin."""
    from safetensors.numpy import load_file

    single = os.path.join(directory, "model.safetensors")
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(single):
        return _load_safetensors(load_file, single, where)
    if os.path.exists(index):
        files = sorted(set(_read_json(index, where).get("weight_map", {}).values()))
        tensors = {}
        for name in files:
            tensors.update(_load_safetensors(load_file, os.path.join(directory, name), where))
        return tensors
    binary = os.path.join(directory, "pytorch_model.bin")
    if os.path.exists(binary):
        try:
            import torch
        except ImportError:
            raise ConversionError(
                f"{where}: has only pytorch_model.bin, which needs torch to read: pip install torch==2.13.0 "
                "(CPU is enough), or save the model as model.safetensors"
            ) from None
        state = torch.load(binary, map_location="cpu", weights_only=True)
        return {name: t.detach().float().numpy() for name, t in state.items()}
    raise ConversionError(
        f"{where}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin: "
        "pass a folder written by transformers' save_pretrained"
    )


def _load_safetensors(load_file, path: str, where: str) -> dict[str, np.ndarray]:
    try:
        return load_file(path)
    except Exception as e:  # safetensors raises its own SafetensorError for damaged files
        raise ConversionError(f"{where}: cannot read {os.path.basename(path)}: {e}") from None


def _legacy_hf_name(name: str) -> str:
    """Old HF BERT files call LayerNorm parameters gamma/beta."""
    name = re.sub(r"(LayerNorm|layer_norm)\.beta$", r"\1.bias", name)
    return re.sub(r"(LayerNorm|layer_norm)\.gamma$", r"\1.weight", name)


def _read_hf_config(directory: str, where: str) -> dict:
    """config.json of an HF folder."""
    if not os.path.isdir(directory):
        raise ConversionError(f"{where}: not a directory")
    config_path = os.path.join(directory, "config.json")
    if not os.path.exists(config_path):
        raise ConversionError(
            f"{where}: no config.json: pass a folder written by transformers' save_pretrained"
        )
    return _read_json(config_path, where)


def _read_hf_tensors(directory: str, where: str) -> dict[str, np.ndarray]:
    """Every tensor of an HF folder by its current HF name."""
    return {_legacy_hf_name(k): v for k, v in read_hf_weights(directory, where).items()}


def _hf_params(
    fmt: ModelFormat, config: EncoderConfig, tensors: Mapping[str, np.ndarray], where: str
) -> tuple[dict[str, Any], list[str]]:
    """Our params and optional groups from an HF folder's tensors, laid out as `fmt`."""
    # Models with heads prefix the encoder ("bert."), the bare model (BertModel) does not.
    base = fmt.hf_base if any(k.startswith(fmt.hf_base) for k in tensors) else ""
    stored, tensors = tensors, _current_names(fmt, tensors, where)
    # Arrays the file may lack (DeBERTa's position table) are left out of the tree then.
    optional = _optional_arrays(fmt, config)
    spec = [
        p
        for p in expand(fmt, "hf", config.num_layers, hf_base=base)
        if p.ours not in optional or p.theirs in tensors
    ]
    params, groups, used = build_params(
        spec, tensors.__getitem__, set(tensors), config, where, "tensor", "config.json"
    )
    for copy, original in fmt.hf_tied.items():  # under the stored names (tied copies keep theirs)
        original = original.format(base=base)
        if copy in stored:
            if original in stored and not np.array_equal(stored[copy], stored[original]):
                raise ConversionError(
                    f"{where}: {copy} differs from {original}: untied MLM decoders are not supported "
                    "(our decoder is the word embedding matrix)"
                )
            used.add(copy)
    ignored = sorted(k for k in tensors if k not in used and not k.endswith("position_ids"))
    if ignored:
        log.warning(
            "%s: ignoring %d tensors that are not part of the pretraining model: %s",
            where,
            len(ignored),
            ", ".join(ignored[:6]),
        )
    return params, groups


def _current_names(fmt: ModelFormat, tensors: Mapping[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
    """`tensors` with older names (`fmt.hf_renamed`) replaced by the table's."""
    renamed = {}
    for name, array in tensors.items():
        current = _renamed(name, fmt.hf_renamed)
        if current in renamed:
            raise ConversionError(
                f"{where}: holds '{current}' twice, under that name and an older one: which is the model's?"
            )
        renamed[current] = array
    return renamed


# An HF config.json without model_type is read as BERT only when it has the keys of
# pytorch-pretrained-bert's BertConfig (which wrote no model_type: e.g. SpanBERT's release,
# spanbert_hf*.tar.gz / SpanBERT/spanbert-*-cased), none that only other families' configs
# have, and weights with BERT's encoder names (`_has_bert_weights`).
_LEGACY_BERT_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
)
_NOT_BERT_KEYS = ("embedding_size", "num_hidden_groups", "inner_group_num")


def _legacy_bert_config(hf: Mapping[str, Any]) -> bool:
    """A config.json without model_type whose keys are BERT's (the weights decide: `_has_bert_weights`)."""
    return (
        "model_type" not in hf
        and all(k in hf for k in _LEGACY_BERT_KEYS)
        and not any(k in hf for k in _NOT_BERT_KEYS)
    )


def _has_bert_weights(tensors: Mapping[str, np.ndarray]) -> bool:
    """Weights named as BERT's encoder (bert.embeddings.* or, a bare BertModel, embeddings.*)
    and none of another family's prefix."""
    others = tuple(f.hf_base for f in FORMATS.values() if f is not BERT)
    return any(
        f"{base}embeddings.word_embeddings.weight" in tensors for base in (BERT.hf_base, "")
    ) and not any(k.startswith(others) for k in tensors)


def read_hf_model(directory: str) -> tuple[ModelFormat, EncoderConfig, dict[str, Any], list[str]]:
    """config.json and the weights of an HF folder: (family, config, our params, optional groups).

    A config.json without model_type, with BERT's keys and BERT's weight names, is read as
    BERT (old pytorch-pretrained-bert folders, e.g. SpanBERT's release); any other config
    without model_type is refused as an unsupported model type.
    """
    where = f"hf:{directory}"
    hf = _read_hf_config(directory, where)
    tensors = None
    if _legacy_bert_config(hf):
        tensors = _read_hf_tensors(directory, where)
        if _has_bert_weights(tensors):
            log.info(
                "%s: config.json has no model_type; its keys and weight names are BERT's: read as BERT",
                where,
            )
            hf = {**hf, "model_type": BERT.model_type}
    fmt, config = hf_config_to_ours(hf, where)
    if tensors is None:
        tensors = _read_hf_tensors(directory, where)
    if fmt is ELECTRA and any(k.startswith("generator_predictions.") for k in tensors):
        # An ElectraForMaskedLM: its encoder is the generator, not the model a workdir's
        # `encoder` is (the discriminator).
        raise ConversionError(
            f"{where} is an ELECTRA generator (ElectraForMaskedLM): import the discriminator "
            f"(ElectraForPreTraining) folder as --from=hf:DIR, with this one as --generator_from={where}"
        )
    params, groups = _hf_params(fmt, config, tensors, where)
    if fmt is ROBERTA:
        # The family's fine-tuning head (fairseq's RobertaClassificationHead); a pooler only
        # when the folder has one (RobertaModel does, RobertaForMaskedLM not).
        config = dataclasses.replace(config, pooler="pooler" in groups, classifier_head="roberta")
    return fmt, config, params, groups


# What ELECTRA's generator takes from the discriminator (models/electra.py generator_config):
# the embedding block and the settings its own config copies. A generator folder must agree.
_GENERATOR_SHARED_SETTINGS = (
    "vocab_size",
    "embedding_width",
    "max_position_embeddings",
    "type_vocab_size",
    "hidden_act",
    "layer_norm_eps",
)


def _check_generator_activation(config: EncoderConfig) -> None:
    """transformers' ElectraGeneratorPredictions applies the exact GELU whatever hidden_act
    says; our generator head (as google-research/electra's) applies hidden_act."""
    if config.hidden_act != "gelu":
        raise ConversionError(
            f"hidden_act={config.hidden_act!r} with a generator: transformers' ELECTRA generator head "
            "always applies the exact GELU, so only hidden_act='gelu' converts"
        )


def read_electra_generator(
    directory: str, config: EncoderConfig, shared: Mapping[str, Any]
) -> dict[str, Any]:
    """The `generator` and `generator_head` subtrees of an ElectraPretrainingModel tree from an
    HF ElectraForMaskedLM folder.

    Args:
      config: the discriminator's config; shared: its `embeddings` subtree, the block the
        generator reads. The folder's own copy of the embeddings is only compared with it:
        ELECTRA trains one block, so the copies should be equal; a warning when they are not
        (the discriminator's is kept).
    """
    where = f"hf:{directory}"
    fmt, generator = hf_config_to_ours(_read_hf_config(directory, where), where)
    if fmt is not ELECTRA:
        raise ConversionError(
            f"{where}: model_type {fmt.model_type!r}: --generator_from takes an ELECTRA generator "
            "(ElectraForMaskedLM) folder"
        )
    for name in _GENERATOR_SHARED_SETTINGS:
        theirs, ours = getattr(generator, name), getattr(config, name)
        if theirs != ours:
            raise ConversionError(
                f"{where}: the generator's {name} is {theirs!r}, the discriminator's {ours!r}: "
                "ELECTRA's generator shares the discriminator's embeddings and settings"
            )
    try:
        _check_generator_activation(generator)
    except ConversionError as e:
        raise ConversionError(f"{where}: {e}") from None
    params, groups = _hf_params(ELECTRA_GENERATOR, generator, _read_hf_tensors(directory, where), where)
    if "mlm_head" not in groups:
        raise ConversionError(
            f"{where}: no generator head (generator_predictions.*): --generator_from takes an "
            "ElectraForMaskedLM folder"
        )
    _warn_if_embeddings_differ(params["encoder"].pop("embeddings"), shared, where)
    return {"generator": params["encoder"], "generator_head": params["mlm_head"]}


def _warn_if_embeddings_differ(copy: Mapping[str, Any], shared: Mapping[str, Any], where: str) -> None:
    """Logs the largest difference between a generator folder's embeddings and the shared block."""
    theirs, ours = traverse_util.flatten_dict(copy), traverse_util.flatten_dict(shared)
    diffs = {"/".join(("embeddings", *k)): float(np.abs(theirs[k] - ours[k]).max()) for k in ours}
    name, diff = max(diffs.items(), key=lambda item: item[1])
    if diff > 0:
        log.warning(
            "%s: the generator's embeddings differ from the discriminator's (max abs diff %.3g in %s): "
            "ELECTRA shares one embedding block, the discriminator's is kept",
            where,
            diff,
            name,
        )


def import_hf(directory: str, generator_dir: str | None = None) -> Imported:
    """Reads an HF model folder (config.json, weights, tokenizer files) into our format; for
    ELECTRA, with `generator_dir` (an ElectraForMaskedLM folder), the generator too."""
    where = f"hf:{directory}"
    fmt, config, params, groups = read_hf_model(directory)
    source = where
    if generator_dir is not None:
        if fmt is not ELECTRA:
            raise ConversionError(
                f"{where}: --generator_from is for ELECTRA, this is a {fmt.model_type} model"
            )
        params.update(read_electra_generator(generator_dir, config, params["encoder"]["embeddings"]))
        groups = [*groups, "generator"]
        source = f"{where} + hf:{generator_dir}"
    tokenizer = read_tokenizer(fmt, directory, where)
    _check_vocab(config, tokenizer, where, "config.json")
    return Imported(fmt.model_type, config, params, tokenizer, groups, source)


def hf_model_files(
    config: EncoderConfig, params: Mapping[str, Any], pad_id: int, fmt: ModelFormat | None = None
) -> tuple[dict, dict[str, np.ndarray]]:
    """(config.json contents, tensors by HF name) of our config and parameters, laid out as
    `fmt` (default: the family of `config`, `format_of`)."""
    fmt = fmt or format_of(config)
    flat = traverse_util.flatten_dict(resize_vocab_rows(params, config.vocab_size))  # no padding rows
    spec = expand(fmt, "hf", config.num_layers, hf_base=fmt.hf_base)
    known = {p.ours for p in spec}
    groups = set(present_groups(params))
    if fmt.hf_architecture(groups) is None:
        # RoBERTa has no sentence head in HF; the rest of the model is still exported.
        log.warning("the sentence head has no %s counterpart in transformers: not exported", fmt.model_type)
        groups.discard("sentence_head")
        known |= {k for k in flat if k[0] == "sentence_head"}
    if fmt in DEBERTA_FORMATS and "pooler" in groups:
        # transformers' DeBERTa has no pooler. (A pretraining tree's absolute position table,
        # the enhanced mask decoder's, is written as the original's checkpoints hold it:
        # transformers ignores it without position_biased_input, and an import reads it back.)
        raise ConversionError(
            "has a pooler (EncoderConfig.pooler): transformers' DeBERTa models have none (its "
            "ContextPooler belongs to the classification models): use a config with pooler = False"
        )
    unknown = sorted("/".join(k) for k in flat if k not in known)
    if unknown:
        raise ConversionError(f"parameters with no HF {fmt.model_type} name: {unknown[:5]}")
    tensors: dict[str, np.ndarray] = {}
    for p in (p for p in spec if p.ours in flat):  # DeBERTa v1's in_proj: three parts, one tensor
        tensors[p.theirs] = p.to_theirs(np.asarray(flat[p.ours]), tensors.get(p.theirs))
    if fmt in DEBERTA_FORMATS and config.factorized_embedding:
        # The legacy=False head's dense is H -> H: with E != H only the legacy=True head
        # (`_DEBERTA_LEGACY_HEAD`) holds ours (config.json says legacy: true).
        legacy = [(new, old) for old, new in fmt.hf_renamed]
        tensors = {_renamed(name, legacy): array for name, array in tensors.items()}
    if fmt is ROBERTA and config.position_offset != pad_id + 1:
        raise ConversionError(
            f"position_offset={config.position_offset} but HF RoBERTa numbers positions from "
            f"pad id + 1 = {pad_id + 1}: the model cannot be expressed in transformers"
        )
    hf_config = {
        "architectures": [fmt.hf_architecture(groups)],
        "model_type": fmt.model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.type_vocab_size,
        "hidden_dropout_prob": config.dropout_rate,
        "attention_probs_dropout_prob": config.attention_dropout_rate,
        "hidden_act": _OUR_ACTIVATIONS_TO_HF[config.hidden_act],
        "layer_norm_eps": config.layer_norm_eps,
        "initializer_range": config.initializer_range,
        "pad_token_id": pad_id,
        "tie_word_embeddings": True,
    }
    if fmt is ALBERT:
        hf_config.update(embedding_size=config.embedding_width, num_hidden_groups=1, inner_group_num=1)
    elif fmt.model_type == "electra":  # ElectraConfig has learned absolute positions only
        hf_config["embedding_size"] = config.embedding_width
    elif fmt in DEBERTA_FORMATS:
        hf_config.update(_deberta_hf_config(config, groups))
    else:
        hf_config["position_embedding_type"] = "absolute"
    return hf_config, tensors


def _renamed(name: str, pairs: Sequence[tuple[str, str]]) -> str:
    """`name` with the prefix of the first (from, to) pair it starts with replaced."""
    return next((to + name[len(prefix) :] for prefix, to in pairs if name.startswith(prefix)), name)


def write_hf_model(
    output: str,
    config: EncoderConfig,
    params: Mapping[str, Any],
    pad_id: int,
    fmt: ModelFormat | None = None,
) -> str:
    """Writes config.json and model.safetensors (`hf_model_files`); returns the HF class
    named in config.json."""
    from safetensors.numpy import save_file

    hf_config, tensors = hf_model_files(config, params, pad_id, fmt)
    os.makedirs(output, exist_ok=True)
    save_file(tensors, os.path.join(output, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(output, "config.json"), "w") as f:
        json.dump(hf_config, f, indent=2)
    return hf_config["architectures"][0]


def export_hf(workdir: str, output: str, step: int | None = None, generator_output: str | None = None) -> str:
    """Writes config.json, model.safetensors and tokenizer files of `workdir` to `output`;
    of an ELECTRA workdir's generator, with `generator_output`, also to that folder (an
    ElectraForMaskedLM with its copy of the shared embeddings); likewise DeBERTa-v3's
    generator (models/deberta_rtd.py: a DebertaV2ForMaskedLM with its own tables, which the
    discriminator's, `encoder`, shares through GDES, folded by load_pretrained).

    Returns the HF class written into `output`'s config.json: the one with exactly the
    workdir's heads (e.g. BertForPreTraining with MLM + NSP, BertForMaskedLM with only MLM,
    BertModel without; ElectraForPreTraining for an ELECTRA discriminator). Subtrees with no
    transformers counterpart (NOT_EXPORTED: SpanBERT's SBO head) are left out with a warning,
    so a SpanBERT workdir exports as BertForMaskedLM.
    """
    pretrained = pretrained_lib.load_pretrained(workdir, step)
    config, params, tokenizer = pretrained.config, pretrained.params, pretrained.tokenizer
    # The generator's family: its standalone masked-LM tree and the format it is written in.
    family, generator_of, generator_format = "ELECTRA", pretrained_lib.electra_generator, ELECTRA_GENERATOR
    if config.disentangled is not None:
        family, generator_of, generator_format = "DeBERTa-v3", pretrained_lib.deberta_generator, None
    try:
        if generator_output is not None:
            if "generator" not in params:
                raise ConversionError(f"has no {family} generator to write to --generator_to")
            if config.disentangled is None:
                _check_generator_activation(config)
        elif "generator" in params:
            log.warning(
                "'%s': the %s generator is not exported: pass --generator_to=hf:DIR for it", workdir, family
            )
        for part, what in NOT_EXPORTED.items():
            if part in params:
                log.warning("'%s': %s has no transformers counterpart: not exported", workdir, what)
        write_hf_tokenizer(tokenizer, config, output)
        # ELECTRA: the discriminator; SpanBERT: BERT without the SBO head.
        model = {k: v for k, v in params.items() if k not in GENERATOR_PARTS and k not in NOT_EXPORTED}
        architecture = write_hf_model(output, config, model, tokenizer.pad_id)
        if generator_output is not None:
            write_hf_tokenizer(tokenizer, config, generator_output)
            generator_config, generator = generator_of(config, params)
            write_hf_model(generator_output, generator_config, generator, tokenizer.pad_id, generator_format)
        return architecture
    except ConversionError as e:
        raise ConversionError(f"'{workdir}': {e}") from None


# --- original TF1 checkpoints (google-research/bert, google-research/albert) -----------


def _tf_checkpoint_prefix(directory: str, where: str) -> str:
    """The newest checkpoint in `directory`: the `checkpoint` file's, else the highest model.ckpt-N."""
    latest = tf.train.latest_checkpoint(directory)
    if latest:
        return latest
    prefixes = [p[: -len(".index")] for p in tf.io.gfile.glob(os.path.join(directory, "*.index"))]
    if not prefixes:
        raise ConversionError(
            f"{where}: no TF checkpoint (*.index, e.g. bert_model.ckpt.index) in the folder"
        )

    def step(prefix: str) -> int:
        match = re.search(r"-(\d+)$", prefix)
        return int(match.group(1)) if match else -1

    return max(prefixes, key=step)


def read_tf_model(directory: str) -> tuple[ModelFormat, EncoderConfig, dict[str, Any], list[str]]:
    """bert_config.json / albert_config.json and the newest checkpoint of a google-research folder."""
    where = f"tf:{directory}"
    if not os.path.isdir(directory):
        raise ConversionError(f"{where}: not a directory")
    albert = os.path.exists(os.path.join(directory, "albert_config.json"))
    name = "albert_config.json" if albert else "bert_config.json"
    if not os.path.exists(os.path.join(directory, name)):
        raise ConversionError(
            f"{where}: no bert_config.json or albert_config.json: pass the folder of a "
            "google-research/bert or /albert checkpoint"
        )
    config = tf_config_to_ours(_read_json(os.path.join(directory, name), where), albert, where)
    prefix = _tf_checkpoint_prefix(directory, where)
    try:
        reader = tf.train.load_checkpoint(prefix)
    except (tf.errors.OpError, ValueError) as e:
        raise ConversionError(f"{where}: cannot read checkpoint {os.path.basename(prefix)}: {e}") from None
    shapes = reader.get_variable_to_shape_map()
    # TF-Hub exports put every variable under "module/".
    strip = "module/" if any(n.startswith("module/") for n in shapes) else ""
    names = {n.removeprefix(strip) for n in shapes}
    fmt = ALBERT if albert else BERT
    spec = expand(fmt, "tf", config.num_layers)
    params, groups, used = build_params(
        spec, lambda n: reader.get_tensor(strip + n), names, config, where, "variable", name
    )
    # Optimizer slots and the step counter are training state, not model.
    ignored = sorted(
        n for n in names if n not in used and n != "global_step" and not re.search(r"/(adam|lamb)_[mv]$", n)
    )
    if ignored:
        log.warning(
            "%s: ignoring %d variables that are not part of the pretraining model: %s",
            where,
            len(ignored),
            ", ".join(ignored[:6]),
        )
    return fmt, config, params, groups


def import_tf(directory: str) -> Imported:
    """Reads a google-research/bert (or /albert) checkpoint folder with its vocab."""
    where = f"tf:{directory}"
    fmt, config, params, groups = read_tf_model(directory)
    tokenizer = read_tokenizer(fmt, directory, where)
    _check_vocab(config, tokenizer, where, f"{fmt.model_type}_config.json")
    return Imported(fmt.model_type, config, params, tokenizer, groups, where)


# --- workdirs -------------------------------------------------------------------------


def write_workdir(workdir: str, imported: Imported) -> None:
    """Writes `imported` as a workdir (step 0) that `load_pretrained` reads, plus converted_from.json."""
    if tf.io.gfile.exists(os.path.join(workdir, workdir_lib.MODEL_CONFIG)):
        raise ConversionError(f"'{workdir}' already holds a model: choose a new --workdir")
    pretrained_lib.save_pretrained(workdir, imported.config, imported.params, imported.tokenizer, step=0)
    info = {"source": imported.source, "model_type": imported.model_type, "groups": imported.groups}
    with tf.io.gfile.GFile(os.path.join(workdir, CONVERTED_FROM), "w") as f:
        json.dump(info, f, indent=2)


def present_groups(params: Mapping[str, Any]) -> list[str]:
    """The optional groups a parameter tree has, in OPTIONAL_GROUPS order."""
    present = {
        "pooler": "pooler" in params.get("encoder", {}),
        "mlm_head": "mlm_head" in params,
        "sentence_head": "sentence_head" in params,
        "discriminator_head": "discriminator_head" in params,
        "generator": "generator" in params,
        "rtd_head": "rtd_head" in params,
    }
    return [g for g in OPTIONAL_GROUPS if present[g]]


# --- CLI ------------------------------------------------------------------------------


def _source(spec: str, flag: str = "--from") -> tuple[str, str]:
    kind, sep, path = spec.partition(":")
    if not sep or kind not in ("hf", "tf") or not path:
        raise ConversionError(
            f"{flag}={spec!r}: write hf:DIR (a transformers folder) or tf:DIR (a TF1 checkpoint)"
        )
    return kind, path


def run_import(source: str, workdir: str, generator_source: str | None = None) -> Imported:
    kind, path = _source(source)
    if generator_source is None:
        imported = import_hf(path) if kind == "hf" else import_tf(path)
    else:
        generator_kind, generator_path = _source(generator_source, "--generator_from")
        if (kind, generator_kind) != ("hf", "hf"):
            raise ConversionError(
                "ELECTRA imports from transformers folders only: --from=hf:DIR --generator_from=hf:DIR"
            )
        imported = import_hf(path, generator_path)
    write_workdir(workdir, imported)
    return imported


def build_parser():
    parser = cli.parser(__doc__, "models.convert")
    commands = parser.add_subparsers(
        dest="command",
        required=True,
        help="import (a published checkpoint -> a workdir) or export (a workdir -> transformers)",
    )
    imp = commands.add_parser("import", help="a published checkpoint -> a workdir")
    imp.add_argument(
        "--from",
        dest="source",
        required=True,
        help="hf:DIR (a transformers folder) or tf:DIR (a TF1 checkpoint); for ELECTRA the "
        "discriminator (ElectraForPreTraining)",
    )
    imp.add_argument(
        "--generator_from",
        dest="generator_source",
        default=None,
        help="ELECTRA only: hf:DIR, the generator (ElectraForMaskedLM) to import with the "
        "discriminator (optional; fill-mask needs it)",
    )
    imp.add_argument("--workdir", required=True, help="new workdir to write")
    exp = commands.add_parser("export", help="a workdir -> a transformers folder")
    exp.add_argument("--workdir", required=True, help="pretraining or imported workdir")
    exp.add_argument(
        "--to",
        dest="target",
        required=True,
        help="hf:DIR, the folder to write (ELECTRA: the discriminator, ElectraForPreTraining)",
    )
    exp.add_argument(
        "--generator_to",
        dest="generator_target",
        default=None,
        help="ELECTRA and DeBERTa-v3 only: hf:DIR, a second folder for the generator "
        "(ElectraForMaskedLM / DebertaV2ForMaskedLM); "
        "without it the generator is not exported",
    )
    exp.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    return parser


def _hf_target(spec: str, flag: str) -> str:
    kind, _, path = spec.partition(":")
    if kind != "hf" or not path:
        raise ConversionError(f"{flag}={spec!r}: write hf:DIR (export to TF1 is not supported)")
    return path


def _run(args) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "import":
        imported = run_import(args.source, args.workdir, args.generator_source)
        c = imported.config
        print(
            f"imported {imported.model_type} ({c.num_layers} layers, hidden {c.hidden_size}, "
            f"vocab {c.vocab_size}; parts: encoder, {', '.join(imported.groups) or 'no heads'}) "
            f"-> {args.workdir}"
        )
        return
    path = _hf_target(args.target, "--to")
    generator_path = (
        None if args.generator_target is None else _hf_target(args.generator_target, "--generator_to")
    )
    architecture = export_hf(args.workdir, path, args.step, generator_path)
    generator = ""
    if generator_path is not None:  # ElectraForMaskedLM or DebertaV2ForMaskedLM
        written = _read_json(os.path.join(generator_path, "config.json"), generator_path)
        generator = f"; generator -> {generator_path} ({written['architectures'][0]})"
    print(f"exported {args.workdir} -> {path} ({architecture}, model.safetensors){generator}")


main = cli.entry(build_parser, _run)


if __name__ == "__main__":
    sys.exit(main())
