"""The attention paths (models/attention.py): each equals the explicit softmax on padded and
packed rows, 'auto' picks by platform, and splash attention (Pallas interpret mode here)
runs sharded on a mesh and lowers for a TPU."""

import dataclasses
import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench import attention_check
from core import sharding
from models import attention
from models.attention import KeyMask, attention_mask, explicit_attention
from models.encoder import Encoder
from tests.tiny import RNG, RULES, TINY, L

SPLASH_L = attention.SPLASH_BLOCK  # splash's smallest length


def _rows(length: int, batch: int = 2):
    """(q, k, v [batch, length, 2, 16] float32, input_mask, example_ids): row 0 padded at the end,
    row 1 two packed examples then padding; example_ids None-able by the caller."""
    rs = np.random.RandomState(0)
    q, k, v = (jnp.asarray(rs.normal(size=(batch, length, 2, 16)), jnp.float32) for _ in range(3))
    input_mask = np.ones((batch, length), np.int32)
    input_mask[0, length - length // 3 :] = 0
    input_mask[1, length - 5 :] = 0
    example_ids = np.where(np.arange(length) < length // 2, 1, 2)[None].repeat(batch, 0) * input_mask
    return q, k, v, input_mask, example_ids


def _real(x, input_mask):
    """x [B, L, ...] at real tokens only: padding queries' outputs differ between paths, unread."""
    return np.asarray(x, np.float32)[np.asarray(input_mask, bool)]


@pytest.mark.slow
@pytest.mark.parametrize("dtype, atol", [(jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)])
def test_explicit_attention_matches_dot_product_attention(dtype, atol):
    q, k, v, input_mask, example_ids = _rows(L)
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    for mask in (attention_mask(input_mask), attention_mask(input_mask, example_ids)):
        expected = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
        actual = explicit_attention(q, k, v, mask)
        assert actual.dtype == expected.dtype == dtype
        np.testing.assert_allclose(
            np.asarray(actual, np.float32), np.asarray(expected, np.float32), atol=atol
        )
    dropped = explicit_attention(q, k, v, mask, dropout_rate=0.5, dropout_rng=RNG)
    assert not np.allclose(np.asarray(dropped, np.float32), np.asarray(actual, np.float32))


@pytest.mark.slow
def test_padding_as_lengths_is_the_padding_mask():
    """cuDNN takes padding as per-row lengths (KeyMask.lengths); XLA's path reads the same
    argument, so the form is checked here and cuDNN itself on a GPU (docs/performance.md)."""
    q, k, v, input_mask, _ = _rows(L)
    mask = KeyMask(jnp.asarray(input_mask))
    by_lengths = jax.nn.dot_product_attention(
        q, k, v, key_value_seq_lengths=mask.lengths(), implementation="xla"
    )
    np.testing.assert_allclose(by_lengths, explicit_attention(q, k, v, mask.dense()), atol=1e-6)


def _splash_and_explicit(q, k, v, mask: KeyMask):
    """Outputs and the gradients of sum(out * w) for q, k, v: splash (interpreted) and explicit."""
    weights = jnp.asarray(np.random.RandomState(1).normal(size=q.shape), jnp.float32)

    def loss(fn):
        return lambda q, k, v: (
            fn(q, k, v).astype(jnp.float32) * weights * mask.input_mask[..., None, None]
        ).sum()

    splash = lambda q, k, v: attention.splash_attention(q, k, v, mask, interpret=True)  # noqa: E731
    explicit = lambda q, k, v: explicit_attention(q, k, v, mask.dense())  # noqa: E731
    return [
        (fn(q, k, v), jax.grad(loss(fn), argnums=(0, 1, 2))(q, k, v))
        for fn in (jax.jit(splash), jax.jit(explicit))
    ]


@pytest.mark.slow
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.extended(keep=["False"])
def test_splash_attention_equals_explicit_attention(packed):
    """Splash (Pallas interpret mode) against the explicit softmax, forward and the gradients of
    q, k and v, at real tokens; packed rows: a token never sees another example."""
    q, k, v, input_mask, example_ids = _rows(SPLASH_L)
    mask = KeyMask(jnp.asarray(input_mask), jnp.asarray(example_ids) if packed else None)
    (out, grads), (expected, expected_grads) = _splash_and_explicit(q, k, v, mask)
    np.testing.assert_allclose(_real(out, input_mask), _real(expected, input_mask), atol=2e-6)
    for grad, expected_grad in zip(grads, expected_grads):
        np.testing.assert_allclose(grad, expected_grad, atol=2e-5)
    if packed:  # another example's keys and values change nothing in the first example
        first = (np.arange(SPLASH_L) < SPLASH_L // 2)[None, :, None, None]
        other_k, other_v = (jnp.where(first, x, 3.0 * x + 1.0) for x in (k, v))
        moved = attention.splash_attention(q, other_k, other_v, mask, interpret=True)
        np.testing.assert_allclose(moved[1, : SPLASH_L // 2], out[1, : SPLASH_L // 2], atol=2e-6)
        assert not np.allclose(moved[1, SPLASH_L // 2 : -5], out[1, SPLASH_L // 2 : -5])


@pytest.mark.slow
@pytest.mark.extended
def test_splash_attention_in_the_encoder_on_a_mesh(caplog):
    """The encoder with attention_implementation='splash' on a data x fsdp x tensor mesh of 8
    devices (the kernel in shard_map over rows and heads) equals the explicit path on one."""
    config = dataclasses.replace(TINY, max_position_embeddings=SPLASH_L, dropout_rate=0.0)
    _, _, _, input_mask, example_ids = _rows(SPLASH_L, batch=4)
    ids = np.random.RandomState(2).randint(1, TINY.vocab_size, input_mask.shape) * input_mask
    inputs = tuple(jnp.asarray(x, jnp.int32) for x in (ids, input_mask, np.zeros_like(ids)))

    def run(implementation, partitioner):
        model = Encoder(dataclasses.replace(config, attention_implementation=implementation))

        def forward(params):
            out = model.apply(params, *inputs, example_ids=jnp.asarray(example_ids), deterministic=True)
            return out.sequence_output

        def loss(params):
            return (forward(params) * jnp.asarray(input_mask)[..., None]).sum()

        with partitioner:
            params = jax.jit(model.init, static_argnames="deterministic")(
                RNG, *inputs, example_ids=jnp.asarray(example_ids), deterministic=True
            )
            return jax.jit(forward)(params), jax.jit(jax.grad(loss))(params)

    attention.log_choice.cache_clear()  # once per process: forget other tests' decisions
    mesh = sharding.Partitioner(sharding.make_mesh("data:2,fsdp:2,tensor:2"), RULES)
    one = sharding.Partitioner(sharding.make_mesh(None, jax.devices()[:1]), RULES)
    with caplog.at_level(logging.INFO, logger="models.attention"):
        splash_out, splash_grads = run("splash", mesh)
    explicit_out, explicit_grads = run("explicit", one)
    np.testing.assert_allclose(_real(splash_out, input_mask), _real(explicit_out, input_mask), atol=2e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-4), splash_grads, explicit_grads)
    # Two layers, traced for the forward pass and again for the gradient: logged once.
    assert (
        caplog.messages.count("attention: splash (splash in Pallas interpret mode on cpu (slow: for tests))")
        == 1
    )


def test_splash_attention_lowers_for_tpu():
    """The kernel as the encoder calls it on a TPU (Mosaic, not interpreted), forward and
    backward, with segment ids, at BERT-large's head width and length 512 in bf16."""
    shape = jax.ShapeDtypeStruct((2, 512, 4, 64), jnp.bfloat16)
    rows = jax.ShapeDtypeStruct((2, 512), jnp.int32)

    def loss(q, k, v, input_mask, example_ids):
        out = attention.splash_attention(q, k, v, KeyMask(input_mask, example_ids), interpret=False)
        return out.astype(jnp.float32).sum()

    exported = jax.export.export(jax.jit(jax.grad(loss, argnums=(0, 1, 2))), platforms=["tpu"])(
        shape, shape, shape, rows, rows
    )
    assert "tpu_custom_call" in exported.mlir_module()


@pytest.mark.parametrize(
    "requested, platform, dtype, head_dim, length, dropout, expected",
    [
        ("auto", "cuda", "bfloat16", 64, 512, False, "cudnn"),
        ("auto", "cuda", "float32", 64, 512, False, "xla"),  # cuDNN's flash kernel: bf16/fp16
        ("auto", "cuda", "bfloat16", 256, 512, False, "xla"),
        ("auto", "gpu", "bfloat16", 64, 512, False, "xla"),  # ROCm, or an NVIDIA GPU before sm80
        ("auto", "tpu", "bfloat16", 64, 512, False, "splash"),
        ("auto", "tpu", "bfloat16", 64, 200, False, "xla"),  # not a multiple of splash's block
        ("auto", "cpu", "float32", 64, 512, False, "xla"),
        ("auto", "cuda", "bfloat16", 64, 512, True, "explicit"),  # BERT's attention dropout
        ("cudnn", "cuda", "bfloat16", 64, 512, True, "explicit"),
        ("cudnn", "tpu", "bfloat16", 64, 512, False, "xla"),  # a config trained on a GPU, on a TPU
        ("splash", "tpu", "bfloat16", 64, 200, False, "xla"),
        ("explicit", "tpu", "bfloat16", 64, 512, False, "explicit"),
        ("splash", "cpu", "float32", 64, 128, False, "splash"),  # interpret mode: the tests
    ],
)
def test_auto_picks_the_platforms_kernel(requested, platform, dtype, head_dim, length, dropout, expected):
    chosen, reason = attention.choose(
        requested, platform=platform, dtype=dtype, head_dim=head_dim, length=length, dropout=dropout
    )
    assert chosen == expected and reason


def test_configs_written_before_auto_load_as_auto():
    assert dataclasses.replace(TINY, attention_implementation=None).attention_implementation == "auto"


@pytest.mark.slow
@pytest.mark.extended
def test_attention_check_compares_and_times_every_path(capsys):
    """bench.attention_check, what an accelerator run calls first: here 'auto' is XLA's path."""
    argv = ["--batch=2", "--seq=128", "--heads=2", "--head_dim=32", "--dtype=float32", "--steps=1"]
    assert attention_check.main([*argv, "--paths=auto,splash,flash+dropout"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["path"] for line in lines] == ["xla", "splash", "flash+dropout", "explicit+dropout"]
    for line in lines[:3]:  # flash+dropout against the explicit path with the same dropout
        for rows in ("padded", "packed"):
            errors = line[rows]["relative_error"]
            assert set(errors) == {"out", "dq", "dk", "dv"} and max(errors.values()) < 2e-5
    assert all(line["ms_forward_backward"] > 0 for line in lines)
