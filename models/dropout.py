"""Dropout whose masks cost a quarter of the random bits of flax's.

flax's `nn.Dropout` (through `jax.random.bernoulli`) draws a float32 uniform, 32 random
bits, for every element. With JAX's partitionable threefry (the default since JAX 0.5)
each of those is one threefry2x32 block (about a hundred integer operations) whose two
output words are XORed into one, and a BERT-base step at 32 x 128 draws 154M of them
(the attention probabilities and hidden states of 12 layers). Here each block's two
words are kept and cut into four 16-bit numbers, one per element: a quarter of the
blocks. An 8 x 12 x 128 x 128 mask took 1.89 ms instead of 12.3 (AMD EPYC, 2 vCPUs, best
of 20, `keep_mask` against `jax.random.bernoulli`).

An element is kept when its 16 bits are >= round(rate * 2**16): the drop rate is the
configured one to within 2**-17 (0.1 -> 0.10000610), and kept values are divided by the
keep probability (in x's dtype, as flax does: in bf16 0.9 becomes 0.8984375), so the
expected output is the input's.

Element s of a mask's last axis (length n, W = ceil(n / 4) blocks per row) takes the
16-bit quarter s // W of the block hashing the counter (row, s mod W), row being the flat
index of the leading axes: a mask is a function of (key, element index) only, identical on
every platform and under every sharding, and exactly resumable (tests/test_dropout.py).
The quarters are laid end to end rather than interleaved so that a kernel tiling the last
axis (models/flash_attention.py) uses every quarter of every block it hashes without
moving bits across lanes; `threefry2x32` is the hash in integer operations that such a
kernel (Pallas, TPU or GPU) can run, equal to JAX's. Keys of another implementation
(`rbg`, `unsafe_rbg`: core/prng.py) draw 16 bits per element through `jax.random.bits`.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.extend.random import threefry2x32_p

#: `EncoderConfig.dropout_bits`: 16 = this module's masks; 32 = flax's (jax.random.bernoulli).
DROPOUT_BITS = (16, 32)
_LEVELS = 1 << 16


def _threshold(rate: float) -> int:
    return round(rate * _LEVELS)


def _check_bits(bits: int) -> None:
    if bits not in DROPOUT_BITS:
        raise ValueError(f"dropout bits must be one of {DROPOUT_BITS}, got {bits!r}")


def keep_probability(rate: float, bits: int = 16) -> float:
    """The probability that `keep_mask` keeps an element: 1 - rate, rounded to 2**-16
    with 16 bits."""
    _check_bits(bits)
    return 1.0 - _threshold(rate) / _LEVELS if bits == 16 else 1.0 - rate


# Threefry-2x32 with 20 rounds (Salmon et al. 2011, "Parallel random numbers: as easy as
# 1, 2, 3"; JAX's threefry2x32): rotation constants of its two alternating round groups.
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA


def _rotate_left(x: jax.Array, bits: int) -> jax.Array:
    return jax.lax.shift_left(x, jnp.int32(bits)) | jax.lax.shift_right_logical(x, jnp.int32(32 - bits))


def threefry2x32(k1: jax.Array, k2: jax.Array, x1: jax.Array, x2: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32 (20 rounds) of the counter (x1, x2) under the key (k1, k2), in int32
    arithmetic (two's complement: the bits of JAX's uint32 threefry2x32, tests/test_dropout.py).

    Written with adds, shifts, ors and xors only, so that Pallas kernels on TPU (Mosaic) and
    GPU (Triton) run the very function the XLA paths run. Arguments broadcast; int32 in and out.
    """
    ks = (k1, k2, k1 ^ k2 ^ jnp.int32(_PARITY))
    x = [x1 + ks[0], x2 + ks[1]]
    for i in range(5):
        for bits in _ROTATIONS[i % 2]:
            x[0] = x[0] + x[1]
            x[1] = _rotate_left(x[1], bits) ^ x[0]
        x[0] = x[0] + ks[(i + 1) % 3]
        x[1] = x[1] + ks[(i + 2) % 3] + jnp.int32(i + 1)
    return x[0], x[1]


