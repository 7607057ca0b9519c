"""The pure, jitted steps of pretraining, for any objective (pretrain/objectives/).

`train_step(state, batch, rng) -> (state, metrics)` takes one optimizer step on the global
batch; `eval_step(params, batch, index) -> metric sums` evaluates one held-out batch.
`build` compiles both for an objective on a mesh and makes the sharded state factory.
The per-step randomness is a function of (seed, step) only, so a resumed run draws exactly
what the uninterrupted run would have.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from core import axes, prng
from core.sharding import Partitioner
from core.state import StateFactory, TrainState
from models.attention import ATTENTION_DROPOUT
from pretrain.objectives import Objective

# Evaluation's fixed key for streams other than dropout (e.g. ELECTRA's sampling), so that
# every evaluation of the same parameters gives the same numbers.
_EVAL_SEED = 20_000
# The attention dropout's key is fold_in(the step's dropout key, this): a stream of its own,
# which every microbatch shares (the masks count global rows), unlike the hidden dropout's.
_ATTENTION_FOLD = 1_000


def stream_keys(key: jax.Array, streams: tuple[str, ...]) -> dict[str, jax.Array]:
    """One key per random stream. The first stream ("dropout") takes `key` itself, so a
    single-stream objective draws exactly what it drew before streams existed."""
    return {name: key if i == 0 else jax.random.fold_in(key, i) for i, name in enumerate(streams)}


def with_row_index(batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """The batch, plus `row_index` [B] int32: each row's place in the global batch, which the
    objective's row streams (`Objective.row_streams`) and the attention dropout's masks
    (models/attention.py `KeyMask.row_index`) count rows by, so that a microbatch draws what
    the whole batch draws at its rows."""
    rows = jnp.arange(next(iter(batch.values())).shape[0], dtype=jnp.int32)
    return dict(batch, row_index=nn.with_logical_constraint(rows, (axes.BATCH,)))


def split_microbatches(batch: Mapping[str, jax.Array], k: int) -> dict[str, jax.Array]:
    """[B, ...] -> [k, B/k, ...]; microbatch j holds rows j, j+k, ... so that every
    device's rows contribute to every microbatch (no resharding between them)."""

    def split(x):
        x = x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)
        return nn.with_logical_constraint(x, (None, axes.BATCH) + (None,) * (x.ndim - 2))

    return {key: split(x) for key, x in batch.items()}


