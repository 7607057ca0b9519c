"""models/matmul.py: float32 accumulation with bf16 operands, forward and backward."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import matmul
from models.pretraining import BertPretrainingModel
from tests import jitted, tiny

SPECS = {  # every contraction the encoder and its heads run, with small sizes
    "mi,io->mo": ((12, 16), (16, 24)),
    "blh,hnd->blnd": ((2, 6, 16), (16, 4, 8)),
    "blnd,ndh->blh": ((2, 6, 4, 8), (4, 8, 16)),
    "btnd,bsnd->bnts": ((2, 6, 4, 8), (2, 6, 4, 8)),
    "bnts,bsnd->btnd": ((2, 4, 6, 6), (2, 6, 4, 8)),
    "bpe,ve->bpv": ((2, 3, 16), (40, 16)),
}


def _operands(spec, seed=0):
    rs = np.random.RandomState(seed)
    return [jnp.asarray(rs.randn(*shape), jnp.float32) for shape in SPECS[spec]]


def _loss_and_grads(fn, a, b):
    weights = jnp.asarray(np.random.RandomState(9).randn(*jax.eval_shape(fn, a, b).shape), jnp.float32)
    return jax.value_and_grad(lambda a, b: jnp.sum(fn(a, b).astype(jnp.float32) * weights), (0, 1))(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("spec", list(SPECS))
def test_float32_is_jnp_einsum_exactly(spec):
    a, b = _operands(spec)
    ours = _loss_and_grads(lambda a, b: matmul.einsum(spec, a, b, jnp.float32), a, b)
    reference = _loss_and_grads(lambda a, b: jnp.einsum(spec, a, b), a, b)
    for x, y in zip(jax.tree.leaves(ours), jax.tree.leaves(reference), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.slow
@pytest.mark.parametrize("spec", list(SPECS))
def test_bf16_operands_float32_results_and_gradients(spec):
    a, b = _operands(spec)
    out = jax.jit(lambda a, b: matmul.einsum(spec, a, b, jnp.bfloat16))(a, b)
    assert out.dtype == jnp.float32
    # Exactly the float32 product of the bf16-rounded operands (float32 accumulation).
    rounded = [x.astype(jnp.bfloat16).astype(jnp.float32) for x in (a, b)]
    np.testing.assert_allclose(out, jnp.einsum(spec, *rounded), rtol=1e-5, atol=1e-5)
    # Gradients: float32 operands get float32 gradients; they are the float32 ones up to
    # the bf16 rounding of operands and cotangent (about 2^-8 relative, summed over K terms).
    (loss, grads) = jax.jit(
        lambda a, b: _loss_and_grads(lambda a, b: matmul.einsum(spec, a, b, jnp.bfloat16), a, b)
    )(a, b)
    _, reference = _loss_and_grads(lambda a, b: jnp.einsum(spec, a, b), a, b)
    for grad, ref in zip(grads, reference, strict=True):
        assert grad.dtype == jnp.float32
        scale = float(jnp.max(jnp.abs(ref)))
        np.testing.assert_allclose(grad, ref, atol=0.03 * scale)
    # bf16 operands get bf16 gradients.
    _, grads = _loss_and_grads(
        lambda a, b: matmul.einsum(spec, a, b, jnp.bfloat16), a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    )
    assert [g.dtype for g in grads] == [jnp.bfloat16, jnp.bfloat16]


def test_a_spec_summing_within_one_operand_is_refused():
    with pytest.raises(ValueError, match="in neither"):
        matmul.einsum("ij,jk->k", *_operands("mi,io->mo"), jnp.float32)


@pytest.mark.slow
def test_dense_and_einsum_are_flax_modules_parameter_for_parameter():
    x = jnp.asarray(np.random.RandomState(1).randn(2, 6, 16), jnp.float32)
    init = nn.initializers.truncated_normal(0.02)
    for ours, theirs in (
        (matmul.Dense(24, kernel_init=init), nn.Dense(24, kernel_init=init)),
        (
            matmul.Einsum((16, 4, 8), "blh,hnd->blnd", kernel_init=init),
            nn.Einsum((16, 4, 8), "blh,hnd->blnd", kernel_init=init),
        ),
    ):
        params = theirs.init(tiny.RNG, x)
        assert jax.tree.map(jnp.shape, ours.init(tiny.RNG, x)) == jax.tree.map(jnp.shape, params)
        assert jax.tree.all(jax.tree.map(jnp.array_equal, ours.init(tiny.RNG, x), params))
        np.testing.assert_allclose(ours.apply(params, x), theirs.apply(params, x), rtol=1e-6, atol=1e-6)


def _model_loss_and_grads(config):
    """(loss, gradients) of test_models' train-step work (dropout on) for `config`."""
    model = BertPretrainingModel(config)
    batch = tiny.make_batch(batch_size=4)
    _, loss_and_grads = tiny.loss_and_grads_step(model)(
        jitted.init(model, tiny.RNG, batch, deterministic=True), batch, tiny.RNG
    )
    return loss_and_grads


@pytest.mark.slow
@pytest.mark.extended
def test_model_loss_and_gradients_against_the_float32_step():
    reference = _model_loss_and_grads(tiny.TINY)
    # float32 compute: the same math whichever accumulation is asked for.
    same = _model_loss_and_grads(dataclasses.replace(tiny.TINY, matmul_accumulation="compute"))
    for x, y in zip(jax.tree.leaves(same), jax.tree.leaves(reference), strict=True):
        np.testing.assert_array_equal(x, y)
    # bf16 compute: loss and the whole gradient within bf16 tolerance of float32 (the
    # gradient as one vector: some leaves, e.g. key biases, are zero up to round-off).
    flat = lambda tree: jnp.concatenate([x.ravel() for x in jax.tree.leaves(tree)])  # noqa: E731
    for accumulation in ("float32", "compute"):
        config = dataclasses.replace(tiny.TINY, dtype="bfloat16", matmul_accumulation=accumulation)
        loss, grads = _model_loss_and_grads(config)
        np.testing.assert_allclose(loss, reference[0], rtol=0.02)
        error = jnp.linalg.norm(flat(grads) - flat(reference[1])) / jnp.linalg.norm(flat(reference[1]))
        assert error < 0.02, (accumulation, error)
