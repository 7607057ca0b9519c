"""DeBERTa: HF model_type "deberta" (v1) and "deberta-v2" (DeBERTa-v2 and v3: the same
architecture; v3 differs in pretraining); models/deberta.py, `EncoderConfig.disentangled`
from config.json's relative-attention keys.

v1's fused in_proj is split into our query/key/value. The MLM head is read under
transformers' legacy=False names (lm_predictions.lm_head.*, the original's checkpoints) or
legacy=True ones (cls.predictions.*) and written as legacy=False (with tie_word_embeddings
false, which transformers 5.18 needs to load it: that head reads the word table itself), or
legacy=True when E != H, which only that head expresses. The absolute position table, which
transformers keeps only with position_biased_input, is imported when the file has it (the
enhanced mask decoder reads it) and exported when the tree has it (transformers ignores it
unless position_biased_input, as it does in the original's checkpoints). DeBERTa-v3's
replaced-token-detection head (`rtd_head`, HF mask_predictions.*, which no transformers
class reads) is imported and exported when present, and its generator is exported as a
DebertaV2ForMaskedLM of its own. Options our encoder lacks (talking heads, p2p attention,
grouped convolutions, ...) are refused on import; a pooler is refused on export. Tokenizers:
v1's byte-level BPE with BERT-style special tokens (vocab.json + merges.txt), v2/v3's
SentencePiece (spm.model).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from data import tokenizers
from interop.convert.bert import EMBEDDINGS, LAYER
from interop.convert.format import OUR_ACTIVATIONS_TO_HF, ModelFormat, renamed, tree_shapes
from interop.convert.layout import (
    BIAS,
    CONV1D,
    DENSE,
    EMBED,
    FUSED_QKV,
    HEADS_IN,
    KERNEL,
    NORM,
    ConversionError,
    Module,
    heads,
    rows,
)
from interop.convert.roberta import has_bpe_files, read_bpe_files
from models import deberta, deberta_rtd
from models.disentangled import DisentangledConfig
from models.encoder import EncoderConfig
from models.pretraining import abstract_params

# The encoder's own arrays: ours under encoder/, HF under {base}encoder.: the relative table
# shared by all layers, its LayerNorm (v2 norm_rel_ebd) and v2's convolution after layer 0.
_ENCODER = (
    ("rel_embeddings", EMBED, "rel_embeddings"),
    ("rel_layer_norm", NORM, "LayerNorm"),
    ("conv", CONV1D, "conv.conv"),
    ("conv/layer_norm", NORM, "conv.LayerNorm"),
)
# A layer: ours under encoder/layer_{i}/, HF under {base}encoder.layer.{i}.; pos_key /
# pos_query exist only without share_att_key (and only for the terms of pos_att_type); the
# rest (attention output, FFN, LayerNorms) is BERT's.
_LAYER_REST = LAYER[3:]
_V2_LAYER = (
    ("attention/query", HEADS_IN, "attention.self.query_proj"),
    ("attention/key", HEADS_IN, "attention.self.key_proj"),
    ("attention/value", HEADS_IN, "attention.self.value_proj"),
    ("attention/pos_key", HEADS_IN, "attention.self.pos_key_proj"),
    ("attention/pos_query", HEADS_IN, "attention.self.pos_query_proj"),
    *_LAYER_REST,
)
# v1: the fused in_proj (+ q_bias, v_bias; no key bias), pos_proj without a bias (c2p),
# pos_q_proj with one (p2c).
_V1_LAYER = (
    ("attention", FUSED_QKV, "attention.self"),
    ("attention/pos_key", KERNEL, "attention.self.pos_proj"),
    ("attention/pos_query", HEADS_IN, "attention.self.pos_q_proj"),
    *_LAYER_REST,
)
# The heads: the MLM head under HF's legacy=False names (the original's checkpoints; a
# legacy=True folder's cls.predictions.* are read too, `hf_renamed`), and DeBERTa-v3's
# replaced-token-detection head, which HF has no class for (DebertaV2ForMaskedLM ignores
# mask_predictions.* on load): LayerNorm(h + h_CLS) -> dense -> act -> classifier H -> 1
# (the original's replaced_token_detection_model.py).
_HEADS = (
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
_LEGACY_HEAD = (  # the most specific pair first: renaming takes the first match
    ("cls.predictions.bias", "lm_predictions.lm_head.bias"),
    ("cls.predictions.transform.", "lm_predictions.lm_head."),
)
_TIED = {
    "lm_predictions.lm_head.weight": "{base}embeddings.word_embeddings.weight",
    "cls.predictions.decoder.weight": "{base}embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}
_NORM_REL_EBD = {"layer_norm": True, "none": False}


def _options(hf: Mapping[str, Any], model_type: str, where: str) -> dict[str, Any]:
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


def _hf_config_keys(config: EncoderConfig, groups: set[str]) -> dict[str, Any]:
    """The DeBERTa keys of an exported config.json (transformers reads the undeclared ones,
    position_buckets and the rest, with getattr). The MLM head is written under its
    legacy=False names (those of the original's checkpoints), except with E != H, which only
    the legacy=True head can express (`DebertaFormat.hf_tensor_names`).

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
        "pooler_hidden_act": OUR_ACTIVATIONS_TO_HF[config.hidden_act],
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


@dataclasses.dataclass(frozen=True)
class DebertaFormat(ModelFormat):
    version: int = 2  # DisentangledConfig.version: 1 (model_type "deberta") or 2 (v2 and v3)
    tokenizer_class: type = tokenizers.DebertaSentencePieceTokenizer  # v1's: DebertaBPETokenizer

    def describes(self, config: EncoderConfig) -> bool:
        return config.disentangled is not None and (config.disentangled.version == 1) == (self.version == 1)

    def hf_refusals(self, hf: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
        refusals = super().hf_refusals(hf)
        if hf.get("legacy", True) is False:
            # HF's legacy=False DeBERTa head multiplies by the word table itself whatever
            # tie_word_embeddings says (our exports write False: `_hf_config_keys`).
            del refusals["tie_word_embeddings"]
        return refusals

    def hf_options(self, hf: Mapping[str, Any], where: str) -> dict[str, Any]:
        return _options(hf, self.model_type, where)

    def our_shapes(self, config: EncoderConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
        """The MLM model without pooler and sentence head (transformers' DeBERTa has neither:
        its ContextPooler is a fine-tuning head), plus the absolute position table
        [max positions, E] (`optional_arrays`) and DeBERTa-v3's RTD head `rtd_head`
        (models/deberta_rtd.py: layer_norm [H]; dense, classifier kernels H -> H, H -> 1)."""
        tree = abstract_params(dataclasses.replace(config, pooler=False), sentence_head=False)
        hidden = jax.ShapeDtypeStruct((1, 1, config.hidden_size), jnp.float32)
        head = jax.eval_shape(deberta_rtd.RTDHead(config).init, jax.random.key(0), hidden)["params"]
        shapes = tree_shapes({**tree, "rtd_head": head})
        table = ("encoder", *deberta.POSITION_TABLE)
        shapes.setdefault(table, (config.max_position_embeddings, config.embedding_width))
        return shapes

    def optional_arrays(self, config: EncoderConfig) -> set[tuple[str, ...]]:
        """The position table when the input is not position-biased (HF then drops it; the
        original's checkpoints keep it for the enhanced mask decoder)."""
        if config.disentangled.position_biased_input:
            return set()
        return {("encoder", *deberta.POSITION_TABLE)}

    def has_tokenizer_files(self, directory: str) -> bool:
        if self.version == 1:
            return has_bpe_files(directory)
        return os.path.exists(os.path.join(directory, tokenizers.DEBERTA_SPM_FILE))

    def read_tokenizer(self, directory: str, settings: Mapping[str, Any], where: str) -> tokenizers.Tokenizer:
        """v1: vocab.json + merges.txt; v2/v3: spm.model. The tokenizer_config.json settings our
        tokenizers do not implement must have the value every published model has."""
        for key, value in self.tokenizer_class.HF_FIXED_SETTINGS.items():
            if settings.get(key, value) != value:
                raise ConversionError(
                    f"{where}: tokenizer_config.json has {key}={settings[key]!r}: only {key}={value!r} "
                    "(every published DeBERTa) is supported"
                )
        if self.version == 1:
            return read_bpe_files(directory, where, "DeBERTa", self.tokenizer_class)
        model = os.path.join(directory, tokenizers.DEBERTA_SPM_FILE)
        if not os.path.exists(model):
            raise ConversionError(
                f"{where}: no {tokenizers.DEBERTA_SPM_FILE}: a DeBERTa-v2/v3 folder needs its "
                "SentencePiece model"
            )
        return self.tokenizer_class.from_model_file(model)

    def generator_model(
        self, config: EncoderConfig, params: Mapping[str, Any]
    ) -> tuple[ModelFormat, EncoderConfig, dict[str, Any]]:
        """DeBERTa-v3's generator (models/deberta_rtd.py) as a DebertaV2ForMaskedLM with its
        own tables, which the discriminator's (`encoder`) shares through GDES."""
        generator = deberta_rtd.generator_masked_lm(config, params)
        if generator is None:
            raise ConversionError(f"has no {self.generator_family} generator to write to --generator_to")
        return self, *generator

    def check_export(self, config: EncoderConfig, groups: set[str], pad_id: int) -> None:
        if "pooler" in groups:
            # transformers' DeBERTa has no pooler. (A pretraining tree's absolute position
            # table, the enhanced mask decoder's, is written as the original's checkpoints
            # hold it: transformers ignores it without position_biased_input, and an import
            # reads it back.)
            raise ConversionError(
                "has a pooler (EncoderConfig.pooler): transformers' DeBERTa models have none (its "
                "ContextPooler belongs to the classification models): use a config with pooler = False"
            )

    def hf_tensor_names(self, tensors: dict[str, np.ndarray], config: EncoderConfig) -> dict[str, np.ndarray]:
        if not config.factorized_embedding:
            return tensors
        # The legacy=False head's dense is H -> H: with E != H only the legacy=True head holds
        # ours (config.json says legacy: true).
        legacy = [(new, old) for old, new in self.hf_renamed]
        return {renamed(name, legacy): array for name, array in tensors.items()}

    def hf_config_keys(self, config: EncoderConfig, groups: set[str]) -> dict[str, Any]:
        return _hf_config_keys(config, groups)


def _table(layer: tuple) -> tuple[Module, ...]:
    """The table of a DeBERTa version with its `layer` rows (no TF1 names)."""
    return (
        *rows("encoder", "encoder/embeddings/", "{base}embeddings.", None, EMBEDDINGS),
        Module(
            "encoder", "encoder/embeddings/embedding_projection", KERNEL, "{base}embeddings.embed_proj", None
        ),
        *rows("encoder", "encoder/", "{base}encoder.", None, _ENCODER),
        *rows("encoder", "encoder/layer_{i}/", "{base}encoder.layer.{i}.", None, layer),
        *heads(*_HEADS),
    )


_COMMON = dict(
    hf_base="deberta.",
    hf_tied=_TIED,
    hf_renamed=_LEGACY_HEAD,
    # DebertaConfig's defaults for what a config.json may leave out.
    hf_defaults={"type_vocab_size": 0, "layer_norm_eps": 1e-7},
    generator_family="DeBERTa-v3",
)
DEBERTA = DebertaFormat(
    model_type="deberta",
    table=_table(_V1_LAYER),
    hf_classes={"mlm_head": "DebertaForMaskedLM", None: "DebertaModel"},
    version=1,
    tokenizer_class=tokenizers.DebertaBPETokenizer,
    layout="deberta EncoderConfig.disentangled",
    **_COMMON,
)
DEBERTA_V2 = DebertaFormat(
    model_type="deberta-v2",
    table=_table(_V2_LAYER),
    hf_classes={"mlm_head": "DebertaV2ForMaskedLM", None: "DebertaV2Model"},
    **_COMMON,
)
