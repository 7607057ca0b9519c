"""Matmuls with operands in the compute dtype and float32 accumulation, forward and backward.

With bf16 compute, every matmul of the encoder and its heads takes bf16 operands and
accumulates in float32 (`preferred_element_type`), as TPU MXUs and GPU tensor cores do;
the result is cast back to bf16 only after the bias is added. The order matters on CPUs
with AVX512_BF16: XLA folds a cast straight after a dot into a bf16-output dot, which
takes a slow path. On an AMD EPYC (2 vCPUs) a 4096 x 768 x 3072 matmul ran at 302 GFLOP/s
with bf16 operands and float32 accumulation, 175 in float32 and 160 bf16 in and out.

JAX's own backward pass of such a dot gets a float32 cotangent (the dot's output dtype)
and multiplies it with the bf16 operands in float32, which converts them and takes the
float32 path. `einsum` below therefore has its own VJP: the cotangent is cast to the
compute dtype and both gradient matmuls are again bf16 x bf16 accumulated in float32,
the gradient of each operand returned in the operand's own dtype (a float32 kernel gets
a float32 gradient, not a rounded bf16 one).

In float32 compute all of this is the plain float32 einsum with JAX's own VJP, so
float32 results are bit for bit those of `jnp.einsum`.

`Dense` and `Einsum` are nn.Dense / nn.Einsum with these matmuls: same parameter names,
shapes and initialisers, so checkpoints and conversions do not see the difference.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp


def _check_spec(spec: str) -> tuple[str, str, str]:
    inputs, out = spec.split("->")
    a, b = inputs.split(",")
    for operand, other in ((a, b), (b, a)):
        # The VJP below swaps the spec's terms; that is exact only when each index of an
        # operand appears in the other operand or in the output (no index summed alone).
        if any(index not in other + out for index in operand):
            raise ValueError(f"einsum {spec!r}: an index of {operand!r} is in neither {other!r} nor {out!r}")
    return a, b, out


def _accumulating(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def _mixed_einsum(spec: str, a: jax.Array, b: jax.Array, dtype: jnp.dtype) -> jax.Array:
    return _accumulating(spec, a.astype(dtype), b.astype(dtype))


def _mixed_einsum_fwd(spec, a, b, dtype):
    return _mixed_einsum(spec, a, b, dtype), (a, b)


def _canonical(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """`_accumulating(spec, a, b)` with both operands laid out [batch, free, contracted]
    first. XLA's CPU runtime multiplies bf16 x bf16 -> float32 only in its YNNPACK kernels,
    which take the contracted dimensions last in the left operand; the Eigen fallback it
    uses otherwise (e.g. for a weight gradient, contracted over the leading rows of both
    operands) has no such kernel and fails."""
    a_spec, b_spec, out_spec = _check_spec(spec)
    batch = [i for i in a_spec if i in b_spec and i in out_spec]
    contracted = [i for i in a_spec if i in b_spec and i not in out_spec]
    a_free = [i for i in a_spec if i not in b_spec]
    b_free = [i for i in b_spec if i not in a_spec]
    a = jnp.transpose(a, [a_spec.index(i) for i in batch + a_free + contracted])
    b = jnp.transpose(b, [b_spec.index(i) for i in batch + b_free + contracted])
    nb, nc = len(batch), len(contracted)
    y = jax.lax.dot_general(
        a,
        b,
        (
            (tuple(range(a.ndim - nc, a.ndim)), tuple(range(b.ndim - nc, b.ndim))),
            (tuple(range(nb)), tuple(range(nb))),
        ),
        preferred_element_type=jnp.float32,
    )
    got = batch + a_free + b_free
    return jnp.transpose(y, [got.index(i) for i in out_spec])


def _mixed_einsum_bwd(spec, dtype, residuals, g):
    a, b = residuals
    a_spec, b_spec, out_spec = _check_spec(spec)
    g = g.astype(dtype)
    grad_a = _canonical(f"{out_spec},{b_spec}->{a_spec}", g, b.astype(dtype))
    grad_b = _canonical(f"{out_spec},{a_spec}->{b_spec}", g, a.astype(dtype))
    return grad_a.astype(a.dtype), grad_b.astype(b.dtype)


_mixed_einsum.defvjp(_mixed_einsum_fwd, _mixed_einsum_bwd)


def einsum(
    spec: str, a: jax.Array, b: jax.Array, dtype: jnp.dtype, *, accumulate_f32: bool = True
) -> jax.Array:
    """jnp.einsum(spec, a, b) with operands cast to `dtype` and a float32 result.

    Two operands, explicit output, no ellipsis, and no index summed within one operand
    (checked). Gradients: see the module docstring; float32 = jnp.einsum exactly.
    accumulate_f32=False is nn.Dense's way instead, kept to measure what this buys
    (`EncoderConfig.matmul_accumulation = 'compute'`): the result in `dtype`, JAX's VJP.
    """
    _check_spec(spec)
    if not accumulate_f32:
        return jnp.einsum(spec, a.astype(dtype), b.astype(dtype))
    if jnp.dtype(dtype) == jnp.float32:
        return _accumulating(spec, a.astype(jnp.float32), b.astype(jnp.float32))
    return _mixed_einsum(spec, a, b, jnp.dtype(dtype))


class _BiasedMatmul(nn.Module):
    """What Dense and Einsum share: a kernel and (unless `use_bias` is False) a bias in
    `param_dtype`, `einsum`, the bias added in float32 before the cast to `dtype`
    (keyword-only fields, so that the subclasses' own fields can come first)."""

    dtype: jnp.dtype = dataclasses.field(default=jnp.float32, kw_only=True)
    param_dtype: jnp.dtype = dataclasses.field(default=jnp.float32, kw_only=True)
    kernel_init: Callable = dataclasses.field(default=nn.initializers.lecun_normal(), kw_only=True)
    bias_init: Callable = dataclasses.field(default=nn.initializers.zeros_init(), kw_only=True)
    accumulate_f32: bool = dataclasses.field(default=True, kw_only=True)
    #: False: no bias parameter (DeBERTa's bias-free projections).
    use_bias: bool = dataclasses.field(default=True, kw_only=True)

    def _product(self, spec: str, inputs: jax.Array, kernel_shape: tuple[int, ...]) -> jax.Array:
        """einsum(spec, inputs, kernel) + bias, in `dtype`. The bias covers the output
        dimensions that come from the kernel, which must be the output's last ones (as
        nn.Einsum's bias)."""
        kernel = self.param("kernel", self.kernel_init, kernel_shape, self.param_dtype)
        y = einsum(spec, inputs, kernel, self.dtype, accumulate_f32=self.accumulate_f32)
        if not self.use_bias:
            return y.astype(self.dtype)
        _, kernel_spec, out_spec = _check_spec(spec)
        kernel_out = [index for index in out_spec if index in kernel_spec]
        if out_spec[-len(kernel_out) :] != "".join(kernel_out):
            raise ValueError(f"Einsum {spec!r}: the kernel's output indices must come last")
        bias = self.param("bias", self.bias_init, y.shape[-len(kernel_out) :], self.param_dtype)
        return (y + bias.astype(jnp.float32)).astype(self.dtype)


class Dense(_BiasedMatmul):
    """nn.Dense ([..., in] -> [..., features]) through `einsum`: kernel [in, features],
    bias [features]."""

    features: int

    @nn.compact
    def __call__(self, inputs: jax.Array) -> jax.Array:
        flat = inputs.reshape(-1, inputs.shape[-1])
        y = self._product("mi,io->mo", flat, (inputs.shape[-1], self.features))
        return y.reshape(*inputs.shape[:-1], self.features)


class Einsum(_BiasedMatmul):
    """nn.Einsum (`spec` of the inputs and a kernel of `shape`, plus a bias over the
    output's dimensions from the kernel) through `einsum`."""

    shape: tuple[int, ...]
    spec: str

    @nn.compact
    def __call__(self, inputs: jax.Array) -> jax.Array:
        return self._product(self.spec, inputs, self.shape)
