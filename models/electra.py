"""ELECTRA's pretraining model: a small generator (masked LM) and the discriminator, in one
parameter tree sharing one embedding block (Clark et al. 2020, arXiv 2003.10555;
google-research/electra run_pretraining.py and model/modeling.py).

The module of the replaced-token-detection objective (pretrain/objectives/electra.py).
One forward pass: the generator reads the masked input and predicts the P masked
positions; a token is sampled at each of them from the generator's softmax (Gumbel-max,
temperature 1, no gradient); the discriminator reads the original row with those samples
written in and scores every position "replaced or not".

Parameter tree (E = embedding width, H = discriminator width, H_g = generator width):

    encoder/...                   the discriminator: models/encoder.py's tree without a
                                  pooler. Its `embeddings` block (word, position, type
                                  tables and their LayerNorm, width E) is THE embedding
                                  block: the generator has none of its own. Its
                                  embedding_projection [E, H] exists only when E != H.
    discriminator_head/dense/{kernel, bias}        [H, H], [H]
    discriminator_head/prediction/{kernel, bias}   [H, 1], [1]
    generator/embedding_projection/{kernel, bias}  [E, H_g], [H_g] (the generator's own)
    generator/layer_i/...                          H_g wide, H_g/64 heads, FFN 4 H_g
    generator_head/{transform, transform_layer_norm, output_bias}
                                  BERT's MLM head (models/heads.py): H_g -> E, tied to the
                                  shared [V, E] word table.

`encoder` keeps the name every later stage reads (fine-tuning, export, features), so the
discriminator is what a workdir's encoder is, as in the paper.
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
from models.dropout import Dropout
from models.encoder import Encoder, EncoderConfig, EncoderOutput, bias_init, dense
from models.heads import ClassifierHead, MaskedLMHead, NoMaskedLMError

# google-research/electra configure_pretraining.py: generator_hidden_size per model size
# (the paper's Section 3.2 and Table 6: 1/4 for small and large, 1/3 for base).
GENERATOR_RATIOS = {"small": 0.25, "base": 1 / 3, "large": 0.25}


def generator_config(config: EncoderConfig, hidden_ratio: float) -> EncoderConfig:
    """The generator's encoder config from the discriminator's (run_pretraining.py
    get_generator_config): width round(H * ratio), max(1, width // 64) heads, FFN 4x
    width, the same depth, and the discriminator's embedding width E (the shared block),
    so an E -> H_g projection of its own whenever E != H_g. No pooler.
    """
    if not 0.0 < hidden_ratio <= 1.0:
        raise ConfigError(f"the ELECTRA generator's hidden ratio must be in (0, 1], got {hidden_ratio!r}")
    hidden = max(1, int(round(config.hidden_size * hidden_ratio)))
    return dataclasses.replace(
        config,
        hidden_size=hidden,
        num_heads=max(1, hidden // 64),
        intermediate_size=4 * hidden,
        embedding_size=config.embedding_width,
        pooler=False,
    )


class DiscriminatorHead(nn.Module):
    """ELECTRA's replaced-token head on every position: dense H -> H, activation, dense -> 1
    (run_pretraining.py _get_discriminator_output, scope discriminator_predictions)."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, sequence_output: jax.Array) -> jax.Array:
        """sequence_output: [B, L, H] compute dtype. Returns [B, L] float32 logits."""
        cfg = self.config
        hidden = cfg.activation(
            dense(cfg, cfg.hidden_size, (axes.EMBED, axes.MLP), name="dense")(sequence_output)
        )
        # The original's `tf.layers.dense(hidden, units=1)` has no kernel_initializer, so
        # TF's default (Glorot uniform) initialises it, not the truncated normal.
        logits = nn.Dense(
            1,
            dtype=jnp.float32,
            param_dtype=cfg.storage_dtype,
            kernel_init=nn.with_logical_partitioning(nn.initializers.glorot_uniform(), (axes.MLP, None)),
            bias_init=bias_init((None,)),
            name="prediction",
        )(hidden)
        return logits[..., 0]


def row_keys(key: jax.Array, row_index: jax.Array) -> jax.Array:
    """One key per row: fold_in(key, row_index[b]) for row_index [B] int32 (the row's place in
    the global batch), so a row's draws do not depend on how the batch is split."""
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, row_index)


