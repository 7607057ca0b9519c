"""ELECTRA's replaced-token detection (Clark et al. 2020, arXiv 2003.10555), as
google-research/electra trains it (run_pretraining.py, pretrain/pretrain_helpers.py).

Per step, inside the jitted step (so masks are dynamic and cost no input pipeline work):

1. mask (`mask_rows`): of each row's candidates (real tokens other than [CLS], [SEP],
   [MASK]; the pipeline marks them, `PipelineConfig.masking = 'in_step'`), choose
   count = max(1, min(P, round(mask_prob x n))) positions uniformly WITHOUT replacement
   (n = real tokens, [CLS] and [SEP] included; P = int((mask_prob + 0.005) x L), 19 at
   L = 128 and mask_prob 0.15). 85% of them become [MASK], 15% stay: no random-token
   branch. The original samples positions with replacement and averages duplicates
   (electra issue 41); we draw without replacement (Gumbel top-k) and say so in
   docs/families/electra.md.
2. the generator predicts the masked positions; one token per position is sampled from
   its softmax (Gumbel-max, temperature 1, stop_gradient) and written into the ORIGINAL
   row (models/electra.py);
3. the discriminator labels every real token: replaced = masked and sample != original.

loss = generator MLM (mean over masked positions) + disc_weight (50) x discriminator
sigmoid cross-entropy (mean over real tokens). Both denominators are whole-batch counts
(`normalizers`), and masking and sampling are drawn per row of the global batch
(`row_streams`), so a microbatched step draws the whole-batch step's masks and samples
(and, without dropout, whose keys do depend on the microbatch, equals it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax

from core import flops
from core.errors import ConfigError
from data.pipeline_config import PipelineConfig
from models.electra import ElectraPretrainingModel, generator_config, row_keys
from models.encoder import EncoderConfig
from pretrain.objectives.base import Batch, Objective, dropout_rngs
from pretrain.objectives.masked_lm import mlm_loss_and_metrics

# pretrain_helpers.mask: of the chosen positions, this share becomes [MASK]; the rest keep
# their token (and are still predicted and sampled).
MASK_TOKEN_PROB = 0.85


def max_predictions(mask_prob: float, seq_len: int) -> int:
    """P, the masked positions per row at most: configure_pretraining.py
    `int((mask_prob + 0.005) * max_seq_length)` (19 at 128 / 0.15, 79 at 512 / 0.15)."""
    return int((mask_prob + 0.005) * seq_len)


def mask_counts(
    input_mask: jax.Array, maskable: jax.Array, mask_prob: float, num_predictions: int
) -> jax.Array:
    """[B] int32 positions masked per row: max(1, min(P, round(mask_prob x n))) with n the real
    tokens (float32 and round-half-even, as TF's tf.round), never more than the row's
    candidates (the original draws duplicates there, and divides by zero on a row with none)."""
    n = jnp.sum(input_mask, axis=-1).astype(jnp.float32)
    count = jnp.maximum(
        1, jnp.minimum(num_predictions, jnp.round(n * jnp.float32(mask_prob)).astype(jnp.int32))
    )
    return jnp.minimum(count, jnp.sum(maskable, axis=-1).astype(jnp.int32))


def mask_rows(
    batch: Batch,
    key: jax.Array,
    *,
    mask_prob: float,
    num_predictions: int,
    mask_token_prob: float = MASK_TOKEN_PROB,
) -> dict[str, jax.Array]:
    """Chooses and masks positions (module docstring, step 1), each row from its own key;
    `mask_token_prob` of them show [MASK] (ELECTRA 0.85, DeBERTa-v3 1.0), the rest keep
    their token.

    batch: input_ids, input_mask, maskable [B, L] int32; mask_id [B] int32; row_index [B]
    int32 (the row's place in the global batch). Returns generator_input_ids [B, L] int32,
    masked_lm_positions [B, P] int32 (0 in unused slots), masked_lm_weights [B, P] float32
    (1 = a masked position) and mask_token [B, P] bool (the position shows [MASK]).
    """
    ids = jnp.asarray(batch["input_ids"])
    length = ids.shape[1]
    count = mask_counts(batch["input_mask"], batch["maskable"], mask_prob, num_predictions)

    def draw(k):
        k_positions, k_tokens = jax.random.split(k)
        return jax.random.gumbel(k_positions, (length,)), jax.random.uniform(k_tokens, (num_predictions,))

    noise, coin = jax.vmap(draw)(row_keys(key, batch["row_index"]))
    # Gumbel top-k over the candidates = a uniform sample of P of them without replacement,
    # in random order; the first `count` are the row's masked positions.
    _, positions = jax.lax.top_k(jnp.where(batch["maskable"] > 0, noise, -jnp.inf), num_predictions)
    chosen = jnp.arange(num_predictions)[None, :] < count[:, None]
    positions = jnp.where(chosen, positions, 0).astype(jnp.int32)
    mask_token = chosen & (coin < mask_token_prob)
    rows = jnp.arange(ids.shape[0])[:, None]
    masked_ids = jnp.broadcast_to(batch["mask_id"][:, None], positions.shape).astype(ids.dtype)
    generator_input_ids = ids.at[rows, jnp.where(mask_token, positions, length)].set(masked_ids, mode="drop")
    return {
        "generator_input_ids": generator_input_ids,
        "masked_lm_positions": positions,
        "masked_lm_weights": chosen.astype(jnp.float32),
        "mask_token": mask_token,
    }


def discriminator_sums(logits: jax.Array, replaced: jax.Array, input_mask: jax.Array) -> dict[str, jax.Array]:
    """logits [B, L] float32, replaced [B, L] bool, input_mask [B, L] -> scalar sums over the
    real tokens: loss, correct, tokens, replaced, predicted replaced, true positives."""
    weights = input_mask.astype(jnp.float32)
    labels = replaced.astype(jnp.float32)
    predicted = logits > 0
    return {
        "disc_loss_sum": jnp.sum(optax.sigmoid_binary_cross_entropy(logits, labels) * weights),
        "disc_correct": jnp.sum((predicted == replaced) * weights),
        "disc_tokens": jnp.sum(weights),
        "replaced": jnp.sum(labels * weights),
        "predicted_replaced": jnp.sum(predicted * weights),
        "true_replaced": jnp.sum((predicted & replaced) * weights),
    }


@gin.configurable
class ElectraRTD(Objective):
    """Replaced-token detection with a generator and a discriminator (module docstring).

    Args:
      model_config: the discriminator (no pooler: `EncoderConfig.pooler = False`).
      pipeline_config: must leave masking to the step (`masking = 'in_step'`); its
        masked_lm_prob is ELECTRA's mask_prob (0.15; 0.25 for ELECTRA-Large).
      generator_hidden_ratio: generator width / discriminator width (small and large
        1/4, base 1/3; configs/models/electra_*.gin).
      disc_weight: the discriminator loss's weight (50, the paper's lambda).
    """

    rng_streams = ("dropout", "masking", "sampling")
    row_streams = ("masking", "sampling")
    headline_metric = "disc_accuracy"
    #: The share of masked positions that show [MASK] (the rest keep their token).
    mask_token_prob = MASK_TOKEN_PROB
    #: For error messages: the family, its recipe, its fine-tuning head.
    family = ("ELECTRA", "configs/recipes/electra.gin", "electra")

    def __init__(
        self,
        model_config: EncoderConfig,
        pipeline_config: PipelineConfig,
        generator_hidden_ratio: float = 0.25,
        disc_weight: float = 50.0,
    ):
        family, recipe, head = self.family
        if (model_config.disentangled is not None) != (family == "DeBERTa-v3"):
            raise ConfigError(
                "ElectraRTD trains BERT's encoder and DebertaRTD DeBERTa's: for a DeBERTa model file "
                "(EncoderConfig.disentangled) use make_objective.objective = @DebertaRTD"
            )
        if pipeline_config.masking != "in_step":
            raise ConfigError(
                f"{family} masks inside the step, but PipelineConfig.masking = {pipeline_config.masking!r}: "
                f"set PipelineConfig.masking = 'in_step' ({recipe})"
            )
        if pipeline_config.sentence_objective != "none":
            raise ConfigError(
                f"{family} has no sentence objective: set PipelineConfig.sentence_objective = 'none' "
                f"(got {pipeline_config.sentence_objective!r})"
            )
        if model_config.pooler or model_config.classifier_head == "pooler":
            raise ConfigError(
                f"{family}'s discriminator has no pooler: set EncoderConfig.pooler = False and "
                f"EncoderConfig.classifier_head = '{head}' ({recipe})"
            )
        self.model_config = model_config
        self.generator_hidden_ratio = generator_hidden_ratio
        self.generator_config = self.make_generator_config()
        self.mask_prob = pipeline_config.masked_lm_prob
        self.packed = pipeline_config.packed
        self.disc_weight = disc_weight
        self._module = self.make_module()

    def make_generator_config(self) -> EncoderConfig:
        """The generator's encoder (built once, by __init__; a subclass's own shape goes here)."""
        return generator_config(self.model_config, self.generator_hidden_ratio)

    def make_module(self) -> nn.Module:
        """The module trained (built once, by __init__, after `make_generator_config`)."""
        return ElectraPretrainingModel(self.model_config, self.generator_config)

    @property
    def module(self) -> nn.Module:
        return self._module

    def batch_spec(
        self, batch_size: int, seq_len: int, num_predictions: int
    ) -> dict[str, jax.ShapeDtypeStruct]:
        """Unmasked rows; `num_predictions` is unused (P follows from mask_prob and L)."""
        del num_predictions
        rows = jax.ShapeDtypeStruct((batch_size, seq_len), np.int32)
        return {
            "input_ids": rows,
            "input_mask": rows,
            "segment_ids": rows,
            "positions": rows,
            "maskable": rows,
            "mask_id": jax.ShapeDtypeStruct((batch_size,), np.int32),
            **({"example_ids": rows} if self.packed else {}),
        }

    def num_predictions(self, seq_len: int) -> int:
        return max_predictions(self.mask_prob, seq_len)

    def normalizers(self, batch: Batch) -> dict[str, jax.Array]:
        """The masked positions and the real tokens of the whole batch (both fixed by the
        rows before any draw)."""
        p = self.num_predictions(batch["input_ids"].shape[1])
        counts = mask_counts(batch["input_mask"], batch["maskable"], self.mask_prob, p)
        return {
            "mlm_weight": jnp.sum(counts).astype(jnp.float32),
            "disc_tokens": jnp.sum(batch["input_mask"]).astype(jnp.float32),
        }

    def forward(self, params: Any, batch: Batch, rngs: Mapping[str, jax.Array], *, train: bool) -> dict:
        """Masks `batch` and runs generator, sampling and discriminator: the masking outputs
        (`mask_rows`) and the module's (models/electra.py) in one dict."""
        masked = mask_rows(
            batch,
            rngs["masking"],
            mask_prob=self.mask_prob,
            num_predictions=self.num_predictions(batch["input_ids"].shape[1]),
            mask_token_prob=self.mask_token_prob,
        )
        module_rngs = {"sampling": rngs["sampling"], **(dropout_rngs(rngs) if train else {})}
        outputs = self.module.apply(
            {"params": params}, {**batch, **masked}, deterministic=not train, rngs=module_rngs
        )
        return {**masked, **outputs}

    def loss(
        self,
        params: Any,
        batch: Batch,
        rngs: Mapping[str, jax.Array],
        normalizers: Mapping[str, jax.Array],
        *,
        train: bool,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Generator MLM mean + disc_weight x discriminator mean, this slice's share."""
        out = self.forward(params, batch, rngs, train=train)
        positions = out["masked_lm_positions"]
        original = jnp.take_along_axis(batch["input_ids"], positions, axis=1)
        sums = mlm_loss_and_metrics(out["mlm_logits"], original, out["masked_lm_weights"])
        sums.update(discriminator_sums(out["disc_logits"], out["replaced"], batch["input_mask"]))
        # The original's denominators add 1e-6 (a batch without tokens gives 0, not NaN).
        loss = sums["mlm_loss_sum"] / (normalizers["mlm_weight"] + 1e-6) + self.disc_weight * sums[
            "disc_loss_sum"
        ] / (normalizers["disc_tokens"] + 1e-6)
        return loss, sums

    def summarize(self, sums: Mapping[str, float]) -> dict[str, float]:
        """Generator mlm_loss / mlm_accuracy; disc_loss, disc_accuracy, disc_precision and
        disc_recall (on the replaced tokens), replaced_rate (replaced / masked positions:
        1 - the generator's sampling accuracy); loss = mlm_loss + disc_weight x disc_loss."""

        def ratio(a: str, b: str) -> float:
            return sums[a] / max(sums[b], 1e-6)

        out = {
            "mlm_loss": ratio("mlm_loss_sum", "mlm_weight"),
            "mlm_accuracy": ratio("mlm_correct", "mlm_weight"),
            "disc_loss": ratio("disc_loss_sum", "disc_tokens"),
            "disc_accuracy": ratio("disc_correct", "disc_tokens"),
            "disc_precision": ratio("true_replaced", "predicted_replaced"),
            "disc_recall": ratio("true_replaced", "replaced"),
            "replaced_rate": ratio("replaced", "mlm_weight"),
        }
        out["loss"] = out["mlm_loss"] + self.disc_weight * out["disc_loss"]
        return out

    def log_labels(self) -> dict[str, str]:
        return {
            "mlm_accuracy": "gen_acc",
            "disc_accuracy": "disc_acc",
            "disc_precision": "disc_p",
            "disc_recall": "disc_r",
            "replaced_rate": "replaced",
        }

    def flops_per_row(self, seq_len: int, num_predictions: int) -> float:
        """Generator (MLM at P positions) + discriminator (head at every position), training."""
        del num_predictions
        d, g = self.model_config, self.generator_config
        return flops.electra_pretraining(
            hidden=d.hidden_size,
            layers=d.num_layers,
            intermediate=d.intermediate_size,
            generator_hidden=g.hidden_size,
            generator_layers=g.num_layers,
            generator_intermediate=g.intermediate_size,
            vocab=d.vocab_size,
            seq=seq_len,
            predictions=self.num_predictions(seq_len),
            embedding=d.embedding_width,
        )

    def paper_flops_per_row(self, seq_len: int, num_predictions: int) -> float:
        """flops_computation.py's get_electra_train_flops (tied embeddings, its output_frac)."""
        del num_predictions
        d, g = self.model_config, self.generator_config
        return flops.paper_electra_train(
            hidden=d.hidden_size,
            layers=d.num_layers,
            generator_hidden=g.hidden_size,
            generator_layers=g.num_layers,
            seq=seq_len,
            vocab=d.vocab_size,
            embedding=d.embedding_width,
        )

    def init(self, rng: jax.Array) -> Any:
        """The parameter tree (in nn.Partitioned boxes); every module runs once on a
        one-row batch with one masked position."""
        batch = {key: jnp.asarray(x) for key, x in self.example_batch(seq_len=8).items()}
        batch.update(input_mask=jnp.ones_like(batch["input_ids"]), maskable=jnp.ones_like(batch["input_ids"]))
        masked = mask_rows(
            {**batch, "row_index": jnp.zeros((1,), jnp.int32)},
            rng,
            mask_prob=self.mask_prob,
            num_predictions=1,
            mask_token_prob=self.mask_token_prob,
        )
        return self.module.init({"params": rng, "sampling": rng}, {**batch, **masked}, deterministic=True)[
            "params"
        ]
