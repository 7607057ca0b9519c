"""Which PRNG draws dropout masks.

JAX's default key (threefry2x32) is counter-based, identical on every platform and under
every sharding, and computed with integer arithmetic: cheap on CPUs, but many vector
instructions per bit on TPUs. t5x and MaxText draw dropout from XLA's RngBitGenerator
instead (`jax.random.key(..., impl="rbg")`), which TPUs run in hardware.

`dropout_key` turns the step's threefry dropout key into a key of the chosen
implementation, seeded from it: the masks stay a function of (seed, step) only, so a
resumed run draws what the uninterrupted run drew. Both are identical across shardings
(JAX's PRNG documentation; tested for rbg) unless XLA's
`--xla_tpu_spmd_rng_bit_generator_unsafe` flag is set, which makes them cheaper to shard
and sharding-dependent; "unsafe_rbg" also derives keys (`split`, `fold_in`) more cheaply
and less carefully than rbg.

Measured on an AMD EPYC (2 vCPUs): an 8 x 12 x 128 x 128 mask of models/dropout.py (four
16-bit draws per threefry block; 16 bits per element from rbg's bit generator) took 0.99 ms
with threefry and 13.4 ms with rbg or unsafe_rbg (as `jax.random.bernoulli`, before those
masks: 6.8 against 15.9 ms), so the default stays threefry; the choice is for accelerators
(docs/performance.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from core.errors import ConfigError

DROPOUT_PRNGS = ("threefry", "rbg", "unsafe_rbg")


def check_dropout_prng(name: str) -> None:
    if name not in DROPOUT_PRNGS:
        raise ConfigError(f"run.dropout_prng must be one of {DROPOUT_PRNGS}, got {name!r}")


def dropout_key(key: jax.Array, name: str) -> jax.Array:
    """A typed key of implementation `name` seeded from the threefry `key` (returned as
    it is for "threefry")."""
    if name == "threefry":
        return key
    # An rbg key is 4 uint32 words of state; 128 bits from the threefry key seed it.
    return jax.random.wrap_key_data(jax.random.bits(key, (4,), jnp.uint32), impl=name)
