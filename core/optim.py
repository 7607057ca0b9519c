"""Optimizers and learning-rate schedules (optax), for pretraining (gin) and fine-tuning.

BERT (google-research/bert `optimization.py`): Adam with decoupled weight decay 0.01,
not applied to LayerNorm parameters or biases; beta1 0.9, beta2 0.999, eps 1e-6;
global-norm clipping at 1.0; learning rate warmed up linearly for `warmup_steps`, then
linearly decayed to 0 at `total_steps`. The decay runs over the *whole* run
(lr * (1 - step / total) after warmup), exactly as the original's
`polynomial_decay(..., num_train_steps)` with warmup overriding the first steps
(`warmup_linear_decay` form "bert").

One deviation, named here and in the README: the original `AdamWeightDecayOptimizer`
has no bias correction of the moments; optax's Adam has it (as do HF and fairseq).
Its effect is confined to the first few thousand steps, which are in warmup anyway.

RoBERTa (fairseq) uses AdamW with beta2 0.98, eps 1e-6 and no clipping
(configs/recipes/roberta.gin), weight decay on every parameter (fairseq's Adam has no
exclusions) and fairseq's `polynomial_decay`, which decays from the peak at the end of
warmup (form "fairseq"). ALBERT (google-research/albert `lamb_optimizer.py`,
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

from core.errors import ConfigError

SCHEDULES = ("bert", "fairseq")


def warmup_linear_decay(peak, warmup_steps, total_steps, form: str = "bert") -> optax.Schedule:
    """Linear warmup to `peak` over `warmup_steps`, then linear decay to 0 at `total_steps`.

    form "bert" (google-research/bert `optimization.py`, ALBERT alike): the decay runs
    over the whole run, peak * (1 - step / total), and warmup overrides its first steps,
    so the rate after warmup starts at peak * (1 - warmup / total).
    form "fairseq" (fairseq `polynomial_decay_schedule.py`, power 1, end 0; RoBERTa): the
    decay starts from the peak at the end of warmup, peak * (1 - (step - W) / (T - W)).

    `peak`, `warmup_steps` and `total_steps` may be Python numbers or traced arrays
    (fine-tuning injects them); `form` is static.
    """
    if form not in SCHEDULES:
        raise ConfigError(f"learning-rate schedule form '{form}' is not one of {SCHEDULES}")

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        warm = peak * step / jnp.maximum(warmup_steps, 1)
        if form == "bert":
            remaining = 1.0 - step / jnp.maximum(total_steps, 1)
        else:
            remaining = 1.0 - (step - warmup_steps) / jnp.maximum(total_steps - warmup_steps, 1)
        decay = peak * jnp.maximum(0.0, remaining)
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
    decay_all_parameters: bool = False,
) -> optax.GradientTransformation:
    """Global-norm clipping (if clip_norm) then optax.adamw.

    Weight decay skips biases and LayerNorm (`decay_mask`, BERT) unless
    `decay_all_parameters` (fairseq's Adam, and so RoBERTa, decays every parameter).
    """
    parts = [optax.clip_by_global_norm(clip_norm)] if clip_norm else []
    mask = None if decay_all_parameters else decay_mask
    parts.append(optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=mask))
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
    schedule: str = "bert",
    decay_all_parameters: bool = False,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """BERT's AdamW (defaults = the published hyperparameters). Returns (optimizer, schedule).

    RoBERTa's recipe binds fairseq's schedule form and weight decay on every parameter
    (see `warmup_linear_decay` and `adamw_chain`).
    """
    chain = dict(b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, clip_norm=clip_norm)
    optimizer = _scheduled_adamw(
        learning_rate,
        warmup_steps,
        total_steps,
        schedule=schedule,
        decay_all_parameters=decay_all_parameters,
        **chain,
    )
    return optimizer, warmup_linear_decay(learning_rate, warmup_steps, total_steps, schedule)


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


def _scheduled_adamw(
    learning_rate,
    warmup_steps,
    total_steps,
    b1,
    b2,
    eps,
    weight_decay,
    clip_norm,
    schedule,
    decay_all_parameters,
):
    """`adamw_chain` on `warmup_linear_decay`: `adamw`, and the factory `grid_adamw` injects
    into (every argument named, as optax.inject_hyperparams binds them by name)."""
    return adamw_chain(
        warmup_linear_decay(learning_rate, warmup_steps, total_steps, schedule),
        b1=b1,
        b2=b2,
        eps=eps,
        weight_decay=weight_decay,
        clip_norm=clip_norm,
        decay_all_parameters=decay_all_parameters,
    )


_GRID_STATIC = ("b1", "b2", "eps", "weight_decay", "clip_norm", "schedule", "decay_all_parameters")


def grid_adamw(
    *,
    b1: float,
    b2: float,
    eps: float,
    weight_decay: float,
    clip_norm: float | None,
    schedule: str = "bert",
    decay_all_parameters: bool = False,
) -> Callable[..., optax.GradientTransformation]:
    """AdamW + `warmup_linear_decay` whose schedule is optimizer state, for hyperparameter grids.

    Returns `make(learning_rate, warmup_steps, total_steps)`. Every transformation it makes
    has the same update function: the three values are read from the optimizer state
    (optax.inject_hyperparams), so a step compiled with one of them runs a state
    initialised by any other (`make(lr, w, t).init(params)`). `opt_state.hyperparams`
    shows the values; the current learning rate is the schedule at the step count.
    `schedule` (the decay form) and `decay_all_parameters` are as in `adamw`.
    """
    if schedule not in SCHEDULES:
        raise ConfigError(f"learning-rate schedule form '{schedule}' is not one of {SCHEDULES}")
    fixed = dict(
        b1=b1,
        b2=b2,
        eps=eps,
        weight_decay=weight_decay,
        clip_norm=clip_norm,
        schedule=schedule,
        decay_all_parameters=decay_all_parameters,
    )
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
