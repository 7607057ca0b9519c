"""ALBERT's model side: cross-layer sharing modes, the factorized embedding, the MLM
decoder tied to the [V, E] table, and the FLOPs count with both."""

import dataclasses
import math
import pathlib

import flax.linen as nn
import gin
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import PartitionSpec

from core import axes, optim, sharding
from core.state import count_params
from data.pipeline_config import PipelineConfig
from models.encoder import Encoder, EncoderConfig
from models.pretraining import BertPretrainingModel, abstract_params
from pretrain import step, trainer  # noqa: F401  (trainer registers run for the recipe tests)
from pretrain.objectives import MaskedLM
from tests import jitted, mesh_training

ROOT = pathlib.Path(__file__).resolve().parents[1]

B, L, P = 2, 12, 3
# E = 8 != H = 16; no dropout, so that sharing comparisons are exact functions.
TINY = EncoderConfig(
    vocab_size=64,
    hidden_size=16,
    num_layers=3,
    num_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
    embedding_size=8,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
)
ATTENTION_BLOCK = ("attention", "attention_layer_norm")
FFN_BLOCK = ("intermediate", "output", "output_layer_norm")
# Which sub-blocks of a layer each mode takes from the shared module.
SHARED_BLOCKS = {"all": ATTENTION_BLOCK + FFN_BLOCK, "attention": ATTENTION_BLOCK, "ffn": FFN_BLOCK}
SHARED_NAME = {"all": "shared_layer", "attention": "shared_attention", "ffn": "shared_ffn"}


