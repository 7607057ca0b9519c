"""XLNet's objective: permutation language modelling over rows that continue from step to
step, with Transformer-XL memory carried in the train state (zihangdai/xlnet `train.py`,
`function_builder.py` `two_stream_loss`, `modeling.py` `lm_loss`).

Each row's factorization order is drawn in the step (pretrain/objectives/permutation.py);
the query stream predicts the targets, whose loss is the mean over the whole batch's
targets; every layer reads the memory of the row's previous segment and leaves the next
one (`init_carry`, `loss_with_carry`; docs/architecture.md "Carried state").

The batch (PipelineConfig.format "xlnet_stream", data/xlnet_stream.py): input_ids,
segment_ids (0 for the reused part and A, 1 for B, 2 for <cls>), input_mask, functional (1
at <sep> and <cls>) [B, L]; target_positions, target_weights [B, P]; and direction [B] (+1,
or -1 for a row read backwards).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np

from core import axes, flops
from core.errors import ConfigError
from data.pipeline_config import PipelineConfig
from models.encoder import EncoderConfig
from models.xlnet import PermutationLMModel
from pretrain.objectives.base import Batch, Objective, dropout_rngs
from pretrain.objectives.masked_lm import mlm_loss_and_metrics
from pretrain.objectives.permutation import draw_ranks, visibility


def target_weights(batch: Batch) -> jax.Array:
    """[B, P] float32: the batch's target weights, 0 for a slot at <sep> or <cls>: those are
    never targets (the original's `_local_perm` drops them), and such a slot's mask row would
    show it its own token."""
    on_functional = jnp.take_along_axis(batch["functional"], batch["target_positions"], axis=1)
    return batch["target_weights"] * (on_functional == 0).astype(batch["target_weights"].dtype)


@gin.configurable
class PermutationLM(Objective):
    """XLNet's permutation LM (see the module docstring)."""

    rng_streams = ("dropout", "permutation")
    #: Orders are drawn per row of the global batch: microbatching changes none.
    row_streams = ("permutation",)
    headline_metric = "plm_accuracy"

    def __init__(self, model_config: EncoderConfig, pipeline_config: PipelineConfig):
        if model_config.xlnet is None:
            raise ConfigError(
                "the objective PermutationLM needs XLNet's encoder: set EncoderConfig.xlnet "
                "(configs/models/xlnet_*.gin)"
            )
        self.model_config = model_config
        self.options = model_config.xlnet
        if pipeline_config.format != "xlnet_stream":
            raise ConfigError(
                f"the objective PermutationLM trains on XLNet's rows: set PipelineConfig.format = "
                f"'xlnet_stream' (got {pipeline_config.format!r}; configs/recipes/xlnet.gin)"
            )
        if self.options.reuse_len != pipeline_config.reuse_len:
            raise ConfigError(
                f"XLNetOptions.reuse_len = {self.options.reuse_len} but PipelineConfig.reuse_len = "
                f"{pipeline_config.reuse_len}: the memory must hold the part of each row that the next "
                "row continues; set both to the same value"
            )
        self._module = PermutationLMModel(model_config)

    @property
    def module(self) -> nn.Module:
        return self._module

    def batch_spec(
        self, batch_size: int, seq_len: int, num_predictions: int
    ) -> dict[str, jax.ShapeDtypeStruct]:
        rows, predictions = (batch_size, seq_len), (batch_size, num_predictions)
        return {
            "input_ids": jax.ShapeDtypeStruct(rows, np.int32),
            "segment_ids": jax.ShapeDtypeStruct(rows, np.int32),
            "input_mask": jax.ShapeDtypeStruct(rows, np.int32),
            "functional": jax.ShapeDtypeStruct(rows, np.int32),
            "target_positions": jax.ShapeDtypeStruct(predictions, np.int32),
            "target_weights": jax.ShapeDtypeStruct(predictions, np.float32),
            "direction": jax.ShapeDtypeStruct((batch_size,), np.int32),
        }

    def init_carry(self, batch_size: int) -> Any:
        """Zero memories [B, layers, mem_len, H] in the compute dtype (none when mem_len is 0):
        the original's training starts from attended zeros too. The batch axis only is
        split (H stays whole: fsdp already splits the rows)."""
        c = self.model_config
        if self.options.mem_len == 0:
            return None
        zeros = jnp.zeros((batch_size, c.num_layers, self.options.mem_len, c.hidden_size), c.compute_dtype)
        return {"memory": nn.LogicallyPartitioned(zeros, names=(axes.BATCH, None, None, None))}

    def normalizers(self, batch: Batch) -> dict[str, jax.Array]:
        """The number of targets in the whole batch (the loss is their mean)."""
        return {"plm_weight": jnp.sum(target_weights(batch))}

    def model_inputs(self, batch: Batch, key: jax.Array) -> tuple[jax.Array, ...]:
        """The model's positional inputs: the batch's ids, segments, mask and target positions,
        then the masks that the step's permutation key gives (`masks`)."""
        masks = self.masks(batch, key)
        names = ("input_ids", "segment_ids", "input_mask", "target_positions")
        return (*(batch[name] for name in names), masks["visible"], masks["query_visible"])

    def masks(self, batch: Batch, key: jax.Array) -> dict[str, jax.Array]:
        """The model's masks from the batch and the step's permutation key: `visible` [B, L, L]
        and the targets' rows of it, `query_visible` [B, P, L]."""
        batch_size, length = batch["input_ids"].shape
        functional = batch["functional"].astype(bool)
        rows = jnp.arange(batch_size)[:, None]
        is_target = (
            jnp.zeros((batch_size, length), bool)
            .at[rows, batch["target_positions"]]
            .max(target_weights(batch) > 0)
        )
        ranks = draw_ranks(key, batch["row_index"], length, self.options.reuse_len)
        visible = visibility(ranks, is_target & ~functional, functional, self.options.reuse_len)
        query_visible = jnp.take_along_axis(visible, batch["target_positions"][:, :, None], axis=1)
        return {"visible": visible, "query_visible": query_visible}

    def loss(
        self,
        params: Any,
        batch: Batch,
        rngs: Mapping[str, jax.Array],
        normalizers: Mapping[str, jax.Array],
        *,
        train: bool,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The loss of these rows as the first segment of their streams (zero memories)."""
        carry = nn.meta.unbox(self.init_carry(batch["input_ids"].shape[0]))
        return self.loss_with_carry(params, batch, carry, rngs, normalizers, train=train)[:2]

    def loss_with_carry(
        self,
        params: Any,
        batch: Batch,
        carry: Any,
        rngs: Mapping[str, jax.Array],
        normalizers: Mapping[str, jax.Array],
        *,
        train: bool,
    ) -> tuple[jax.Array, dict[str, jax.Array], Any]:
        """(the mean loss over the whole batch's targets, restricted to these rows; sums; the
        rows' new memories)."""
        logits, memory = self.module.apply(
            {"params": params},
            *self.model_inputs(batch, rngs["permutation"]),
            deterministic=not train,
            memory=carry["memory"] if carry is not None else None,
            direction=batch["direction"],
            row_index=batch["row_index"],
            rngs=dropout_rngs(rngs) if train else {},
        )
        labels = jnp.take_along_axis(batch["input_ids"], batch["target_positions"], axis=1)
        sums = mlm_loss_and_metrics(logits, labels, target_weights(batch))
        sums = {f"plm_{name[len('mlm_') :]}": value for name, value in sums.items()}
        loss = sums["plm_loss_sum"] / (normalizers["plm_weight"] + 1e-5)
        return loss, sums, ({"memory": memory} if carry is not None else None)

    def summarize(self, sums: Mapping[str, float]) -> dict[str, float]:
        """plm_loss, plm_accuracy and loss (= plm_loss)."""
        weight = max(sums["plm_weight"], 1e-5)
        loss = sums["plm_loss_sum"] / weight
        return {"plm_loss": loss, "plm_accuracy": sums["plm_correct"] / weight, "loss": loss}

    def log_labels(self) -> dict[str, str]:
        return {"plm_accuracy": "plm_acc"}

    def flops_per_row(self, seq_len: int, num_predictions: int) -> float:
        """Both streams against the memory's and the row's keys, and the LM head at the targets
        (core/flops.py `xlnet_pretraining`)."""
        c = self.model_config
        return flops.xlnet_pretraining(
            hidden=c.hidden_size,
            layers=c.num_layers,
            intermediate=c.intermediate_size,
            vocab=c.vocab_size,
            seq=seq_len,
            memory=self.options.mem_len,
            predictions=num_predictions,
        )

    def init(self, rng: jax.Array) -> Any:
        batch = self.example_batch(seq_len=max(8, self.options.reuse_len + 2))
        batch["row_index"] = np.zeros((1,), np.int32)
        return self.module.init(
            rng,
            *self.model_inputs(batch, jax.random.key(0)),
            deterministic=True,
            memory=nn.meta.unbox(self.init_carry(1))["memory"] if self.options.mem_len else None,
            direction=np.ones((1,), np.int32),
        )["params"]
