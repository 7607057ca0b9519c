"""The mesh-equality proofs' loop: one optimizer step per batch of an objective on a mesh,
and the check that a layout (a mesh and a microbatch count) trains as one device does."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np

from core import optim, sharding
from models.encoder import EncoderConfig
from pretrain import step
from pretrain.objectives import Objective

# 8 heads and dims divisible by 8 so that tensor:8 is possible; no dropout so that every
# layout computes the same function.
SHARDABLE = EncoderConfig(
    vocab_size=256,
    hidden_size=32,
    num_layers=2,
    num_heads=8,
    intermediate_size=64,
    max_position_embeddings=32,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
)
B, L, P = 16, 24, 4


def mlm_batches(n, seed=0) -> list[dict[str, np.ndarray]]:
    """`n` random MaskedLM batches of SHARDABLE's vocabulary, [B, L] rows of 8 to L real tokens."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        mask = (np.arange(L)[None] < rng.integers(8, L + 1, size=(B, 1))).astype(np.int32)
        out.append(
            {
                "input_ids": (rng.integers(5, SHARDABLE.vocab_size, size=(B, L)) * mask).astype(np.int32),
                "input_mask": mask,
                "segment_ids": ((np.arange(L)[None] > 4) * mask).astype(np.int32),
                "positions": np.broadcast_to(np.arange(L, dtype=np.int32), (B, L)).copy(),
                "masked_lm_positions": np.sort(rng.choice(8, size=(B, P), replace=True), axis=1).astype(
                    np.int32
                ),
                "masked_lm_ids": rng.integers(5, SHARDABLE.vocab_size, size=(B, P)).astype(np.int32),
                "masked_lm_weights": (rng.random((B, P)) < 0.8).astype(np.float32),
                "sentence_label": rng.integers(0, 2, size=(B,)).astype(np.int32),
            }
        )
    return out


# A mesh with every axis and gradient accumulation at once: 16 rows as 2 microbatches of 8,
# 2 rows per data x fsdp device, the model split over tensor. Its result equals one device's
# only if the sharding and the microbatching are both right.
SHARDED_AND_MICROBATCHED = ("data:2,fsdp:2,tensor:2", 2)


def train(
    mesh, batches: Sequence[dict], objective: Objective, microbatches: int = 1, optimizer_fn=optim.adamw
):
    """One step per batch on `mesh` with `optimizer_fn` (core/optim.py's adamw or lamb):
    (final state, the steps' losses)."""
    rows = len(next(iter(batches[0].values()))) * jax.process_count()  # the global batch
    steps = _steps(mesh, objective, rows, microbatches, optimizer_fn)
    state, losses = steps.states(jax.random.key(0)), []
    with steps.partitioner:
        for batch in batches:
            state, metrics = steps.train_step(state, steps.partitioner.global_batch(batch), jax.random.key(1))
            losses.append(float(metrics["loss"]))
    return state, losses


def held_out_sums(mesh, params, batch: dict, objective: Objective) -> dict[str, float]:
    """The evaluation step's metric sums over one batch on `mesh` (on a cluster: each
    process's rows of one global batch)."""
    steps = _steps(mesh, objective, len(next(iter(batch.values()))) * jax.process_count())
    with steps.partitioner:
        sums, _ = steps.eval_step(params, steps.partitioner.global_batch(batch), 0, steps.eval_carry())
    return {k: float(v) for k, v in jax.device_get(sums).items()}


def _steps(mesh, objective: Objective, batch_size: int, microbatches: int = 1, optimizer_fn=optim.adamw):
    # Adam's (and LAMB's) first steps are ~lr * sign(g): gradients that are rounding noise
    # around 0 would flip sign between layouts (reductions run in another order). A large eps
    # makes the update continuous in g, so the comparison tests the sharding, not the noise.
    optimizer, schedule = optimizer_fn(total_steps=10, learning_rate=1e-2, warmup_steps=1, eps=1e-3)
    return step.build(
        objective=objective,
        optimizer=optimizer,
        schedule=schedule,
        partitioner=sharding.Partitioner(mesh, sharding.logical_axis_rules()),
        batch_size=batch_size,
        microbatches=microbatches,
    )


def assert_layouts_equal_one_device(
    make_objective: Callable[[], Objective],
    batches: Sequence[dict],
    layouts: Sequence[tuple[str, int]] = (SHARDED_AND_MICROBATCHED,),
) -> None:
    """Losses and final parameters of each (mesh spec, microbatches) layout equal one device's."""
    state, losses = train(sharding.make_mesh(None, jax.devices()[:1]), batches, make_objective())
    params = jax.device_get(state.params)
    for spec, microbatches in layouts:
        other, other_losses = train(sharding.make_mesh(spec), batches, make_objective(), microbatches)
        np.testing.assert_allclose(other_losses, losses, rtol=1e-5, err_msg=spec)
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
            jax.device_get(other.params),
            params,
        )