def make_batch(seed=0):
    rs = np.random.RandomState(seed)
    mask = np.ones((B, L), np.int32)
    mask[1, L - 3 :] = 0
    return {
        "input_ids": (rs.randint(1, TINY.vocab_size, (B, L)) * mask).astype(np.int32),
        "input_mask": mask,
        "segment_ids": (np.arange(L)[None] >= L // 2).astype(np.int32).repeat(B, 0) * mask,
        "masked_lm_positions": np.sort(
            np.stack([rs.choice(L - 3, P, replace=False) for _ in range(B)]), 1
        ).astype(np.int32),
    }


def init_params(config):
    model = BertPretrainingModel(config)
    return nn.unbox(
        jax.jit(lambda rng: jitted.init(model, rng, make_batch(), deterministic=True))(jax.random.key(0))
    )["params"]


@pytest.fixture(scope="module")
def unshared():
    return init_params(dataclasses.replace(TINY, sharing="none"))


# --- sharing modes ------------------------------------------------------------------


@pytest.mark.parametrize(
    "sharing, expected",
    [
        ("none", {f"layer_{i}": set(ATTENTION_BLOCK + FFN_BLOCK) for i in range(3)}),
        ("all", {"shared_layer": set(ATTENTION_BLOCK + FFN_BLOCK)}),
        (
            "attention",
            {"shared_attention": set(ATTENTION_BLOCK), **{f"layer_{i}": set(FFN_BLOCK) for i in range(3)}},
        ),
        ("ffn", {"shared_ffn": set(FFN_BLOCK), **{f"layer_{i}": set(ATTENTION_BLOCK) for i in range(3)}}),
    ],
)
def test_sharing_parameter_trees(sharing, expected):
    encoder = abstract_params(dataclasses.replace(TINY, sharing=sharing))["encoder"]
    common = {"embeddings", "embedding_projection", "pooler"}
    assert set(encoder) == common | set(expected)
    for name, blocks in expected.items():
        assert set(encoder[name]) == blocks, name


def _tie(unshared, sharing):
    """(params of the unshared model whose layers all use layer_0's shared blocks,
    the same function's params in the `sharing` layout)."""
    blocks = SHARED_BLOCKS[sharing]
    encoder = dict(unshared["encoder"])
    layers = [encoder.pop(f"layer_{i}") for i in range(TINY.num_layers)]
    tied_layers = [{**layer, **{b: layers[0][b] for b in blocks}} for layer in layers]
    tied = {**unshared, "encoder": {**encoder, **{f"layer_{i}": l for i, l in enumerate(tied_layers)}}}
    own = {f"layer_{i}": {k: v for k, v in l.items() if k not in blocks} for i, l in enumerate(layers)}
    shared_encoder = {**encoder, SHARED_NAME[sharing]: {b: layers[0][b] for b in blocks}}
    shared_encoder.update({name: layer for name, layer in own.items() if layer})
    return tied, {**unshared, "encoder": shared_encoder}


def _loss_and_grad(config):
    model = BertPretrainingModel(config)
    batch = make_batch()

    def loss(params):
        out = jitted.apply(model, {"params": params}, batch, deterministic=True)
        return (out["mlm_logits"] ** 2).mean() + out["sentence_logits"].sum()

    return jax.jit(jax.value_and_grad(loss))


@pytest.fixture(scope="module")
def unshared_loss_and_grad():
    return _loss_and_grad(dataclasses.replace(TINY, sharing="none"))


@pytest.mark.slow
@pytest.mark.parametrize("sharing", ["all", "attention", "ffn"])
@pytest.mark.parametrize("remat_policy", ["none", "full"])
@pytest.mark.extended(keep=["full-all"])
def test_shared_blocks_are_reused_and_gradients_sum(unshared, unshared_loss_and_grad, sharing, remat_policy):
    """A shared model computes the unshared model whose layers hold copies of one block,
    and the gradient of a shared parameter is the sum of the copies' gradients."""
    config = dataclasses.replace(TINY, sharing=sharing, remat_policy=remat_policy)
    tied, shared = _tie(unshared, sharing)
    fresh = nn.unbox(abstract_params(config))
    assert jax.tree.structure(fresh) == jax.tree.structure(shared)
    jax.tree.map(lambda a, b: np.testing.assert_equal(a.shape, b.shape), fresh, shared)

    loss_tied, grad_tied = unshared_loss_and_grad(tied)
    loss_shared, grad_shared = _loss_and_grad(config)(shared)
    np.testing.assert_allclose(loss_shared, loss_tied, rtol=1e-5)

    blocks = SHARED_BLOCKS[sharing]
    layers = [grad_tied["encoder"][f"layer_{i}"] for i in range(TINY.num_layers)]
    summed = jax.tree.map(lambda *g: sum(g), *[{b: layer[b] for b in blocks} for layer in layers])
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)  # noqa: E731
    jax.tree.map(close, grad_shared["encoder"][SHARED_NAME[sharing]], summed)
    # Every layer contributes: the sum is not any single layer's gradient.
    for layer in layers:
        single = jax.tree.leaves({b: layer[b] for b in blocks})
        assert not all(np.allclose(a, b) for a, b in zip(jax.tree.leaves(summed), single))
    for i, layer in enumerate(layers):
        own = {k: v for k, v in layer.items() if k not in blocks}
        if own:
            jax.tree.map(close, grad_shared["encoder"][f"layer_{i}"], own)
    for name in ("embeddings", "embedding_projection", "pooler"):
        jax.tree.map(close, grad_shared["encoder"][name], grad_tied["encoder"][name])
    jax.tree.map(close, grad_shared["mlm_head"], grad_tied["mlm_head"])


def _flops(config):
    """The MLM objective's training FLOPs per row of L tokens with P predictions."""
    return MaskedLM(config, PipelineConfig(max_seq_length=64, max_predictions_per_seq=P)).flops_per_row(L, P)


@pytest.mark.slow
def test_sharing_saves_parameters_not_flops():
    counts = {s: count_params(abstract_params(dataclasses.replace(TINY, sharing=s))) for s in SHARED_NAME}
    counts["none"] = count_params(abstract_params(TINY))
    layer = count_params(abstract_params(TINY)["encoder"]["layer_0"])
    assert counts["none"] - counts["all"] == (TINY.num_layers - 1) * layer
    assert counts["none"] > counts["attention"] > counts["all"]
    assert counts["none"] > counts["ffn"] > counts["all"]
    flops = {_flops(dataclasses.replace(TINY, sharing=s)) for s in counts}
    assert len(flops) == 1


