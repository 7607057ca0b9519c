"""Optimizers and learning-rate schedules (optax), for pretraining (gin) and fine-tuning.

BERT (google-research/bert `optimization.py`): Adam with decoupled weight decay 0.01,
not applied to LayerNorm parameters or biases; beta1 0.9, beta2 0.999, eps 1e-6;
global-norm clipping at 1.0; learning rate warmed up linearly for `warmup_steps`, then
linearly decayed to 0 at `total_steps`. The decay runs over the *whole* run
(lr * (1 - step / total) after warmup), exactly as the original's
`polynomial_decay(..., num_train_steps)` with warmup overriding the first steps.

One deviation, named here and in the README: the original `AdamWeightDecayOptimizer`
has no bias correction of the moments; optax's Adam has it (as do HF and fairseq).
Its effect is confined to the first few thousand steps, which are in warmup anyway.

RoBERTa (fairseq) uses the same AdamW with beta2 0.98, eps 1e-6 and no clipping
(configs/recipes/roberta.gin). ALBERT (google-research/albert `lamb_optimizer.py`,
`optimization.py`) uses LAMB with the same schedule, clipping, decay rate and no-decay
names; see `lamb`.

Fine-tuning uses the same AdamW and schedule through `grid_adamw`: the peak learning
rate, warmup and length are optax hyperparameters held in the optimizer state
(`optax.inject_hyperparams`), so one compiled step serves every point of a grid.
"""

from __future__ import annotations

from collections.abc import Callable

import gin
import jax
import jax.numpy as jnp
import optax
from flax import traverse_util


def warmup_linear_decay(peak, warmup_steps, total_steps) -> optax.Schedule:
    """BERT's schedule: peak * step / warmup during warmup, then peak * (1 - step / total).

    The arguments may be Python numbers or traced arrays (fine-tuning injects them).
    """

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        warm = peak * step / jnp.maximum(warmup_steps, 1)
        decay = peak * jnp.maximum(0.0, 1.0 - step / jnp.maximum(total_steps, 1))
        return jnp.where(step < warmup_steps, warm, decay)

    return schedule


def decay_mask(params) -> dict:
    """True for parameters that get weight decay: everything but biases and LayerNorm.

    In Flax, LayerNorm's parameters are `scale` and `bias`, and only LayerNorm has `scale`.
    Any name ending in `bias` is a bias (the MLM head's `output_bias` included), as in the
    original's `exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]` substring match.
    """
    flat = traverse_util.flatten_dict(params)
    return traverse_util.unflatten_dict(
        {path: not (path[-1].endswith("bias") or path[-1] == "scale") for path in flat}
    )


def adamw_chain(
    learning_rate: optax.ScalarOrSchedule,
    *,
    b1: float,
    b2: float,
    eps: float,
    weight_decay: float,
    clip_norm: float | None,
) -> optax.GradientTransformation:
    """Global-norm clipping (if clip_norm) then optax.adamw with BERT's no-decay mask."""
    parts = [optax.clip_by_global_norm(clip_norm)] if clip_norm else []
    parts.append(
        optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=decay_mask)
    )
    return optax.chain(*parts)


@gin.configurable
def adamw(
    total_steps: int,
    learning_rate: float = 1e-4,
    warmup_steps: int = 10_000,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    weight_decay: float = 0.01,
    clip_norm: float | None = 1.0,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """BERT's AdamW (defaults = the published hyperparameters). Returns (optimizer, schedule)."""
    schedule = warmup_linear_decay(learning_rate, warmup_steps, total_steps)
    optimizer = adamw_chain(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, clip_norm=clip_norm)
    return optimizer, schedule


@gin.configurable
def lamb(
    total_steps: int,
    learning_rate: float = 0.00176,
    warmup_steps: int = 3125,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    weight_decay: float = 0.01,
    clip_norm: float | None = 1.0,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """ALBERT's LAMB (defaults = the published hyperparameters). Returns (optimizer, schedule).

    optax.lamb's chain (Adam moments, decoupled weight decay, per-tensor trust ratio
    ||w|| / ||update||, learning rate), with one change to follow the original: the
    trust ratio is masked like the weight decay. ALBERT's `LAMBOptimizer` sets
    `exclude_from_layer_adaptation` to the weight-decay exclusions, so LayerNorm
    parameters and biases take a plain Adam step, where optax.lamb would rescale them
    too. As in `adamw`, optax's Adam has bias correction and the original has none.
    """
    schedule = warmup_linear_decay(learning_rate, warmup_steps, total_steps)
    parts = [optax.clip_by_global_norm(clip_norm)] if clip_norm else []
    parts += [
        optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
        optax.add_decayed_weights(weight_decay, mask=decay_mask),
        optax.masked(optax.scale_by_trust_ratio(), decay_mask),
        optax.scale_by_learning_rate(schedule),
    ]
    return optax.chain(*parts), schedule


def _scheduled_adamw(learning_rate, warmup_steps, total_steps, b1, b2, eps, weight_decay, clip_norm):
    schedule = warmup_linear_decay(learning_rate, warmup_steps, total_steps)
    return adamw_chain(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, clip_norm=clip_norm)


_GRID_STATIC = ("b1", "b2", "eps", "weight_decay", "clip_norm")


def grid_adamw(
    *, b1: float, b2: float, eps: float, weight_decay: float, clip_norm: float | None
) -> Callable[..., optax.GradientTransformation]:
    """AdamW + `warmup_linear_decay` whose schedule is optimizer state, for hyperparameter grids.

    Returns `make(learning_rate, warmup_steps, total_steps)`. Every transformation it makes
    has the same update function: the three values are read from the optimizer state
    (optax.inject_hyperparams), so a step compiled with one of them runs a state
    initialised by any other (`make(lr, w, t).init(params)`). `opt_state.hyperparams`
    shows the values; the current learning rate is the schedule at the step count.
    """
    fixed = dict(b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, clip_norm=clip_norm)
    injected = optax.inject_hyperparams(_scheduled_adamw, static_args=_GRID_STATIC)

    def make(learning_rate: float, warmup_steps: int, total_steps: int) -> optax.GradientTransformation:
        # Arrays of fixed (not weak) types, as set_hyperparams writes them, so that every
        # grid point's state has the same avals: no recompilation.
        return injected(
            learning_rate=jnp.asarray(learning_rate, jnp.float32),
            warmup_steps=jnp.asarray(warmup_steps, jnp.int32),
            total_steps=jnp.asarray(total_steps, jnp.int32),
            **fixed,
        )

    return make


def set_hyperparams(opt_state: optax.OptState, **values: float) -> optax.OptState:
    """`opt_state` of a `grid_adamw` transformation with some hyperparameters replaced, each
    kept in its dtype and placement: a fresh state for another point of the grid."""
    hyperparams = dict(opt_state.hyperparams)
    for name, value in values.items():
        old = hyperparams[name]
        hyperparams[name] = jax.device_put(jnp.asarray(value, old.dtype), old.sharding)
    return opt_state._replace(hyperparams=hyperparams)
