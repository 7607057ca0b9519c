"""Optimizers and learning-rate schedules (optax), for pretraining (gin) and fine-tuning.

BERT (google-research/bert `optimization.py`): Adam with decoupled weight decay 0.01,
not applied to LayerNorm parameters or biases; beta1 0.9, beta2 0.999, eps 1e-6;
global-norm clipping at 1.0; learning rate warmed up linearly for `warmup_steps`, then
linearly decayed to 0 at `total_steps`. The decay runs over the *whole* run
(lr * (1 - step / total) after warmup), exactly as the original's
`polynomial_decay(..., num_train_steps)` with warmup overriding the first steps
(`warmup_linear_decay` form "bert").

One deviation, named here and in docs/recipes.md: the original `AdamWeightDecayOptimizer`
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

ELECTRA (google-research/electra `model/optimization.py`) fine-tunes with the same
AdamW (wd 0.01, clip 1.0, eps 1e-6), its own warmup form (form "electra") and layer-wise
learning-rate decay: each parameter's whole update, decoupled weight decay included, is
scaled by decay ** (depth from the top); see `layer_depth` and `scale_by_layer_depth`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import gin
import jax
import jax.numpy as jnp
import optax
from flax import traverse_util

from core.errors import ConfigError

log = logging.getLogger(__name__)

SCHEDULES = ("bert", "fairseq", "electra")
# The parameters of `adamw` and `lamb` that shape the learning-rate schedule: a pretraining
# run may resume with other values (a lower peak after a divergence, another tail;
# pretrain/launches.py); the others change what the optimizer state means.
SCHEDULE_PARAMETERS = frozenset({"learning_rate", "warmup_steps", "schedule"})


def warmup_linear_decay(peak, warmup_steps, total_steps, form: str = "bert") -> optax.Schedule:
    """Linear warmup to `peak` over `warmup_steps`, then linear decay to 0 at `total_steps`.

    form "bert" (google-research/bert `optimization.py`, ALBERT alike): the decay runs
    over the whole run, peak * (1 - step / total), and warmup overrides its first steps,
    so the rate after warmup starts at peak * (1 - warmup / total).
    form "fairseq" (fairseq `polynomial_decay_schedule.py`, power 1, end 0; RoBERTa): the
    decay starts from the peak at the end of warmup, peak * (1 - (step - W) / (T - W)).
    form "electra" (google-research/electra `model/optimization.py` `create_optimizer`):
    BERT's decay over the whole run *multiplied* by the warmup ramp,
    peak * min(1, step / W) * (1 - step / T), so warmup ends at peak * (1 - W / T) rather
    than at the peak; after warmup it equals "bert".

    `peak`, `warmup_steps` and `total_steps` may be Python numbers or traced arrays
    (fine-tuning injects them); `form` is static.
    """
    if form not in SCHEDULES:
        raise ConfigError(f"learning-rate schedule form '{form}' is not one of {SCHEDULES}")

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        if form == "fairseq":
            remaining = 1.0 - (step - warmup_steps) / jnp.maximum(total_steps - warmup_steps, 1)
        else:
            remaining = 1.0 - step / jnp.maximum(total_steps, 1)
        decay = peak * jnp.maximum(0.0, remaining)
        ramp = step / jnp.maximum(warmup_steps, 1)
        warm = decay * ramp if form == "electra" else peak * ramp
        return jnp.where(step < warmup_steps, warm, decay)

    return schedule


def warn_if_warmup_outlasts_the_run(optimizer: str, peak: float, warmup_steps: int, total_steps: int) -> None:
    """One warning line when the run ends inside its warm-up: a short run on a published
    recipe (10,000 warm-up steps) would train at a tiny fraction of the peak rate throughout,
    and nothing else would say so. (The decay always ends at `total_steps`, so it cannot
    outlast the run.)"""
    if warmup_steps < total_steps:
        return
    log.warning(
        "run.steps = %d ends inside %s.warmup_steps = %d: the learning rate never gets past %.2g "
        "(%.2g%% of %s.learning_rate = %g); bind %s.warmup_steps below %d (a tenth of the run: %d)",
        total_steps,
        optimizer,
        warmup_steps,
        peak * total_steps / warmup_steps,
        100 * total_steps / warmup_steps,
        optimizer,
        peak,
        optimizer,
        total_steps,
        max(1, total_steps // 10),
    )


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


_LAYER = re.compile(r"layer_(\d+)")


def layer_depth(path: tuple[str, ...], num_layers: int) -> int:
    """ELECTRA's depth of one parameter of a fine-tuning tree, for layer-wise lr decay.

    path: the parameter's keys, e.g. ("encoder", "layer_3", "output", "kernel").
    google-research/electra `model/optimization.py` `_get_layer_lrs`: the embeddings and
    their projection are depth 0, Transformer layer i is depth i + 1 and the task-specific
    head is depth num_layers + 2. Here `encoder/embeddings/...` and
    `encoder/embedding_projection/...` are 0, `encoder/layer_{i}/...` is i + 1, and every
    parameter outside `encoder` (`classifier`, `classifier_dense`) is the head. ELECTRA
    has no pooler; BERT's `encoder/pooler` reads the top layer and feeds the head, so it
    takes num_layers + 1, the one depth ELECTRA leaves unused. DeBERTa's relative position
    table and its LayerNorm (`encoder/rel_*`) are position embeddings that every layer reads:
    depth 0 with the embeddings, as is XLNet's word table (`encoder/word_embeddings`); its v2
    convolution (`encoder/conv`) belongs to layer 0's
    output: depth 1.

    Cross-layer shared parameters (ALBERT's `encoder/shared_*`) serve every depth at once:
    a ConfigError, as is any other encoder parameter.
    """
    if path[0] != "encoder":
        return num_layers + 2
    block, name = path[1], "/".join(path)
    if block in ("embeddings", "embedding_projection", "rel_embeddings", "rel_layer_norm", "word_embeddings"):
        return 0
    if block == "conv":
        return 1
    layer = _LAYER.fullmatch(block)
    if layer and int(layer[1]) < num_layers:
        return int(layer[1]) + 1
    if block == "pooler":
        return num_layers + 1
    if block.startswith("shared_"):
        raise ConfigError(
            f"layerwise_lr_decay: {name} is shared by every layer (cross-layer sharing) and has no "
            "depth: set layerwise_lr_decay to None for this model"
        )
    raise ConfigError(f"layerwise_lr_decay: no layer depth for {name} (num_layers = {num_layers})")


def _depth_factor(decay: float, num_layers: int, depth: int) -> float:
    # `_get_layer_lrs` verbatim: lr * decay ** (n_layers + 2 - depth). The head (depth
    # n_layers + 2) trains at lr and the top layer (depth n_layers) at lr * decay ** 2, not
    # lr * decay: followed as is, since the published results were trained so.
    return decay ** (num_layers + 2 - depth)


def layerwise_lr_factors(params: Any, decay: float, num_layers: int) -> dict:
    """Each parameter's learning-rate multiplier, decay ** (num_layers + 2 - depth)
    (`layer_depth`). Returns a tree of Python floats shaped like `params` (nested dicts;
    any leaf type, nn.Partitioned boxes included)."""
    flat = traverse_util.flatten_dict(params)
    return traverse_util.unflatten_dict(
        {path: _depth_factor(decay, num_layers, layer_depth(path, num_layers)) for path in flat}
    )


def scale_by_layer_depth(decay: float, num_layers: int) -> optax.GradientTransformation:
    """Multiplies each parameter's update by `layerwise_lr_factors`: an optax.partition over
    the depth labels (`layer_depth`), one optax.scale per depth. Stateless.

    Placed last in the chain, after the learning rate, so the whole AdamW update, decoupled
    weight decay included, is scaled: ELECTRA's AdamWeightDecayOptimizer computes
    `learning_rate[key] * (adam + weight_decay_rate * param)` per layer key.
    """

    def labels(params):
        flat = traverse_util.flatten_dict(params)
        return traverse_util.unflatten_dict({path: layer_depth(path, num_layers) for path in flat})

    scales = {d: optax.scale(_depth_factor(decay, num_layers, d)) for d in range(num_layers + 3)}
    return optax.partition(scales, labels)


def layerwise_decay_on(decay: float | None) -> bool:
    """Whether `layerwise_lr_decay` asks for any decay (None and 1.0 are off); ConfigError
    outside (0, 1]."""
    if decay is None or decay == 1.0:
        return False
    if not 0.0 < decay < 1.0:
        raise ConfigError(f"layerwise_lr_decay must be in (0, 1] (None or 1 = off), got {decay!r}")
    return True


def adamw_chain(
    learning_rate: optax.ScalarOrSchedule,
    *,
    b1: float,
    b2: float,
    eps: float,
    weight_decay: float,
    clip_norm: float | None,
    decay_all_parameters: bool = False,
    layerwise_lr_decay: float | None = None,
    num_layers: int | None = None,
) -> optax.GradientTransformation:
    """Global-norm clipping (if clip_norm), optax.adamw, then layer-wise lr decay (if any).

    Weight decay skips biases and LayerNorm (`decay_mask`, BERT) unless
    `decay_all_parameters` (fairseq's Adam, and so RoBERTa, decays every parameter).
    `layerwise_lr_decay` (ELECTRA fine-tuning; None or 1 = off) scales each update by
    `layerwise_lr_factors` for an encoder of `num_layers` layers. Clipping sees the raw
    gradients of every parameter, as in ELECTRA's create_optimizer.
    """
    parts = [optax.clip_by_global_norm(clip_norm)] if clip_norm else []
    mask = None if decay_all_parameters else decay_mask
    parts.append(optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=mask))
    if layerwise_decay_on(layerwise_lr_decay):
        if num_layers is None:
            raise ValueError("layerwise_lr_decay needs num_layers, the encoder's layer count")
        parts.append(scale_by_layer_depth(layerwise_lr_decay, num_layers))
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
    warn_if_warmup_outlasts_the_run("adamw", learning_rate, warmup_steps, total_steps)
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
    warn_if_warmup_outlasts_the_run("lamb", learning_rate, warmup_steps, total_steps)
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
    layerwise_lr_decay=None,
    num_layers=None,
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
        layerwise_lr_decay=layerwise_lr_decay,
        num_layers=num_layers,
    )


_GRID_STATIC = (
    "b1",
    "b2",
    "eps",
    "weight_decay",
    "clip_norm",
    "schedule",
    "decay_all_parameters",
    "layerwise_lr_decay",
    "num_layers",
)


def grid_adamw(
    *,
    b1: float,
    b2: float,
    eps: float,
    weight_decay: float,
    clip_norm: float | None,
    schedule: str = "bert",
    decay_all_parameters: bool = False,
    layerwise_lr_decay: float | None = None,
    num_layers: int | None = None,
) -> Callable[..., optax.GradientTransformation]:
    """AdamW + `warmup_linear_decay` whose schedule is optimizer state, for hyperparameter grids.

    Returns `make(learning_rate, warmup_steps, total_steps)`. Every transformation it makes
    has the same update function: the three values are read from the optimizer state
    (optax.inject_hyperparams), so a step compiled with one of them runs a state
    initialised by any other (`make(lr, w, t).init(params)`). `opt_state.hyperparams`
    shows the values; the current learning rate is the schedule at the step count.
    `schedule` (the decay form) and `decay_all_parameters` are as in `adamw`;
    `layerwise_lr_decay` and `num_layers` as in `adamw_chain`. With layer-wise decay the
    learning rate in the state (and in a grid's results) is the head's, the unscaled one,
    as ELECTRA's `learning_rate` hparam.
    """
    if schedule not in SCHEDULES:
        raise ConfigError(f"learning-rate schedule form '{schedule}' is not one of {SCHEDULES}")
    layerwise_decay_on(layerwise_lr_decay)  # a bad value fails here, before any tracing
    fixed = dict(
        b1=b1,
        b2=b2,
        eps=eps,
        weight_decay=weight_decay,
        clip_norm=clip_norm,
        schedule=schedule,
        decay_all_parameters=decay_all_parameters,
        layerwise_lr_decay=layerwise_lr_decay,
        num_layers=num_layers,
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