# ALBERT Table 4 (ALBERT-base, E = 128): not-shared 89M, shared-attention 64M, shared-FFN 38M,
# all-shared 12M; Table 3 (all-shared): E = 64 10M, 128 12M, 256 16M, 768 31M.
@pytest.mark.slow
@pytest.mark.parametrize(
    "sharing, embedding_size, published",
    [
        ("none", 128, 89e6),
        ("attention", 128, 64e6),
        ("ffn", 128, 38e6),
        ("all", 128, 12e6),
        ("all", 64, 10e6),
        ("all", 256, 16e6),
        ("all", 768, 31e6),
    ],
)
def test_albert_ablation_sizes(sharing, embedding_size, published):
    config = EncoderConfig(vocab_size=30000, embedding_size=embedding_size, sharing=sharing)
    count = count_params(abstract_params(config))
    # The paper rounds to whole millions (upwards for 12M: the checkpoint has 11.7M).
    assert abs(count - published) <= 0.6e6 + 0.02 * published, count


# --- factorized embedding -------------------------------------------------------------


def test_factorized_embedding_shapes_and_axes():
    boxed = abstract_params(TINY)
    shapes = traverse_util.flatten_dict(jax.tree.map(lambda x: x.shape, nn.unbox(boxed)), sep="/")
    V, H, E, F = TINY.vocab_size, TINY.hidden_size, TINY.embedding_size, TINY.intermediate_size
    assert shapes["encoder/embeddings/word_embeddings/embedding"] == (V, E)
    assert shapes["encoder/embeddings/position_embeddings/embedding"] == (TINY.max_position_embeddings, E)
    assert shapes["encoder/embeddings/token_type_embeddings/embedding"] == (TINY.type_vocab_size, E)
    assert shapes["encoder/embeddings/layer_norm/scale"] == (E,)
    assert shapes["encoder/embedding_projection/kernel"] == (E, H)
    assert shapes["encoder/layer_0/intermediate/kernel"] == (H, F)
    assert shapes["mlm_head/transform/kernel"] == (H, E)
    assert shapes["mlm_head/transform_layer_norm/scale"] == (E,)
    assert shapes["mlm_head/output_bias"] == (V,)
    # The decoder is the embedding table: the head has no [E, V] or [H, V] matrix of its own.
    assert set(boxed["mlm_head"]) == {"transform", "transform_layer_norm", "output_bias"}

    specs = traverse_util.flatten_dict(nn.get_partition_spec(boxed), sep="/")
    assert specs["encoder/embeddings/word_embeddings/embedding"] == PartitionSpec(axes.VOCAB, axes.FACTORIZED)
    assert specs["encoder/embedding_projection/kernel"] == PartitionSpec(axes.FACTORIZED, axes.EMBED)
    assert specs["mlm_head/transform/kernel"] == PartitionSpec(axes.EMBED, axes.FACTORIZED)
    for name, spec in specs.items():
        assert set(spec) <= set(axes.ALL) | {None}, name


@pytest.mark.parametrize("sharing", ["none", "all", "attention", "ffn"])
def test_every_param_has_logical_axes(sharing):
    boxed = abstract_params(dataclasses.replace(TINY, sharing=sharing))
    leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    assert leaves and all(isinstance(leaf, nn.Partitioned) for leaf in leaves)
    for leaf in leaves:
        assert len(leaf.names) == len(leaf.value.shape)
        assert set(leaf.names) <= set(axes.ALL) | {None}
        # A PartitionSpec may name each mesh axis once: E and H need distinct names.
        assert len([n for n in leaf.names if n]) == len({n for n in leaf.names if n})


def test_embedding_size_equal_to_hidden_is_bert():
    """E = H needs no projection (the original applies it only when E != H)."""
    same = abstract_params(dataclasses.replace(TINY, embedding_size=TINY.hidden_size))
    bert = abstract_params(dataclasses.replace(TINY, embedding_size=None))
    assert jax.tree.structure(same) == jax.tree.structure(bert)
    assert "embedding_projection" not in same["encoder"]


