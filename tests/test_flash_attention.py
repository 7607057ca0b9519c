"""Flash attention with dropout (models/flash_attention.py), in Pallas interpret mode here, both
kernel designs (TPU's grid, Triton's loop): it equals the explicit path with the same dropout
masks (outputs and gradients; padded, packed and odd-length rows; float32 and bf16; quarter
and wide key tiles), its masks are models/dropout.py's whatever the tiling and pass, it trains
as the explicit path does on a mesh, and it lowers for TPU and GPU. Mosaic's own compilation
for every TPU generation: tests/test_tpu_compile.py."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core import sharding
from core.errors import ConfigError
from data.pipeline_config import PipelineConfig
from models import attention, dropout, flash_attention
from models.attention import KeyMask
from pretrain.objectives import MaskedLM
from tests import mesh_training

KEY = jax.random.key(5)
B, N = 2, 3


def _rows(length: int, head_dim: int, dtype, seed: int = 0):
    """q, k, v [B, length, N, head_dim] and a KeyMask: row 0 padded at the end, row 1 two
    packed examples then padding (example_ids set)."""
    rs = np.random.RandomState(seed)
    q, k, v = (jnp.asarray(rs.normal(size=(B, length, N, head_dim)), dtype) for _ in range(3))
    input_mask = np.ones((B, length), np.int32)
    input_mask[0, length - length // 3 :] = 0
    input_mask[1, length - 5 :] = 0
    example_ids = np.where(np.arange(length) < length // 2, 1, 2)[None].repeat(B, 0) * input_mask
    return q, k, v, KeyMask(jnp.asarray(input_mask), jnp.asarray(example_ids))


def _explicit(q, k, v, mask, rate):
    """The explicit path, with 0 for a query that has no key to attend (a padding query of a
    packed row), as the kernel gives (the explicit softmax spreads it over every key)."""
    dense = mask.dense()
    out = attention.explicit_attention(q, k, v, dense, dropout_rate=rate, dropout_rng=KEY)
    has_key = jnp.broadcast_to(dense, (q.shape[0], 1, q.shape[1], q.shape[1])).any(-1)
    return jnp.where(jnp.swapaxes(has_key, 1, 2)[..., None], out, 0)


def _flash(q, k, v, mask, rate, blocks=None, key=KEY, backend="interpret"):
    key_ids = mask.segment_ids()
    query_ids = key_ids if mask.example_ids is not None else jnp.ones_like(key_ids)
    return flash_attention.flash_attention(
        q,
        k,
        v,
        flash_attention.SegmentIds(query_ids, key_ids),
        dropout_rate=rate,
        dropout_key=key if rate else None,
        backend=backend,
        block_sizes=blocks,
    )


def _value_and_grads(fn, q, k, v, mask):
    """fn's output, and the gradients of q, k, v of a loss reading every output (padding
    queries' too, which training never reads)."""
    weights = jnp.asarray(np.random.RandomState(1).normal(size=q.shape), jnp.float32)

    def loss(q, k, v):
        return jnp.sum(fn(q, k, v).astype(jnp.float32) * weights)

    return fn(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)


GRID, LOOP = "interpret", "interpret_triton"  # the TPU design, Triton's, in the interpreter
BLOCKS = flash_attention.BlockSizes


