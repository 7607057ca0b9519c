"""Dropout from 16 random bits per element (models/dropout.py): rate, independence,
scaling, determinism, sharding."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from core import sharding
from models import dropout

KEY = jax.random.key(11)


def test_keep_probability_is_the_rate_to_within_2_to_the_minus_17():
    assert dropout.keep_probability(0.1) == 1 - 6554 / 65536
    for rate in (0.0, 0.05, 0.1, 0.3, 0.5, 0.9):
        assert abs((1 - dropout.keep_probability(rate)) - rate) <= 2**-17


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(512, 1024), (8192, 63)], ids=["paired", "odd last axis"])
@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_keep_rate_and_independence(shape, rate):
    keep = np.asarray(dropout.keep_mask(KEY, rate, shape))
    assert keep.shape == shape and keep.dtype == bool
    p = dropout.keep_probability(rate)
    sigma = np.sqrt(p * (1 - p) / keep.size)
    assert abs(keep.mean() - p) < 5 * sigma
    # The four quarters of one random block (elements j, W + j, 2W + j, 3W + j with
    # W = ceil(n / 4)) are independent: every pair of them is dropped together as often as
    # rate squared.
    q = 1 - p
    words = -(-shape[1] // 4)
    columns = [keep[:, quarter * words : (quarter + 1) * words] for quarter in range(4)]
    width = min(c.shape[1] for c in columns)
    for a in range(4):
        for b in range(a + 1, 4):
            both = np.mean(~columns[a][:, :width] & ~columns[b][:, :width])
            assert abs(both - q * q) < 5 * np.sqrt(q * q * (1 - q * q) / (shape[0] * width)), (a, b)
    rows = keep.mean(axis=1)  # no row (one word index range) is special
    assert rows.std() < 3 * np.sqrt(p * (1 - p) / shape[1])


@pytest.mark.slow
def test_rows_are_counted_over_every_leading_axis():
    """The row counter is the flat index of the leading axes: a [3, 5, n] mask is the
    [15, n] one reshaped, and no two rows repeat."""
    flat = np.asarray(dropout.keep_mask(KEY, 0.5, (15, 64)))
    np.testing.assert_array_equal(dropout.keep_mask(KEY, 0.5, (3, 5, 64)), flat.reshape(3, 5, 64))
    assert len({row.tobytes() for row in flat}) == 15


@pytest.mark.slow
def test_rate_zero_keeps_everything_and_rate_one_drops_everything():
    assert np.asarray(dropout.keep_mask(KEY, 0.0, (512, 512))).all()  # kept at bits >= 0
    x = jnp.ones((8, 64))
    for rate in (1.0, 1 - 2**-18):  # the second rounds to a zero keep probability
        y, grad = jax.value_and_grad(lambda x: jnp.sum(dropout.dropout(x, rate, KEY)))(x)  # noqa: B023
        assert y == 0 and np.all(np.asarray(grad) == 0)


def test_bad_bits_and_batched_keys_are_clear_errors():
    with pytest.raises(ValueError, match="bits must be one of"):
        dropout.keep_mask(KEY, 0.1, (4, 4), bits=8)
    with pytest.raises(ValueError, match="one key"):
        dropout.keep_mask(jax.random.split(KEY, 2), 0.1, (4, 4))


@pytest.mark.slow
def test_deterministic_per_key():
    first = np.asarray(dropout.keep_mask(KEY, 0.1, (64, 128)))
    np.testing.assert_array_equal(first, dropout.keep_mask(KEY, 0.1, (64, 128)))
    assert not np.array_equal(first, dropout.keep_mask(jax.random.key(12), 0.1, (64, 128)))
    # A raw uint32[2] key is the same threefry key.
    np.testing.assert_array_equal(first, dropout.keep_mask(jax.random.key_data(KEY), 0.1, (64, 128)))


def test_a_mask_too_large_for_the_row_counter_is_a_clear_error():
    with pytest.raises(ValueError, match="dropout_bits = 32"):
        jax.eval_shape(lambda k: dropout.keep_mask(k, 0.1, (2**16, 2**16, 4)), KEY)


@pytest.mark.slow
def test_inverted_scaling_keeps_the_expectation():
    x = jnp.ones((256, 512), jnp.float32)
    y = np.asarray(dropout.dropout(x, 0.1, KEY))
    kept = y[y != 0]
    np.testing.assert_allclose(kept, 1 / dropout.keep_probability(0.1), rtol=1e-7)
    assert abs(y.mean() - 1.0) < 5 * np.sqrt(0.1 / 0.9 / y.size)
    bf16 = dropout.dropout(x.astype(jnp.bfloat16), 0.1, KEY)
    assert bf16.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(bf16) != 0, y != 0)


@pytest.mark.slow
@pytest.mark.parametrize("spec", [PartitionSpec("data"), PartitionSpec(None, None, "data")])
def test_identical_across_shardings(spec):
    """Leading-axis (batch) and last-axis (hidden, tensor-parallel) shardings draw the
    same mask as one device: the masks depend on the key and element index only."""
    mesh = sharding.Partitioner.create("data:8").mesh
    draw = jax.jit(lambda k: dropout.keep_mask(k, 0.1, (16, 32, 64)), out_shardings=NamedSharding(mesh, spec))
    np.testing.assert_array_equal(
        np.asarray(draw(KEY)), np.asarray(dropout.keep_mask(KEY, 0.1, (16, 32, 64)))
    )


def test_32_bits_is_flax_bernoulli():
    """`EncoderConfig.dropout_bits = 32`, kept to measure what 16 bits buy, is flax's mask."""
    assert dropout.keep_probability(0.1, bits=32) == 0.9
    np.testing.assert_array_equal(
        dropout.keep_mask(KEY, 0.1, (8, 64), bits=32), jax.random.bernoulli(KEY, 0.9, (8, 64))
    )
    x = jnp.ones((8, 64))
    flax_out = flax.linen.Dropout(0.1).apply({}, x, deterministic=False, rngs={"dropout": KEY})
    ours = dropout.Dropout(0.1, bits=32).apply({}, x, deterministic=False, rngs={"dropout": KEY})
    np.testing.assert_array_equal(ours, flax_out)


@pytest.mark.slow
def test_module_draws_from_the_dropout_stream_and_is_identity_when_deterministic():
    layer = dropout.Dropout(0.1)
    x = jnp.ones((4, 64))
    np.testing.assert_array_equal(layer.apply({}, x, deterministic=True), x)
    np.testing.assert_array_equal(dropout.Dropout(0.0).apply({}, x, deterministic=False), x)
    dropped = layer.apply({}, x, deterministic=False, rngs={"dropout": KEY})
    assert 0 < np.mean(np.asarray(dropped) == 0) < 0.3
    with pytest.raises(flax.errors.InvalidRngError):
        layer.apply({}, x, deterministic=False)


@pytest.mark.slow
def test_integer_threefry_is_jaxs():
    """The kernels' threefry2x32 (int32 adds, shifts and xors) gives JAX's bits."""
    from jax.extend.random import threefry2x32_p

    words = np.random.default_rng(0).integers(0, 2**32, size=(4, 4096), dtype=np.uint32)
    expected = threefry2x32_p.bind(*map(jnp.asarray, words))
    got = dropout.threefry2x32(*jax.lax.bitcast_convert_type(jnp.asarray(words), jnp.int32))
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(jax.lax.bitcast_convert_type(a, jnp.uint32), b)