@pytest.mark.slow
def test_projection_follows_the_embedding_layer_norm(unshared):
    """Layer 0 reads LayerNorm(embeddings) @ kernel + bias, as ALBERT's embedding_hidden_mapping_in."""
    batch = make_batch()
    config = dataclasses.replace(TINY, sharing="none")
    _, state = jitted.apply(
        Encoder(config),
        {"params": unshared["encoder"]},
        batch["input_ids"],
        batch["input_mask"],
        batch["segment_ids"],
        deterministic=True,
        capture_intermediates=True,
    )
    captured = state["intermediates"]
    embedded = np.asarray(captured["embeddings"]["__call__"][0][0], np.float64)  # [B, L, E]
    assert embedded.shape == (B, L, TINY.embedding_size)
    np.testing.assert_allclose(embedded.mean(-1), 0.0, atol=1e-5)  # normalised (scale 1, bias 0 at init)
    projection = unshared["encoder"]["embedding_projection"]
    np.testing.assert_allclose(
        captured["embedding_projection"]["__call__"][0],
        embedded @ np.asarray(projection["kernel"], np.float64) + np.asarray(projection["bias"]),
        rtol=1e-5,
        atol=1e-6,
    )


def _layer_norm(x, p, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


@pytest.mark.slow
def test_mlm_decoder_is_tied_to_the_factorized_table(unshared):
    """H -> E transform, LayerNorm over E, then logits = x @ table[V, E].T + bias."""
    batch = make_batch()
    config = dataclasses.replace(TINY, sharing="none")
    encoded = jitted.apply(
        Encoder(config),
        {"params": unshared["encoder"]},
        batch["input_ids"],
        batch["input_mask"],
        batch["segment_ids"],
        deterministic=True,
    )
    head = jax.tree.map(lambda x: np.asarray(x, np.float64), unshared["mlm_head"])
    table = np.asarray(unshared["encoder"]["embeddings"]["word_embeddings"]["embedding"], np.float64)
    x = np.asarray(encoded.sequence_output, np.float64)[np.arange(B)[:, None], batch["masked_lm_positions"]]
    x = np.asarray(
        jax.nn.gelu(x @ head["transform"]["kernel"] + head["transform"]["bias"], approximate=False)
    )
    x = _layer_norm(x, head["transform_layer_norm"], config.layer_norm_eps)
    expected = x @ table.T + head["output_bias"]
    logits = jitted.apply(BertPretrainingModel(config), {"params": unshared}, batch, deterministic=True)[
        "mlm_logits"
    ]
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)


# --- FLOPs -------------------------------------------------------------------------------


def _matmul_flops(jaxpr):
    """2 * output size * contracted size of every dot_general, nested jaxprs included."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contract)
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    total += _matmul_flops(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    total += _matmul_flops(sub)
    return total


@pytest.mark.slow
@pytest.mark.parametrize("sharing", ["none", "all"])
@pytest.mark.parametrize("embedding_size", [None, 8])
def test_flops_formula_matches_the_traced_matmuls(unshared, sharing, embedding_size):
    """3 x the forward pass's matmuls, less the pooler (which the formula leaves out)."""
    config = dataclasses.replace(TINY, sharing=sharing, embedding_size=embedding_size)
    model = BertPretrainingModel(config, sentence_head=False)
    batch = {k: v for k, v in make_batch().items()}
    batch["input_mask"] = np.ones_like(batch["input_mask"])
    params = jax.eval_shape(lambda rng: jitted.init(model, rng, batch, deterministic=True), jax.random.key(0))
    jaxpr = jax.make_jaxpr(lambda v: jitted.apply(model, v, batch, deterministic=True))(params).jaxpr
    pooler = 2 * config.hidden_size**2
    traced = 3 * (_matmul_flops(jaxpr) / B - pooler)
    assert traced == pytest.approx(_flops(config), rel=1e-9)


@pytest.mark.slow
def test_bf16_forward_with_factorized_embedding(unshared):
    """Compute dtype flows through the projection and the E-sized MLM head."""
    config = dataclasses.replace(TINY, sharing="none", dtype="bfloat16")
    out = jitted.apply(BertPretrainingModel(config), {"params": unshared}, make_batch(), deterministic=True)
    assert out["mlm_logits"].dtype == jnp.float32
    assert out["mlm_logits"].shape == (B, P, TINY.vocab_size)
    assert bool(jnp.isfinite(out["mlm_logits"]).all())


# --- training on a mesh -----------------------------------------------------------------


