"""EncoderConfig.scan_layers: the layers as one lax.scan give the unrolled loop's numbers,
on one device and on a mesh, with the same parameter tree."""

import dataclasses

import flax.linen as nn
import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from core.errors import ConfigError
from models.encoder import EncoderConfig
from models.pretraining import BertPretrainingModel
from tests import jitted, tiny

NO_DROPOUT = dataclasses.replace(tiny.TINY, num_layers=3, dropout_rate=0.0, attention_dropout_rate=0.0)


def _loss_and_grads(config, variables, batch):
    """(loss, gradients) of test_models' train-step work (dropout on) for `config`."""
    return tiny.loss_and_grads_step(BertPretrainingModel(config))(variables, batch, tiny.RNG)[1]


@pytest.mark.slow
@pytest.mark.parametrize("sharing, remat", [("none", "none"), ("all", "none"), ("none", "dots_saveable")])
@pytest.mark.extended(keep=["none-none"])
def test_scan_equals_the_unrolled_layers(sharing, remat):
    loop = dataclasses.replace(NO_DROPOUT, sharing=sharing, remat_policy=remat)
    scan = dataclasses.replace(loop, scan_layers=True)
    batch = tiny.make_batch(batch_size=4)
    variables = jitted.init(BertPretrainingModel(loop), tiny.RNG, batch, deterministic=True)
    # The same tree, initialised the same: checkpoints and conversions do not see the option.
    scanned_variables = jitted.init(BertPretrainingModel(scan), tiny.RNG, batch, deterministic=True)
    jax.tree.map(np.testing.assert_array_equal, scanned_variables, variables)
    expected = _loss_and_grads(loop, variables, batch)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, atol=1e-7),
        _loss_and_grads(scan, variables, batch),
        expected,
    )


@pytest.mark.slow
@pytest.mark.extended
def test_scan_with_dropout_draws_each_layer_its_own_masks():
    config = dataclasses.replace(tiny.TINY, num_layers=3, scan_layers=True)
    batch = tiny.make_batch(batch_size=4)
    variables = jitted.init(BertPretrainingModel(config), tiny.RNG, batch, deterministic=True)
    outputs, (loss, grads) = tiny.loss_and_grads_step(BertPretrainingModel(config))(
        variables, batch, tiny.RNG
    )
    deterministic = outputs["mlm_logits"].mean() + outputs["sentence_logits"].mean()
    assert np.isfinite(loss) and loss != deterministic
    assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))


@pytest.mark.slow
@pytest.mark.extended
def test_scan_on_a_mesh_equals_one_device():
    config = dataclasses.replace(NO_DROPOUT, scan_layers=True)
    model = BertPretrainingModel(config)
    batch = tiny.make_batch(batch_size=8)
    variables = jitted.init(model, tiny.RNG, batch, deterministic=True)
    expected = _loss_and_grads(config, variables, batch)
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
    init = lambda rng: jitted.init(model, rng, batch, deterministic=True)  # noqa: E731
    with jax.set_mesh(mesh), nn.logical_axis_rules(tiny.RULES):
        shardings = nn.logical_to_mesh_sharding(
            nn.get_partition_spec(jax.eval_shape(init, tiny.RNG)), mesh, tiny.RULES
        )
        sharded = jax.jit(init, out_shardings=shardings)(tiny.RNG)
        sharded_batch = jax.device_put(batch, NamedSharding(mesh, PartitionSpec(("data", "fsdp"))))
        actual = _loss_and_grads(config, sharded, sharded_batch)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5), jax.device_get(actual), expected)


def test_scan_with_partial_sharing_is_refused():
    with pytest.raises(ConfigError, match="scan_layers is not implemented for sharing='attention'"):
        EncoderConfig(sharing="attention", scan_layers=True)
