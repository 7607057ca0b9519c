"""A Flax module's init and apply as one compiled program each.

Called outside jit, `module.apply(...)` runs op by op, and a fresh clone (cold compilation
cache) compiles every op on its own: tens of seconds for a tiny model. Tests that compare
model outputs use these instead. Python bools, ints, strings and None among the keyword
arguments (deterministic=..., a method name) are passed as static values."""

from __future__ import annotations

import jax


def _split(kwargs):
    static = {k: v for k, v in kwargs.items() if v is None or isinstance(v, (bool, int, str))}
    return static, {k: v for k, v in kwargs.items() if k not in static}


def apply(module, variables, *args, **kwargs):
    """`module.apply(variables, *args, **kwargs)`, jitted."""
    static, dynamic = _split(kwargs)
    return jax.jit(lambda v, a, d: module.apply(v, *a, **d, **static))(variables, args, dynamic)


def init(module, rng, *args, **kwargs):
    """`module.init(rng, *args, **kwargs)`, jitted."""
    static, dynamic = _split(kwargs)
    return jax.jit(lambda r, a, d: module.init(r, *a, **d, **static))(rng, args, dynamic)