def _train_batches(n, batch_size=8, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        mask = (np.arange(L)[None] < rng.integers(6, L + 1, size=(batch_size, 1))).astype(np.int32)
        out.append(
            {
                "input_ids": (rng.integers(5, TINY.vocab_size, size=(batch_size, L)) * mask).astype(np.int32),
                "input_mask": mask,
                "segment_ids": ((np.arange(L)[None] > 3) * mask).astype(np.int32),
                "positions": np.broadcast_to(np.arange(L, dtype=np.int32), (batch_size, L)).copy(),
                "masked_lm_positions": np.sort(rng.choice(6, size=(batch_size, P)), axis=1).astype(np.int32),
                "masked_lm_ids": rng.integers(5, TINY.vocab_size, size=(batch_size, P)).astype(np.int32),
                "masked_lm_weights": np.ones((batch_size, P), np.float32),
                "sentence_label": rng.integers(0, 2, size=(batch_size,)).astype(np.int32),
            }
        )
    return out


def _train(mesh_spec, batches, config):
    objective = MaskedLM(config, PipelineConfig(max_seq_length=max(L, 8), max_predictions_per_seq=P))
    mesh = sharding.make_mesh(mesh_spec, jax.devices()[:1] if mesh_spec is None else None)
    return mesh_training.train(mesh, batches, objective, optimizer_fn=optim.lamb)


@pytest.mark.slow(15)
@pytest.mark.extended
def test_albert_with_lamb_trains_the_same_on_a_mesh():
    """All-shared, factorized ALBERT with LAMB: data x fsdp x tensor gives the one-device result."""
    config = dataclasses.replace(TINY, sharing="all")
    batches = _train_batches(1) * 3  # one batch, seen 3 times: the loss must fall
    reference, reference_losses = _train(None, batches, config)
    state, losses = _train("data:2,fsdp:2,tensor:2", batches, config)
    np.testing.assert_allclose(losses, reference_losses, rtol=1e-5)
    assert losses[-1] < losses[0]
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        jax.device_get(state.params),
        jax.device_get(reference.params),
    )
    encoder = state.params["encoder"]
    assert encoder["shared_layer"]["intermediate"]["kernel"].sharding.spec == PartitionSpec("fsdp", "tensor")
    assert encoder["embeddings"]["word_embeddings"]["embedding"].sharding.spec == PartitionSpec(
        "tensor", None
    )
    assert encoder["embedding_projection"]["kernel"].sharding.spec == PartitionSpec(None, "fsdp")


# --- the recipe ---------------------------------------------------------------------------


def test_albert_recipe():
    gin.clear_config()
    try:
        gin.parse_config_files_and_bindings(
            [str(ROOT / "configs/models/albert_base.gin"), str(ROOT / "configs/recipes/albert.gin")], []
        )
        config = EncoderConfig()
        optimizer_name = gin.query_parameter("run.optimizer_fn").selector
        steps = gin.query_parameter("run.steps")
        _, schedule = optim.lamb(total_steps=steps)  # with the recipe's bindings
        batch_size = gin.query_parameter("run.batch_size")
        data = PipelineConfig()
        lamb = {name: gin.query_parameter(f"lamb.{name}") for name in ("weight_decay", "clip_norm")}
    finally:
        gin.clear_config()
    assert (config.embedding_size, config.sharing, config.hidden_size) == (128, "all", 768)
    assert (config.dropout_rate, config.attention_dropout_rate, config.hidden_act) == (0.0, 0.0, "gelu_tanh")
    assert optimizer_name == "lamb" and lamb == {"weight_decay": 0.01, "clip_norm": 1.0}
    assert (steps, batch_size) == (125000, 4096)
    assert (data.format, data.sentence_objective, data.masking_unit) == ("segment_pair", "sop", "ngram")
    assert (data.max_seq_length, data.max_predictions_per_seq, data.short_seq_prob) == (512, 80, 0.1)
    # Published: lr 0.00176 reached at step 3125 after a linear warmup, then linear decay to 0.
    assert float(schedule(1000)) == pytest.approx(0.00176 * 1000 / 3125)
    assert float(schedule(3125)) == pytest.approx(0.00176 * (1 - 3125 / 125000))
    assert float(schedule(125000)) == 0.0
