"""Dropout's PRNG choice (core/prng.py) drawing models/dropout.py's masks: deterministic,
distinct from threefry, sharding-proof."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from core import prng, sharding
from core.errors import ConfigError
from models import dropout

KEY = jax.random.key(3)


def _mask(name, key=KEY, out_shardings=None):
    draw = lambda k: dropout.keep_mask(jax.random.fold_in(prng.dropout_key(k, name), 5), 0.1, (16, 64))  # noqa: E731
    return np.asarray(jax.jit(draw, out_shardings=out_shardings)(key))


@pytest.mark.parametrize("name", ["rbg", "unsafe_rbg"])
def test_a_function_of_the_key_and_not_threefry(name):
    mask = _mask(name)
    assert np.array_equal(mask, _mask(name))
    assert not np.array_equal(mask, _mask(name, jax.random.key(4)))
    assert not np.array_equal(mask, _mask("threefry"))
    assert abs(mask.mean() - 0.9) < 0.03  # the keep rate asked for


@pytest.mark.parametrize("name", ["threefry", "rbg"])
def test_identical_across_shardings(name):
    mesh = sharding.Partitioner.create("data:8").mesh
    assert np.array_equal(_mask(name, out_shardings=NamedSharding(mesh, PartitionSpec("data"))), _mask(name))


def test_unknown_name_is_a_clear_error():
    with pytest.raises(ConfigError, match="run.dropout_prng must be one of"):
        prng.check_dropout_prng("philox")