def _loss_grads_sums(params, batch, rngs, normalizers, objective):
    def loss_fn(params):
        return objective.loss(params, batch, rngs, normalizers, train=True)

    (loss, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return loss, grads, sums


def train_step(
    state: TrainState,
    batch: Mapping[str, jax.Array],
    rng: jax.Array,
    *,
    objective: Objective,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    microbatches: int = 1,
    skip_nonfinite: bool = False,
    dropout_prng: str = "threefry",
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step on the global batch, optionally accumulated over microbatches.

    The random keys are fold_in(rng, step) per stream (and the microbatch index, except for
    the objective's `row_streams`, drawn per row of the global batch): resumable and
    independent of the loop. With k microbatches the gradients of k slices,
    each normalised by the whole batch's counts (`objective.normalizers`), are summed in a
    `lax.scan`: the optimizer sees the same gradient as one step on the full batch, with
    1/k of the activations.

    metrics: the objective's metric sums, plus loss, grad_norm, learning_rate and
    finite (1 when loss and gradient norm are finite). With skip_nonfinite a step where
    they are not leaves parameters and optimizer moments unchanged (the step counters,
    ours and optax's, still advance, so data and schedule move on); the host counts the
    skips.

    dropout_prng: the PRNG of the dropout masks (core/prng.py), seeded from the step's key.
    """
    keys = stream_keys(jax.random.fold_in(rng, state.step), objective.rng_streams)
    keys[ATTENTION_DROPOUT] = prng.dropout_key(
        jax.random.fold_in(keys["dropout"], _ATTENTION_FOLD), dropout_prng
    )
    keys["dropout"] = prng.dropout_key(keys["dropout"], dropout_prng)
    batch = with_row_index(batch)
    normalizers = objective.normalizers(batch)
    if microbatches == 1:
        loss, grads, sums = _loss_grads_sums(state.params, batch, keys, normalizers, objective)
    else:
        micro = split_microbatches(batch, microbatches)
        row_streams = (*objective.row_streams, ATTENTION_DROPOUT)

        def accumulate(total, xs):
            index, microbatch = xs
            # Row streams keep the step's key: the objective (and the attention dropout)
            # draws from it per global row (`row_index`), so k microbatches draw what the
            # whole batch draws.
            micro_keys = {
                name: key if name in row_streams else jax.random.fold_in(key, index)
                for name, key in keys.items()
            }
            out = _loss_grads_sums(state.params, microbatch, micro_keys, normalizers, objective)
            return jax.tree.map(jnp.add, total, out), None

        first = jax.tree.map(lambda x: x[0], micro)
        shapes = jax.eval_shape(
            functools.partial(_loss_grads_sums, objective=objective), state.params, first, keys, normalizers
        )
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        (loss, grads, sums), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(microbatches), micro))
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    if skip_nonfinite:
        keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
        params = jax.tree.map(keep, params, state.params)
        # The moments stay; the integer leaves (optax's step counts: the schedule's, Adam's
        # bias correction) advance with state.step, so the logged learning rate is the one
        # applied and the schedule still ends at 0.
        opt_state = jax.tree.map(
            lambda new, old: new if jnp.issubdtype(new.dtype, jnp.integer) else keep(new, old),
            opt_state,
            state.opt_state,
        )
    metrics = dict(
        sums,
        loss=loss,
        grad_norm=grad_norm,
        learning_rate=schedule(state.step),
        finite=finite.astype(jnp.int32),
    )
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params, batch: Mapping[str, jax.Array], index: jax.Array, *, objective: Objective):
    """Metric sums of held-out batch number `index` (no dropout; fixed keys for sampling)."""
    keys = stream_keys(jax.random.fold_in(jax.random.key(_EVAL_SEED), index), objective.rng_streams)
    batch = with_row_index(batch)
    return objective.loss(params, batch, keys, objective.normalizers(batch), train=False)[1]


@dataclasses.dataclass
class Steps:
    """An objective's compiled steps on a mesh, and the factory of its sharded state.

    train_step(state, batch, rng) -> (state, metrics): donates `state`.
    eval_step(params, batch, index) -> metric sums.
    """

    objective: Objective
    partitioner: Partitioner
    states: StateFactory
    train_step: Callable
    eval_step: Callable


def build(
    *,
    objective: Objective,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    partitioner: Partitioner,
    microbatches: int = 1,
    skip_nonfinite: bool = False,
    donate: bool = True,
    dropout_prng: str = "threefry",
) -> Steps:
    """The state factory and the jitted steps of `objective` on `partitioner`'s mesh.

    The train step donates the incoming state (updated in place); donate=False exists
    only so that bench/pretrain.py can measure what that buys.
    """
    states = StateFactory(objective.init, optimizer, partitioner)
    data = partitioner.batch_sharding
    train = jax.jit(
        functools.partial(
            train_step,
            objective=objective,
            optimizer=optimizer,
            schedule=schedule,
            microbatches=microbatches,
            skip_nonfinite=skip_nonfinite,
            dropout_prng=dropout_prng,
        ),
        in_shardings=(states.shardings, data, None),
        out_shardings=(states.shardings, None),
        donate_argnums=0 if donate else (),
    )
    evaluate = jax.jit(
        functools.partial(eval_step, objective=objective),
        in_shardings=(states.shardings.params, data, None),
        out_shardings=None,
    )
    return Steps(objective, partitioner, states, train, evaluate)