@pytest.mark.parametrize(
    "backend, length, dtype, packed, rate, blocks, atol",
    [
        # odd length, packed rows, dropout: several tiles of unequal sizes (the backward
        # pass's 8 x 8), quarter-wide key tiles, padding queries with no key to attend
        (GRID, 37, jnp.float32, True, 0.1, BLOCKS(16, 8, 8, 8), 2e-6),
        (GRID, 24, jnp.float32, False, 0.0, BLOCKS(8, 8), 2e-6),
        # the default blocks: one tile, the four quarters as one wide tile
        (GRID, 37, jnp.bfloat16, False, 0.1, None, 3e-2),
        (GRID, 37, jnp.float32, True, 0.1, None, 2e-6),
        (LOOP, 37, jnp.float32, True, 0.1, BLOCKS(16, 16), 2e-6),
        (LOOP, 37, jnp.bfloat16, False, 0.1, None, 3e-2),
    ],
    ids=["f32-packed-dropout", "f32-padded", "bf16-padded-dropout", "f32-wide", "loop-f32", "loop-bf16"],
)
@pytest.mark.slow
@pytest.mark.extended(keep=["f32-packed-dropout", "f32-padded", "f32-wide", "loop-f32"])
def test_equals_explicit_attention_with_the_same_dropout(backend, length, dtype, packed, rate, blocks, atol):
    q, k, v, mask = _rows(length, 16, dtype)
    if not packed:
        mask = KeyMask(mask.input_mask)
    flash = jax.jit(
        functools.partial(
            _value_and_grads, lambda q, k, v: _flash(q, k, v, mask, rate, blocks, backend=backend)
        )
    )
    explicit = jax.jit(functools.partial(_value_and_grads, lambda q, k, v: _explicit(q, k, v, mask, rate)))
    (out, grads), (expected, expected_grads) = flash(q, k, v, mask), explicit(q, k, v, mask)
    assert out.dtype == dtype and out.shape == q.shape
    np.testing.assert_allclose(
        np.asarray(out, np.float32), np.asarray(expected, np.float32), atol=atol, rtol=atol
    )
    for name, a, b in zip("qkv", grads, expected_grads):
        scale = np.abs(np.asarray(b, np.float32)).max()
        np.testing.assert_allclose(
            np.asarray(a, np.float32), np.asarray(b, np.float32), atol=atol * scale * 4, err_msg=name
        )
    if packed:
        # No attention across examples: moving the second example's keys and values leaves the
        # first example's outputs as they were, and changes the second's.
        first = (np.arange(length) < length // 2)[None, :, None, None]
        moved_k, moved_v = (jnp.where(first, x, 3.0 * x + 1.0) for x in (k, v))
        moved = flash(q, moved_k, moved_v, mask)[0]
        np.testing.assert_array_equal(np.asarray(moved)[1, : length // 2], np.asarray(out)[1, : length // 2])
        assert not np.allclose(np.asarray(moved)[1, length // 2 : -5], np.asarray(out)[1, length // 2 : -5])


@pytest.mark.slow
@pytest.mark.extended
def test_backward_blocks_other_than_the_forwards_give_the_same_gradients():
    """The backward pass tiles with its own blocks (on Triton, half the forward's): the
    gradients stay the explicit path's, the mask being a function of the indices alone."""
    q, k, v, mask = _rows(37, 16, jnp.float32)
    flash = functools.partial(
        _value_and_grads, lambda q, k, v: _flash(q, k, v, mask, 0.1, BLOCKS(16, 16, 8, 8))
    )
    explicit = functools.partial(_value_and_grads, lambda q, k, v: _explicit(q, k, v, mask, 0.1))
    (_, grads), (_, expected) = jax.jit(flash)(q, k, v, mask), jax.jit(explicit)(q, k, v, mask)
    for name, a, b in zip("qkv", grads, expected):
        np.testing.assert_allclose(a, b, atol=1e-5 * np.abs(b).max(), err_msg=name)


M = 64  # the mask tests' length and head width: values one-hot over the keys


@functools.partial(jax.jit, static_argnames=("blocks", "backend"))
def _kernel_masks(key, blocks, backend=GRID):
    """The kernel's keep masks [B, N, M, M], read from its forward pass and from its dk/dv pass.

    With q = 0 every key gets probability 1/M; with v[s] = e_s the output's column s is the
    dropped probability of key s, and with do[t] = e_t the gradient dv[s, t] is that of
    (query t, key s) again, from the backward kernel's own hash.
    """
    q = jnp.zeros((B, M, N, M), jnp.float32)
    onehot = jnp.broadcast_to(jnp.eye(M, dtype=jnp.float32)[None, :, None, :], q.shape)
    mask = KeyMask(jnp.ones((B, M), jnp.int32))
    out, pullback = jax.vjp(lambda v: _flash(q, q, v, mask, 0.5, blocks, key, backend), onehot)
    (dv,) = pullback(onehot)
    return jnp.swapaxes(out, 1, 2) > 0, jnp.einsum("bsnt->bnts", dv) > 0


@pytest.mark.slow
@pytest.mark.extended
def test_masks_are_the_explicit_paths_in_both_passes_and_every_tiling():
    expected = np.asarray(dropout.keep_mask(KEY, 0.5, (B, N, M, M)))
    # The grid design with quarter tiles, then one wide tile of all four (32, 16), and the
    # loop design.
    tilings = ((GRID, BLOCKS(8, 8)), (GRID, BLOCKS(16, 8)), (GRID, BLOCKS(32, 16)), (LOOP, BLOCKS(16, 16)))
    for backend, blocks in tilings:
        forward, backward = _kernel_masks(KEY, blocks, backend)
        np.testing.assert_array_equal(forward, expected, err_msg=f"{backend} {blocks}")
        np.testing.assert_array_equal(backward, expected, err_msg=f"{backend} {blocks}")
    # The statistics of the kernel's masks: keep rate within binomial bounds, and no
    # dependence between heads, rows or steps (another step's key).
    p = dropout.keep_probability(0.5)
    assert abs(expected.mean() - p) < 5 * np.sqrt(p * (1 - p) / expected.size)
    other_step = np.asarray(_kernel_masks(jax.random.fold_in(KEY, 1), BLOCKS(16, 8))[0])
    pairs = {
        "heads": (expected[:, 0], expected[:, 1]),
        "rows": (expected[0], expected[1]),
        "steps": (expected, other_step),
    }
    for name, (a, b) in pairs.items():
        both = np.mean(a & b)
        assert abs(both - p * p) < 5 * np.sqrt(p * p * (1 - p * p) / a.size), name


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["tpu", "cuda"])
@pytest.mark.parametrize("head_dim, length", [(64, 512), (128, 512), (64, 128)])
@pytest.mark.extended(keep=["64-128-tpu", "64-128-cuda"])
def test_lowers_for_tpu_and_gpu(platform, head_dim, length):
    """Forward and backward, bf16, with dropout and segment ids, at BERT's lengths, lowered
    for Mosaic (TPU) or Triton (GPU) rather than interpreted: the Pallas-level constraints
    of each kernel language fail here, not on a pod (Mosaic's and Triton's own compilation
    runs on the device). The keys go in as four quarters of L / 4, unpadded at 128 too."""
    backend = flash_attention.default_backend(platform)
    shape = jax.ShapeDtypeStruct((2, length, 4, head_dim), jnp.bfloat16)
    ids = jax.ShapeDtypeStruct((2, length), jnp.int32)

    def loss(q, k, v, query_ids, key_ids):
        segment_ids = flash_attention.SegmentIds(query_ids, key_ids)
        out = flash_attention.flash_attention(
            q, k, v, segment_ids, dropout_rate=0.1, dropout_key=KEY, backend=backend
        )
        return out.astype(jnp.float32).sum()

    checks = (
        [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")] if platform == "cuda" else []
    )
    exported = jax.export.export(
        jax.jit(jax.grad(loss, argnums=(0, 1, 2))), platforms=[platform], disabled_checks=checks
    )(shape, shape, shape, ids, ids)
    module = exported.mlir_module()
    kernels = module.count("tpu_custom_call" if platform == "tpu" else "xla.gpu.triton")
    assert kernels >= 3, module[:2000]  # forward, dk/dv, dq
    assert f"tensor<2x4x4x{length // 4}x{head_dim}xbf16>" in module


def test_bad_settings_are_clear_errors():
    q, k, v, mask = _rows(8, 4, jnp.float32)
    ids = flash_attention.SegmentIds(mask.segment_ids(), mask.segment_ids())
    with pytest.raises(ValueError, match="backend must be one of"):
        flash_attention.flash_attention(q, k, v, ids, backend="cuda")
    with pytest.raises(ValueError, match="draws its dropout with threefry"):
        _flash(q, k, v, mask, 0.1, key=jax.random.key(0, impl="rbg"))
    with pytest.raises(ValueError, match="drops everything"):
        _flash(q, k, v, mask, 1.0)
    with pytest.raises(ConfigError, match="BlockSizes.block_k must be a positive multiple of 8, got 12"):
        BLOCKS(8, 12)
    with pytest.raises(ValueError, match="block_k must be a power of two >= 16 on interpret_triton, got 24"):
        _flash(q, k, v, mask, 0.1, BLOCKS(16, 24), backend=LOOP)
    with pytest.raises(ValueError, match="block_q_backward .16. must divide block_q .24."):
        _flash(q, k, v, mask, 0.1, BLOCKS(24, 8, 16, 8))
    with pytest.raises(ValueError, match="wide_keys needs the TPU design and one key block per quarter"):
        _flash(q, k, v, mask, 0.1, BLOCKS(wide_keys=True), backend=LOOP)
    # Mosaic's tiles: a lane-wide block is a multiple of 128 or covers the row.
    with pytest.raises(ValueError, match="block_k must be a multiple of 128 or cover the row .128. on tpu"):
        flash_attention.flash_attention_heads_first(
            *(jnp.zeros((1, 1, 512, 64)),) * 3,
            flash_attention.SegmentIds(*(jnp.ones((1, 512), jnp.int32),) * 2),
            rows=jnp.zeros((1,), jnp.int32),
            backend="tpu",
            block_sizes=BLOCKS(block_k=64),
        )


@pytest.mark.slow
def test_a_non_threefry_dropout_key_takes_the_explicit_path(caplog):
    """run.dropout_prng = 'rbg' with 'flash': the explicit path (rbg's masks), saying why."""
    q, k, v, mask = _rows(8, 4, jnp.float32)
    rbg = jax.random.key(0, impl="rbg")
    attention.log_choice.cache_clear()
    with caplog.at_level("INFO", logger="models.attention"):
        out = attention.attend("flash", q, k, v, mask, dropout_rate=0.1, dropout_rng=rbg)
    expected = attention.explicit_attention(q, k, v, mask.dense(), dropout_rate=0.1, dropout_rng=rbg)
    np.testing.assert_array_equal(out, expected)
    assert any("flash attention hashes threefry keys" in m for m in caplog.messages)


@pytest.mark.parametrize(
    "platform, head_dim, dropout_bits, dropout, expected",
    [
        ("cpu", 16, 16, True, "flash"),
        ("tpu", 64, 16, True, "flash"),
        ("cuda", 64, 16, True, "flash"),
        ("cuda", 48, 16, True, "explicit"),  # Triton tiles are powers of two
        ("gpu", 64, 16, True, "explicit"),  # ROCm, or NVIDIA before sm80: not tried
        ("tpu", 64, 32, True, "explicit"),  # flax's 32-bit masks: the explicit path only
        ("tpu", 64, 32, False, "flash"),
    ],
)
def test_flash_is_chosen_only_when_asked_and_able(platform, head_dim, dropout_bits, dropout, expected):
    chosen, reason = attention.choose(
        "flash",
        platform=platform,
        dtype="bfloat16",
        head_dim=head_dim,
        length=512,
        dropout=dropout,
        dropout_bits=dropout_bits,
    )
    assert chosen == expected, reason
    # 'auto' does not pick it (opt-in until measured faster on an accelerator).
    auto, _ = attention.choose(
        "auto", platform=platform, dtype="bfloat16", head_dim=64, length=512, dropout=dropout
    )
    assert auto != "flash"


FLASH = dataclasses.replace(
    mesh_training.SHARDABLE, attention_dropout_rate=0.1, attention_implementation="flash"
)


def _objective(config):
    pipeline = PipelineConfig(max_seq_length=mesh_training.L, max_predictions_per_seq=mesh_training.P)
    return lambda: MaskedLM(config, pipeline)


@pytest.mark.slow(45)
@pytest.mark.extended
def test_trains_as_the_explicit_path_on_every_layout():
    """MaskedLM with attention dropout on one device with the explicit path, against: 'flash'
    on a data x fsdp x tensor mesh (the kernel in shard_map, each shard's dropout counters
    its global rows and heads) under full rematerialisation (the forward pass run again in
    the backward); 'flash' and 'explicit' with 2 microbatches on that mesh (every microbatch
    draws the whole batch's attention masks at its rows). Losses and parameters are equal:
    the same masks everywhere, drawn in the kernel or not."""
    batches = mesh_training.mlm_batches(2)
    explicit = dataclasses.replace(FLASH, attention_implementation="explicit")
    state, losses = mesh_training.train(
        sharding.make_mesh(None, jax.devices()[:1]), batches, _objective(explicit)()
    )
    spec, microbatches = mesh_training.SHARDED_AND_MICROBATCHED
    layouts = {
        "flash, remat": (dataclasses.replace(FLASH, remat_policy="full"), 1),
        "flash, microbatches": (FLASH, microbatches),
        "explicit, microbatches": (explicit, microbatches),
    }
    for name, (config, k) in layouts.items():
        other, other_losses = mesh_training.train(sharding.make_mesh(spec), batches, _objective(config)(), k)
        np.testing.assert_allclose(other_losses, losses, rtol=1e-5, err_msg=name)
        jax.tree.map(
            lambda a, b, name=name: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name),
            jax.device_get(other.params),
            jax.device_get(state.params),
        )


def test_block_sizes_are_reachable_from_the_config_and_survive_the_workdir(tmp_path):
    """`EncoderConfig.flash_block_sizes = @BlockSizes()` in gin; model_config.json keeps it."""
    import gin

    from core import workdir
    from models.encoder import EncoderConfig

    gin.clear_config()
    try:
        gin.parse_config(
            [
                "EncoderConfig.flash_block_sizes = @BlockSizes()",
                "BlockSizes.block_q = 128",
                "BlockSizes.wide_keys = False",
            ]
        )
        config = EncoderConfig()
    finally:
        gin.clear_config()
    assert config.flash_block_sizes == BLOCKS(block_q=128, wide_keys=False)
    workdir.write_config(str(tmp_path), config)
    assert workdir.read_config(str(tmp_path), EncoderConfig) == config
    with pytest.raises(ConfigError, match="BlockSizes.block_q_backward must be a positive multiple of 8"):
        EncoderConfig(flash_block_sizes={"block_q_backward": 100})
