"""The train state and its sharded creation, for pretraining and fine-tuning alike.

The state is born sharded (flax examples/lm1b `utils.py`, MaxText): the init function is
traced abstractly (`jax.eval_shape`), its logical partition specs become shardings on
the mesh, and `jax.jit(init, out_shardings=...)` writes every array straight onto its
devices; no host ever holds the whole state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util
from jax.experimental import multihost_utils

from core.sharding import Partitioner


@flax.struct.dataclass
class TrainState:
    """What an optimizer step reads and writes (and what a checkpoint holds).

    step: [] int32, the number of completed optimizer steps.
    params: the parameter tree (param dtype, float32 by default).
    opt_state: the optax state of `params`.
    carry: what the objective carries from one step to the next (XLNet's memories), every
      leaf with the global batch's rows first, so that microbatches and the mesh split it
      with the rows it belongs to; None for objectives that carry nothing
      (pretrain/objectives/base.py `Objective.init_carry`).
    """

    step: jax.Array
    params: Any
    opt_state: Any
    carry: Any = None


class StateFactory:
    """Creates TrainStates born sharded: eval_shape -> logical specs -> jit(init).

    init_params(rng) returns the parameter tree with its nn.Partitioned boxes (a module's
    `init(...)["params"]`); the optimizer state inherits the boxes' axes. init_carry(), when
    given, returns the initial carried state, boxed the same way (batch axis first). The init
    is compiled once: calling the factory with another rng (a fine-tuning seed) reuses it.

    Attributes:
      shardings: TrainState of NamedShardings, the layout of every state this makes.
      abstract: TrainState of ShapeDtypeStructs with those shardings: enough to lower and
        compile a step, or to restore a checkpoint into, allocating nothing.
      initial_carry: CarryFactory of the carry alone (`initial_carry()`: its initial value).
    """

    def __init__(
        self,
        init_params: Callable[[jax.Array], Any],
        optimizer: optax.GradientTransformation,
        partitioner: Partitioner,
        init_carry: Callable[[], Any] | None = None,
    ):
        def init_boxed(key):
            params = init_params(key)
            return TrainState(
                step=jnp.zeros([], jnp.int32),
                params=params,
                opt_state=optimizer.init(params),
                carry=init_carry() if init_carry is not None else None,
            )

        self._partitioner = partitioner
        # The key's shape only, made outside the mesh: under a mesh of devices this process
        # cannot run (a TPU slice compiled for ahead of time) an eager key would execute there.
        key = jax.eval_shape(lambda: jax.random.key(0))
        with partitioner:
            boxed = jax.eval_shape(init_boxed, key)
            self.shardings: TrainState = partitioner.shardings(boxed)
        # Unboxed outside the mesh: unboxing inside it would apply sharding constraints.
        self.abstract: TrainState = shaped_like(nn.meta.unbox(boxed), self.shardings)
        self._init = jax.jit(lambda key: nn.meta.unbox(init_boxed(key)), out_shardings=self.shardings)
        self.initial_carry = CarryFactory(init_carry, partitioner)

    def __call__(self, rng: jax.Array) -> TrainState:
        """A fresh state from `rng` (parameters initialised, step 0, optimizer state zero,
        the carry at its initial value)."""
        with self._partitioner:
            return self._init(rng)

    def compile(self) -> None:
        """Compiles the init without running it or allocating a state: fills a persistent
        compilation cache ahead of the process that will call the factory."""
        key = jax.random.key(0)  # made as a caller makes it: outside the mesh's context
        with self._partitioner:
            self._init.lower(key).compile()


class CarryFactory:
    """The initial value of an objective's carried state, born sharded like StateFactory's
    states: what a stream that starts again (a warm start, a restarted data stream, a
    checkpoint saved without its carry, evaluation's own stream) continues from.

    init_carry() returns it boxed with its logical axes (batch axis first), or None when
    nothing is carried (then calling the factory returns None).

    Attributes:
      shardings, abstract: as StateFactory's, of the carry.
    """

    def __init__(self, init_carry: Callable[[], Any] | None, partitioner: Partitioner):
        init = init_carry if init_carry is not None else lambda: None
        self._partitioner = partitioner
        with partitioner:
            boxed = jax.eval_shape(init)
            self.shardings = partitioner.shardings(boxed)
        self.abstract = shaped_like(nn.meta.unbox(boxed), self.shardings)
        self._init = jax.jit(lambda: nn.meta.unbox(init()), out_shardings=self.shardings)

    def __call__(self) -> Any:
        with self._partitioner:
            return self._init()


def shaped_like(tree: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs with the shapes/dtypes of `tree` and the given shardings."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _on_host(x: Any) -> np.ndarray:
    """An array's whole value on this host; one sharded over several processes' devices
    (fsdp or tensor across hosts) is gathered from all of them (a collective: every
    process calls it, as every process computes the hash)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def params_sha256(params: Any) -> str:
    """Hash of all parameters in a canonical order (sorted paths; path, dtype, shape, bytes)."""
    digest = hashlib.sha256()
    flat = traverse_util.flatten_dict(jax.tree.map(_on_host, params), sep="/")
    for path in sorted(flat):
        value = np.ascontiguousarray(flat[path])
        digest.update(f"{path}:{value.dtype}:{value.shape}".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def count_params(params: Any) -> int:
    """Number of scalars in a parameter tree (arrays or ShapeDtypeStructs, boxed or not)."""
    return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(params))
