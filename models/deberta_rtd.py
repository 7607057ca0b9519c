"""DeBERTa-v3's pretraining model: an MLM generator with the enhanced mask decoder and a
replaced-token-detection discriminator whose embedding tables are the generator's through
gradient-disentangled embedding sharing (GDES) (He et al. 2021, arXiv 2111.09543 Section 3;
microsoft/DeBERTa DeBERTa/apps/tasks/rtd_task.py and
apps/models/replaced_token_detection_model.py).

The module of the DeBERTa-v3 objective (pretrain/objectives/deberta.py). One forward pass:
the generator reads the masked input and predicts the P masked positions through the
enhanced mask decoder; one token per position is sampled from its softmax (ELECTRA's
Gumbel-max, models/electra.py); the discriminator reads the original row with the samples
written in and scores every position.

GDES: the discriminator's word table is stop_gradient(generator's) + a zero-initialised
delta of its own, so the RTD loss trains only the delta and the MLM loss alone trains the
shared table (the original rebuilds the discriminator's table from the generator's detached
one before every forward). The original also shares the absolute position table the same
way; the discriminator never reads it (no EMD, no position-biased input), so its delta would
stay zero: we build none.

Parameter tree (H = width, both towers; L_g = generator depth, half the discriminator's):

    generator/...                 models/deberta.py's tree, with the position table (EMD)
    generator_head/{transform, transform_layer_norm, output_bias}   tied to generator's table
    encoder/...                   the discriminator: models/deberta.py's tree with
                                  embeddings/word_embeddings_delta instead of word_embeddings
    rtd_head/{layer_norm, dense, classifier}

`encoder` keeps the name every later stage reads; `fold_gdes` turns it into a plain
DeBERTa encoder tree (word table = generator's + delta), which models/trees.py does
whenever a workdir is loaded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from core import axes
from core.errors import ConfigError
from models.deberta import DebertaEncoder
from models.electra import encoder_inputs, replace_tokens
from models.encoder import EncoderConfig, bias_init, dense, kernel_init, layer_norm
from models.heads import MaskedLMHead


def generator_config(config: EncoderConfig, num_layers: int | None = None) -> EncoderConfig:
    """DeBERTa-v3's generator: the discriminator's width, half its depth (at least one layer)
    unless `num_layers` says otherwise (the original's rtd_{xsmall,small,base,large}.json),
    no pooler."""
    layers = max(1, config.num_layers // 2) if num_layers is None else num_layers
    if layers < 1:
        raise ConfigError(f"DebertaRTD.generator_layers must be >= 1, got {layers}")
    return dataclasses.replace(config, num_layers=layers, pooler=False)


class RTDHead(nn.Module):
    """DeBERTa-v3's replaced-token head (replaced_token_detection_model.py
    LMMaskPredictionHead): LayerNorm(h_i + h_[CLS]) -> dense H -> H -> activation -> dense -> 1.
    The classifier is initialised like every other dense layer (the original's N(0, 0.02)),
    not ELECTRA's Glorot."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, sequence_output: jax.Array, positions: jax.Array | None = None) -> jax.Array:
        """sequence_output: [B, L, H] compute dtype; positions: [B, L] int32 position ids
        (None: 0..L-1). Returns [B, L] float32 logits.

        Each token is paired with its own example's [CLS], the token at position 0 of its
        example: index t - positions[t], since packed examples are contiguous and restart
        their positions (unpacked rows: index 0, the original's hidden_states[:, 0])."""
        cfg = self.config
        first = jnp.zeros(sequence_output.shape[:2], jnp.int32)
        if positions is not None:
            first = jnp.arange(sequence_output.shape[1], dtype=jnp.int32)[None] - positions
        cls = jnp.take_along_axis(sequence_output, first[..., None], axis=1)
        x = sequence_output.astype(jnp.float32) + cls.astype(jnp.float32)
        x = layer_norm(cfg, name="layer_norm")(x).astype(cfg.compute_dtype)
        x = cfg.activation(dense(cfg, cfg.hidden_size, (axes.EMBED, axes.MLP), name="dense")(x))
        logits = nn.Dense(
            1,
            dtype=jnp.float32,
            param_dtype=cfg.storage_dtype,
            kernel_init=kernel_init(cfg, (axes.MLP, None)),
            bias_init=bias_init((None,)),
            name="classifier",
        )(x)
        return logits[..., 0]


class DebertaRTDModel(nn.Module):
    """Generator (with EMD) + GDES discriminator + RTD head (see the module docstring).

    Attributes:
      config: the discriminator (what fine-tuning and export read as `encoder`).
      generator: the generator's config (`generator_config`).
    """

    config: EncoderConfig
    generator: EncoderConfig

    @nn.compact
    def __call__(self, batch: Mapping[str, jax.Array], *, deterministic: bool) -> dict[str, jax.Array]:
        """One generator -> sample -> discriminator pass; the batch and the outputs are
        models/electra.py ElectraPretrainingModel's (mlm_logits [B, P, V] float32, samples
        [B, P] int32, replaced [B, L] bool, disc_logits [B, L] float32)."""
        common = encoder_inputs(batch, deterministic)
        generated = DebertaEncoder(self.generator, name="generator")(
            batch["generator_input_ids"], emd_positions=batch["masked_lm_positions"], **common
        )
        mlm_logits = MaskedLMHead(self.generator, name="generator_head")(
            generated.masked_states, None, generated.word_embeddings
        )
        outputs = replace_tokens(batch, mlm_logits, self.make_rng("sampling"))
        encoded = DebertaEncoder(self.config, name="encoder")(
            outputs.pop("corrupted"),
            shared_word_table=generated.word_embeddings,
            **common,
        )
        outputs["disc_logits"] = RTDHead(self.config, name="rtd_head")(
            encoded.sequence_output, batch.get("positions")
        )
        return outputs


_DELTA = "word_embeddings_delta"


def fold_gdes(params: Mapping[str, Any]) -> dict[str, Any]:
    """A DeBERTa-v3 pretraining tree (NumPy or jax arrays) with the discriminator's
    `word_embeddings_delta` replaced by its effective table, `word_embeddings` = the
    generator's table + the delta: a plain DeBERTa encoder tree, what fine-tuning and the
    export read (the original saves the same sum). Trees without GDES come back unchanged."""
    if _DELTA not in params.get("encoder", {}).get("embeddings", {}):
        return dict(params)
    embeddings = dict(params["encoder"]["embeddings"])
    delta = embeddings.pop(_DELTA)["embedding"]
    shared = params["generator"]["embeddings"]["word_embeddings"]["embedding"]
    embeddings["word_embeddings"] = {"embedding": np.asarray(shared) + np.asarray(delta)}
    return {**params, "encoder": {**params["encoder"], "embeddings": embeddings}}


def generator_masked_lm(
    config: EncoderConfig, params: Mapping[str, Any]
) -> tuple[EncoderConfig, dict] | None:
    """The masked LM of a DeBERTa-v3 tree (fill-mask, export): its generator as a DeBERTa
    masked-LM model of its own, the form of transformers' DebertaV2ForMaskedLM: its
    EncoderConfig (the discriminator's, with the generator's depth, read from the tree) and
    a BertPretrainingModel tree {encoder: `generator` (its own word and position tables),
    mlm_head: `generator_head`}, to run with the enhanced mask decoder. None for a tree of
    another family or without a generator (models/trees.py asks each family in turn)."""
    if config.disentangled is None or "generator" not in params:
        return None
    generator = params["generator"]
    layers = sum(1 for name in generator if name.startswith("layer_"))
    generator_config = dataclasses.replace(config, num_layers=layers, pooler=False)
    return generator_config, {"encoder": generator, "mlm_head": params["generator_head"]}