def sample_tokens(logits: jax.Array, key: jax.Array, row_index: jax.Array) -> jax.Array:
    """Gumbel-max sampling at temperature 1 (pretrain_helpers.sample_from_softmax), no gradient.

    logits: [B, P, V] float32; row_index: [B] int32 (see `row_keys`). Returns [B, P] int32
    draws from softmax(logits); the original token may be drawn (ELECTRA's
    disallow_correct is off).
    """
    gumbel = jax.vmap(lambda k: jax.random.gumbel(k, logits.shape[1:], jnp.float32))(row_keys(key, row_index))
    return jnp.argmax(jax.lax.stop_gradient(logits) + gumbel, axis=-1).astype(jnp.int32)


def write_samples(
    input_ids: jax.Array, positions: jax.Array, weights: jax.Array, samples: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The discriminator's input: `input_ids` [B, L] with samples [B, P] written at the
    real masked positions (weights [B, P] > 0; padding slots write nothing).

    Returns (corrupted ids [B, L] int32, masked [B, L] bool: positions that got a sample).
    """
    input_ids = jnp.asarray(input_ids)
    length = input_ids.shape[1]
    rows = jnp.arange(input_ids.shape[0])[:, None]
    # Padding slots point past the row, where mode="drop" discards the write.
    target = jnp.where(weights > 0, positions, length)
    corrupted = input_ids.at[rows, target].set(samples, mode="drop")
    masked = jnp.zeros(input_ids.shape, bool).at[rows, target].set(True, mode="drop")
    return corrupted, masked


def encoder_inputs(batch: Mapping[str, jax.Array], deterministic: bool) -> dict:
    """The encoder's keyword inputs other than the token ids, as both towers take them."""
    return dict(
        input_mask=batch["input_mask"],
        segment_ids=batch["segment_ids"],
        positions=batch.get("positions"),
        example_ids=batch.get("example_ids"),
        deterministic=deterministic,
        row_index=batch.get("row_index"),
    )


def replace_tokens(
    batch: Mapping[str, jax.Array], mlm_logits: jax.Array, key: jax.Array
) -> dict[str, jax.Array]:
    """The generator's samples written into the original rows (RTD's corruption step).

    Args:
      batch: input_ids [B, L], masked_lm_positions [B, P], masked_lm_weights [B, P], optional
        row_index [B] (default 0..B-1: see `row_keys`).
      mlm_logits: [B, P, V] float32, the generator's.
      key: the "sampling" PRNG key.
    Returns:
      mlm_logits, samples [B, P] int32, corrupted [B, L] int32 (the discriminator's input),
      replaced [B, L] bool (its labels: masked and sample != original).
    """
    row_index = batch.get("row_index")
    if row_index is None:
        row_index = jnp.arange(mlm_logits.shape[0], dtype=jnp.int32)
    samples = sample_tokens(mlm_logits, key, row_index)
    corrupted, masked = write_samples(
        batch["input_ids"], batch["masked_lm_positions"], batch["masked_lm_weights"], samples
    )
    return {
        "mlm_logits": mlm_logits,
        "samples": samples,
        "corrupted": corrupted,
        "replaced": masked & (corrupted != batch["input_ids"]),
    }


class ElectraPretrainingModel(nn.Module):
    """Generator + discriminator sharing the discriminator's embedding block (see the
    module docstring for the tree).

    Attributes:
      config: the discriminator (what fine-tuning and export read as `encoder`).
      generator: the generator's encoder config (`generator_config`).
    """

    config: EncoderConfig
    generator: EncoderConfig

    @nn.compact
    def __call__(self, batch: Mapping[str, jax.Array], *, deterministic: bool) -> dict[str, jax.Array]:
        """One generator -> sample -> discriminator pass.

        Args:
          batch: int32 [B, L] `input_ids` (the original tokens), `generator_input_ids`
            (the masked input), `input_mask`, `segment_ids`, optional `positions` and
            `example_ids` (packed rows: attention stays within each example);
            `masked_lm_positions` [B, P] int32 and `masked_lm_weights` [B, P] float32
            (1 = a real masked position); optional `row_index` [B] int32 (the rows' places
            in the global batch, default 0..B-1), which seeds each row's samples.
          deterministic: False in training: dropout (rng "dropout"). Sampling always draws
            from the rng collection "sampling".
        Returns:
          mlm_logits [B, P, V] float32 (generator), samples [B, P] int32,
          replaced [B, L] bool (the discriminator's labels: masked and sample != original),
          disc_logits [B, L] float32.
        """
        disc = Encoder(self.config, name="encoder")
        common = encoder_inputs(batch, deterministic)
        shared = disc(batch["generator_input_ids"], embeddings_only=True, **common)
        generated = Encoder(self.generator, name="generator")(
            batch["generator_input_ids"],
            embedded=(shared.sequence_output, shared.word_embeddings),
            **common,
        )
        mlm_logits = MaskedLMHead(self.generator, name="generator_head")(
            generated.sequence_output, batch["masked_lm_positions"], shared.word_embeddings
        )
        outputs = replace_tokens(batch, mlm_logits, self.make_rng("sampling"))
        encoded = disc(outputs.pop("corrupted"), **common)
        outputs["disc_logits"] = DiscriminatorHead(self.config, name="discriminator_head")(
            encoded.sequence_output
        )
        return outputs


def generator_masked_lm(
    config: EncoderConfig, params: Mapping[str, Any]
) -> tuple[EncoderConfig, dict] | None:
    """The masked LM of an ELECTRA tree (fill-mask, export): its generator, in the form of
    transformers' ElectraForMaskedLM: an EncoderConfig and a BertPretrainingModel tree
    {encoder: the shared embeddings + the generator's projection and layers, mlm_head:
    generator_head}, for the tree `params` of the discriminator's `config`. None for a tree
    of another family (models/trees.py asks each family in turn).

    BertPretrainingModel(that config, sentence_head=False) computes what
    ElectraPretrainingModel's generator does: the same embedding block (its config keeps the
    discriminator's embedding width, vocab, positions and types), then the generator's own
    E -> H_g projection (when E != H_g), layers and head. The workdir records only the
    discriminator's config, so the generator's shape is read from its layer_0: H_g and N
    from the query kernel [H_g, N, D], F from the intermediate kernel [H_g, F].

    Raises:
      NoMaskedLMError: an ELECTRA discriminator imported without its generator.
    """
    if "discriminator_head" not in params:
        return None
    if "generator" not in params:
        raise NoMaskedLMError(
            "the workdir is an ELECTRA discriminator without its generator: the discriminator has no "
            "MLM head; import the generator too (interop.convert import --generator_from=hf:DIR)"
        )
    generator = params["generator"]
    hidden, heads, _ = np.shape(generator["layer_0"]["attention"]["query"]["kernel"])
    generator_config = dataclasses.replace(
        config,
        hidden_size=hidden,
        num_heads=heads,
        intermediate_size=np.shape(generator["layer_0"]["intermediate"]["kernel"])[1],
        num_layers=sum(name.startswith("layer_") for name in generator),
        embedding_size=config.embedding_width,
        pooler=False,
    )
    tree = {
        "encoder": {"embeddings": params["encoder"]["embeddings"], **generator},
        "mlm_head": params["generator_head"],
    }
    return generator_config, tree


def _first_token(cfg: EncoderConfig, encoded: EncoderOutput, dropout: Dropout, deterministic: bool):
    return encoded.sequence_output[:, 0]


def _glorot(cfg: EncoderConfig):
    # The original's `tf.layers.dense` without a kernel_initializer: TF's Glorot uniform.
    return nn.with_logical_partitioning(nn.initializers.glorot_uniform(), (axes.EMBED, None))


#: The fine-tuning head (`classifier_head = "electra"`), google-research/electra
#: classification_tasks.py `get_prediction_module`: the first token's final hidden state
#: (`get_pooled_output` is `sequence_output[:, 0]`, no dense or tanh) -> dropout ->
#: classifier. HF's ElectraClassificationHead adds a dense + GELU layer first; the original
#: has none.
CLASSIFIER_HEAD = ClassifierHead(_first_token, classifier_init=_glorot)