def quarters(y1: jax.Array, y2: jax.Array) -> tuple[jax.Array, ...]:
    """The four 16-bit numbers (int32, 0..65535) of a block's two words, in mask order."""
    low, high = jnp.int32(0xFFFF), jnp.int32(16)
    return (
        y1 & low,
        jax.lax.shift_right_logical(y1, high),
        y2 & low,
        jax.lax.shift_right_logical(y2, high),
    )


def _threefry_keep(
    rng: jax.Array, threshold: int, shape: tuple[int, ...], rows: jax.Array | None = None
) -> jax.Array:
    """bool [*shape]: each element's 16 random bits >= threshold, four elements per
    threefry2x32 block (the module docstring's layout); `rows` as in `keep_mask`."""
    *lead, last = shape
    if math.prod(lead) >= 2**32:
        raise ValueError(
            f"dropout mask {shape}: 2**32 rows or more do not fit the 16-bit masks' row counter; "
            "set EncoderConfig.dropout_bits = 32"
        )
    words = -(-last // 4)
    grid = (*lead, words)
    row = jnp.zeros(grid, jnp.uint32)
    for axis in range(len(lead)):
        stride = jnp.uint32(math.prod(lead[axis + 1 :]))
        if axis == 0 and rows is not None:
            index = jnp.asarray(rows, jnp.uint32).reshape(-1, *[1] * len(lead))
        else:
            index = jax.lax.broadcasted_iota(jnp.uint32, grid, axis)
        row = row + index * stride
    column = jax.lax.broadcasted_iota(jnp.uint32, grid, len(lead))
    k1, k2 = jax.random.key_data(rng)
    y1, y2 = threefry2x32_p.bind(k1, k2, row, column)
    as_int = functools.partial(jax.lax.bitcast_convert_type, new_dtype=jnp.int32)
    # Compared before they are joined: XLA then writes one byte per element.
    keep = [quarter >= threshold for quarter in quarters(as_int(y1), as_int(y2))]
    return jnp.concatenate(keep, axis=-1)[..., :last]


def keep_mask(
    rng: jax.Array, rate: float, shape: tuple[int, ...], bits: int = 16, rows: jax.Array | None = None
) -> jax.Array:
    """bool [*shape], True with probability `keep_probability(rate, bits)`, from `bits`
    random bits each (32: jax.random.bernoulli, as flax's nn.Dropout).

    rng: one typed key (`jax.random.key`) or one raw uint32[2] threefry key.
    rows: [shape[0]] int, the first axis's indices in the row counter (default 0..shape[0]-1):
      the places of a microbatch's rows in the global batch, so that the 16-bit threefry
      masks of a microbatch are the whole batch's masks at those rows. Other masks (32 bits,
      rbg keys) have no row counter and ignore it."""
    _check_bits(bits)
    if not jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        rng = jax.random.wrap_key_data(rng)
    if rng.shape:
        raise ValueError(f"keep_mask takes one key, got an array of keys of shape {rng.shape}")
    if bits == 32:
        return jax.random.bernoulli(rng, 1.0 - rate, shape)
    if shape and str(jax.random.key_impl(rng)) == "threefry2x32":
        return _threefry_keep(rng, _threshold(rate), tuple(shape), rows)
    return jax.random.bits(rng, shape, jnp.uint16) >= _threshold(rate)


def dropout(
    x: jax.Array, rate: float, rng: jax.Array, bits: int = 16, rows: jax.Array | None = None
) -> jax.Array:
    """Inverted dropout of `x` (any shape and dtype): dropped elements 0, kept ones / keep
    probability, in x's dtype. `rows`: see `keep_mask`."""
    keep_prob = keep_probability(rate, bits)
    if keep_prob == 0.0:  # everything dropped (and no 0 / 0 in the gradient), as flax
        return jnp.zeros_like(x)
    keep = keep_mask(rng, rate, x.shape, bits, rows)
    return jnp.where(keep, x / jnp.asarray(keep_prob, x.dtype), jnp.zeros_like(x))


class Dropout(nn.Module):
    """nn.Dropout drawing `keep_mask`'s masks from the 'dropout' PRNG stream."""

    rate: float
    bits: int = 16

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        if deterministic or self.rate == 0.0:
            return x
        return dropout(x, self.rate, self.make_rng("dropout"), self.bits)
