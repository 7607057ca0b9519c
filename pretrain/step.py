"""The pure, jitted steps of pretraining, for any objective (pretrain/objectives/).

`train_step(state, batch, rng) -> (state, metrics)` takes one optimizer step on the global
batch; `eval_step(params, batch, index, carry) -> (metric sums, carry)` evaluates one held-out
batch. `build` compiles both for an objective on a mesh and makes the sharded state factory.
The per-step randomness is a function of (seed, step) only, so a resumed run draws exactly
what the uninterrupted run would have. State an objective carries from step to step
(`Objective.init_carry`, XLNet's memories) rides in the train state, split by rows like the
batch.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from core import axes, prng
from core.sharding import Partitioner
from core.state import CarryFactory, StateFactory, TrainState
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


def split_microbatches(rows: Any, k: int) -> Any:
    """Every leaf [B, ...] -> [k, B/k, ...] (a batch, or the carry of its rows); microbatch j
    holds rows j, j+k, ... so that every device's rows contribute to every microbatch (no
    resharding between them)."""

    def split(x):
        x = x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)
        return nn.with_logical_constraint(x, (None, axes.BATCH) + (None,) * (x.ndim - 2))

    return jax.tree.map(split, rows)


def join_microbatches(rows: Any) -> Any:
    """The inverse of `split_microbatches`: every leaf [k, B/k, ...] -> [B, ...], row i of
    microbatch j back at row i * k + j."""

    def join(x):
        x = x.swapaxes(0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])
        return nn.with_logical_constraint(x, (axes.BATCH,) + (None,) * (x.ndim - 1))

    return jax.tree.map(join, rows)


def _all_finite(tree: Any) -> jax.Array:
    """[] bool: every element of every leaf is finite (True for an empty tree)."""
    return jnp.all(jnp.array([jnp.isfinite(x).all() for x in jax.tree.leaves(tree)] + [True]))


def _loss_grads_sums(params, batch, carry, rngs, normalizers, objective):
    def loss_fn(params):
        loss, sums, new_carry = objective.loss_with_carry(params, batch, carry, rngs, normalizers, train=True)
        return loss, (sums, new_carry)

    (loss, (sums, new_carry)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return (loss, grads, sums), new_carry


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

    The objective's carried state (`state.carry`) is split by rows like the batch: each
    microbatch reads its rows' carry and returns their new carry (a scan output, not a sum),
    and the step rejoins them in row order.

    metrics: the objective's metric sums, plus loss, grad_norm, learning_rate and
    finite (1 when loss, gradient norm and new carry are finite). With skip_nonfinite a
    step where they are not leaves parameters and optimizer moments unchanged (the step
    counters, ours and optax's, still advance, so data and schedule move on) and restarts
    the carry from its initial value: the next batch continues this batch's rows, so the
    old carry would be a segment out of place, and the new one may be non-finite. The host
    counts the skips.

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
        (loss, grads, sums), carry = _loss_grads_sums(
            state.params, batch, state.carry, keys, normalizers, objective
        )
    else:
        micro = split_microbatches(batch, microbatches)
        micro_carry = split_microbatches(state.carry, microbatches)
        row_streams = (*objective.row_streams, ATTENTION_DROPOUT)

        def accumulate(total, xs):
            index, microbatch, rows_carry = xs
            # Row streams keep the step's key: the objective (and the attention dropout)
            # draws from it per global row (`row_index`), so k microbatches draw what the
            # whole batch draws.
            micro_keys = {
                name: key if name in row_streams else jax.random.fold_in(key, index)
                for name, key in keys.items()
            }
            out, new_carry = _loss_grads_sums(
                state.params, microbatch, rows_carry, micro_keys, normalizers, objective
            )
            return jax.tree.map(jnp.add, total, out), new_carry

        first, first_carry = jax.tree.map(lambda x: x[0], (micro, micro_carry))
        shapes, _ = jax.eval_shape(
            functools.partial(_loss_grads_sums, objective=objective),
            state.params,
            first,
            first_carry,
            keys,
            normalizers,
        )
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        (loss, grads, sums), micro_carry = jax.lax.scan(
            accumulate, zeros, (jnp.arange(microbatches), micro, micro_carry)
        )
        carry = join_microbatches(micro_carry)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & _all_finite(carry)
    if skip_nonfinite:
        keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
        params = jax.tree.map(keep, params, state.params)
        batch_size = next(iter(batch.values())).shape[0]
        carry = jax.tree.map(keep, carry, nn.meta.unbox(objective.init_carry(batch_size)))
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
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state, carry=carry), metrics


def eval_step(
    params, batch: Mapping[str, jax.Array], index: jax.Array, carry: Any, *, objective: Objective
) -> tuple[dict[str, jax.Array], Any]:
    """(metric sums, new carry) of held-out batch number `index` (no dropout; fixed keys for
    sampling), given the carry that evaluation's own stream has built so far (`Steps.eval_carry`
    at its start)."""
    keys = stream_keys(jax.random.fold_in(jax.random.key(_EVAL_SEED), index), objective.rng_streams)
    batch = with_row_index(batch)
    _, sums, carry = objective.loss_with_carry(
        params, batch, carry, keys, objective.normalizers(batch), train=False
    )
    return sums, carry


@dataclasses.dataclass
class Steps:
    """An objective's compiled steps on a mesh, and the factory of its sharded state.

    train_step(state, batch, rng) -> (state, metrics): donates `state`.
    eval_step(params, batch, index, carry) -> (metric sums, carry).
    eval_carry() -> the carry's initial value for an evaluation batch (the rows of one
      microbatch; None when the objective carries nothing): evaluation's stream is its own,
      so its carry is too.
    """

    objective: Objective
    partitioner: Partitioner
    states: StateFactory
    train_step: Callable
    eval_step: Callable
    eval_carry: Callable[[], Any]


def build(
    *,
    objective: Objective,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    partitioner: Partitioner,
    batch_size: int,
    microbatches: int = 1,
    skip_nonfinite: bool = False,
    donate: bool = True,
    dropout_prng: str = "threefry",
) -> Steps:
    """The state factory and the jitted steps of `objective` on `partitioner`'s mesh, for
    global batches of `batch_size` rows (the size of the objective's carried state).

    The train step donates the incoming state (updated in place); donate=False exists
    only so that bench/pretrain.py can measure what that buys.
    """
    states = StateFactory(
        objective.init, optimizer, partitioner, init_carry=functools.partial(objective.init_carry, batch_size)
    )
    eval_carry = CarryFactory(
        functools.partial(objective.init_carry, batch_size // microbatches), partitioner
    )
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
        in_shardings=(states.shardings.params, data, None, eval_carry.shardings),
        out_shardings=(None, eval_carry.shardings),
    )
    return Steps(objective, partitioner, states, train, evaluate, eval_carry)
