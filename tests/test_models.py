"""Tests of models/: config, encoder, heads, pretraining model, sizes, sharding, summary CLI."""

import dataclasses
import pathlib

import flax.linen as nn
import gin
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from core import axes, flops
from core.state import count_params
from data.pipeline_config import PipelineConfig
from models.encoder import Encoder, EncoderConfig
from models.pretraining import BertPretrainingModel, abstract_params
from pretrain import summary, trainer  # noqa: F401  (registers adamw and run for the recipes)
from tests import jitted
from tests.tiny import RNG, RULES, TINY, B, L, P, loss_and_grads_step, make_batch

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny():
    """The tiny model and its variables; they depend on neither compute dtype nor batch shape."""
    model = BertPretrainingModel(TINY)
    # Jitted: eager init compiles every initialiser op separately, ~3x slower here.
    return model, jitted.init(model, RNG, make_batch(), deterministic=True)


# --- config ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"hidden_size": 30, "num_heads": 4}, "divisible by num_heads"),
        ({"hidden_act": "swish"}, "hidden_act"),
        ({"dtype": "float8"}, "dtype"),
        ({"param_dtype": "int8"}, "param_dtype"),
        ({"attention_implementation": "fused"}, "attention_implementation"),
        ({"dropout_rate": 1.0}, "dropout_rate"),
        ({"dropout_bits": 8}, "dropout_bits"),
        ({"num_layers": 0}, "num_layers"),
        ({"sharing": "layers"}, "sharing"),
        ({"embedding_size": 0}, "embedding_size"),
        ({"position_offset": 64}, "position_offset"),
        ({"position_offset": -1}, "position_offset"),
    ],
)
def test_config_rejects_bad_values(overrides, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TINY, **overrides)


def test_config_gin_binding():
    gin.clear_config()
    try:
        gin.parse_config("EncoderConfig.hidden_size = 128\nEncoderConfig.num_heads = 2")
        config = EncoderConfig()
        assert (config.hidden_size, config.num_heads, config.num_layers) == (128, 2, 12)
        assert EncoderConfig(num_layers=3).hidden_size == 128  # explicit args and bindings mix
        with pytest.raises(dataclasses.FrozenInstanceError):
            config.hidden_size = 64
    finally:
        gin.clear_config()


@pytest.mark.parametrize(
    "name, sizes",
    [
        ("bert_tiny", (2, 128, 2, 512)),
        ("bert_mini", (4, 256, 4, 1024)),
        ("bert_small", (4, 512, 8, 2048)),
        ("bert_medium", (8, 512, 8, 2048)),
        ("bert_base", (12, 768, 12, 3072)),
        ("bert_large", (24, 1024, 16, 4096)),
    ],
)
def test_model_gin_files(name, sizes):
    config = _model_config(name)
    assert (config.num_layers, config.hidden_size, config.num_heads, config.intermediate_size) == sizes
    assert config.vocab_size == 30522
    assert (config.embedding_size, config.sharing, config.position_offset) == (None, "none", 0)


def _model_config(name: str) -> EncoderConfig:
    gin.clear_config()
    try:
        gin.parse_config_file(str(ROOT / "configs/models" / f"{name}.gin"))
        return EncoderConfig()
    finally:
        gin.clear_config()


@pytest.mark.parametrize(
    "name, sizes", [("roberta_base", (12, 768, 12, 3072)), ("roberta_large", (24, 1024, 16, 4096))]
)
def test_roberta_gin_files(name, sizes):
    config = _model_config(name)
    assert (config.num_layers, config.hidden_size, config.num_heads, config.intermediate_size) == sizes
    assert (config.vocab_size, config.type_vocab_size, config.layer_norm_eps) == (50265, 1, 1e-5)
    assert (config.max_position_embeddings, config.position_offset, config.max_length) == (514, 2, 512)
    assert (config.embedding_size, config.sharing) == (None, "none")


@pytest.mark.parametrize(
    "name, sizes",
    [
        ("albert_base", (12, 768, 12, 3072)),
        ("albert_large", (24, 1024, 16, 4096)),
        ("albert_xlarge", (24, 2048, 16, 8192)),
        ("albert_xxlarge", (12, 4096, 64, 16384)),
    ],
)
def test_albert_gin_files(name, sizes):
    config = _model_config(name)
    assert (config.num_layers, config.hidden_size, config.num_heads, config.intermediate_size) == sizes
    assert (config.vocab_size, config.embedding_size, config.sharing) == (30000, 128, "all")
    assert (config.type_vocab_size, config.max_length) == (2, 512)


# The released checkpoints' sizes (issue 3; ALBERT's paper rounds them up, xxlarge to 235M).
@pytest.mark.slow
@pytest.mark.parametrize(
    "name, published",
    [
        ("bert_base", 110e6),
        ("bert_large", 335e6),
        ("roberta_base", 125e6),
        ("roberta_large", 355e6),
        ("albert_base", 11.7e6),
        ("albert_large", 17.7e6),
        ("albert_xlarge", 58.7e6),
        ("albert_xxlarge", 223e6),
    ],
)
def test_published_param_counts(name, published):
    """eval_shape only: even xxlarge allocates nothing."""
    count = count_params(abstract_params(_model_config(name), sentence_head=not name.startswith("roberta")))
    assert abs(count / published - 1) < 0.03, count


# --- shapes, dtypes, parameters ----------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_output_shapes_and_dtypes(tiny, dtype):
    config = dataclasses.replace(TINY, dtype=dtype)
    model, variables = BertPretrainingModel(config), tiny[1]
    out = jitted.apply(model, variables, make_batch(), deterministic=True)
    assert set(out) == {"mlm_logits", "sentence_logits"}
    assert out["mlm_logits"].shape == (B, P, TINY.vocab_size)
    assert out["sentence_logits"].shape == (B, 2)
    assert out["mlm_logits"].dtype == jnp.float32 and out["sentence_logits"].dtype == jnp.float32
    assert all(bool(jnp.isfinite(x).all()) for x in out.values())
    assert {leaf.dtype for leaf in jax.tree.leaves(variables)} == {jnp.dtype(jnp.float32)}

    encoded = jax.eval_shape(
        lambda params, b: jitted.apply(
            Encoder(config),
            {"params": params},
            b["input_ids"],
            b["input_mask"],
            b["segment_ids"],
            deterministic=True,
        ),
        variables["params"]["encoder"],
        make_batch(),
    )
    assert encoded.sequence_output.shape == (B, L, TINY.hidden_size)
    assert encoded.sequence_output.dtype == jnp.dtype(dtype)
    assert encoded.pooled_output.shape == (B, TINY.hidden_size)


@pytest.mark.slow
def test_without_sentence_head(tiny):
    assert set(abstract_params(TINY, sentence_head=False)) == {"encoder", "mlm_head"}
    params = {k: v for k, v in tiny[1]["params"].items() if k != "sentence_head"}
    out = jitted.apply(
        BertPretrainingModel(TINY, sentence_head=False),
        {"params": params},
        make_batch(),
        deterministic=True,
    )
    assert set(out) == {"mlm_logits"}


def test_param_tree_names(tiny):
    _, variables = tiny
    params = variables["params"]
    assert set(params) == {"encoder", "mlm_head", "sentence_head"}
    assert set(params["encoder"]) == {"embeddings", "layer_0", "layer_1", "pooler"}
    assert set(params["encoder"]["layer_0"]) == {
        "attention",
        "attention_layer_norm",
        "intermediate",
        "output",
        "output_layer_norm",
    }
    assert set(params["encoder"]["layer_0"]["attention"]) == {"query", "key", "value", "output"}
    assert set(params["mlm_head"]) == {"transform", "transform_layer_norm", "output_bias"}


def test_every_param_has_logical_axes(tiny):
    _, variables = tiny
    boxed = jax.tree.leaves(variables["params"], is_leaf=lambda x: isinstance(x, nn.Partitioned))
    assert boxed and all(isinstance(leaf, nn.Partitioned) for leaf in boxed)
    for leaf in boxed:
        assert len(leaf.names) == leaf.value.ndim
        assert set(leaf.names) <= set(axes.ALL) | {None}
    specs = nn.get_partition_spec(variables)
    word = specs["params"]["encoder"]["embeddings"]["word_embeddings"]["embedding"]
    assert word == PartitionSpec(axes.VOCAB, axes.EMBED)
    query = specs["params"]["encoder"]["layer_0"]["attention"]["query"]["kernel"]
    assert query == PartitionSpec(axes.EMBED, axes.HEADS, axes.KV)


@pytest.mark.slow
def test_initialisers(tiny):
    _, variables = tiny
    params = nn.unbox(variables["params"])
    layer = params["encoder"]["layer_0"]
    assert np.all(layer["intermediate"]["bias"] == 0)
    assert np.all(layer["output_layer_norm"]["scale"] == 1)
    kernel = np.asarray(layer["intermediate"]["kernel"])
    assert np.abs(kernel).max() <= 2 * TINY.initializer_range + 1e-7  # truncated at 2 stddev
    assert 0.5 * TINY.initializer_range < kernel.std() < TINY.initializer_range


@pytest.mark.slow
def test_bert_param_counts():
    base = count_params(abstract_params(EncoderConfig()))
    large = count_params(
        abstract_params(EncoderConfig(num_layers=24, hidden_size=1024, num_heads=16, intermediate_size=4096))
    )
    assert abs(base / 110e6 - 1) < 0.02, base
    assert abs(large / 335e6 - 1) < 0.03, large


def test_flops_per_sequence():
    """docs/performance.md's reference values: BERT-base @128 ~70 GFLOP per row, large @128
    ~241, large @512 with P = 76 ~1.02 TFLOP."""

    def bert(layers, hidden, seq, predictions):
        return flops.bert_pretraining(
            hidden=hidden,
            layers=layers,
            intermediate=4 * hidden,
            vocab=30522,
            seq=seq,
            predictions=predictions,
        )

    assert abs(bert(12, 768, 128, 20) / 70e9 - 1) < 0.01
    assert abs(bert(24, 1024, 128, 20) / 241e9 - 1) < 0.01
    assert abs(bert(24, 1024, 512, 76) / 1.02e12 - 1) < 0.01
    # ALBERT: the E -> H projection, and an MLM head through E, not H.
    albert = flops.bert_pretraining(
        hidden=768, layers=12, intermediate=3072, vocab=30000, seq=128, predictions=20, embedding=128
    )
    layers = flops.encoder_layers(layers=12, hidden=768, intermediate=3072, seq=128)
    assert albert == 3 * (layers + 2 * 128 * 128 * 768 + 2 * 20 * (768 * 128 + 128 * 30000))


@pytest.mark.parametrize("size, learning_rate, warmup", [("base", 6e-4, 24000), ("large", 4e-4, 30000)])
def test_roberta_recipe(monkeypatch, size, learning_rate, warmup):
    monkeypatch.chdir(ROOT)  # gin includes are relative to the repository root
    recipe = "roberta.gin" if size == "base" else "roberta_large.gin"
    gin.clear_config()
    try:
        gin.parse_config_files_and_bindings(
            [f"configs/models/roberta_{size}.gin", f"configs/recipes/{recipe}"], [], skip_unknown=False
        )
        config = EncoderConfig()
        data = PipelineConfig()
        bound = {
            name: gin.query_parameter(name)
            for name in (
                "run.batch_size",
                "run.steps",
                "adamw.learning_rate",
                "adamw.warmup_steps",
                "adamw.b2",
                "adamw.eps",
                "adamw.weight_decay",
                "adamw.clip_norm",
            )
        }
    finally:
        gin.clear_config()
    assert (config.vocab_size, config.position_offset, config.type_vocab_size) == (50265, 2, 1)
    assert (data.format, data.sentence_objective, data.masking) == ("full_sentences", "none", "dynamic")
    assert (data.max_seq_length, data.max_predictions_per_seq) == (512, 80)
    assert bound == {
        "run.batch_size": 8192,
        "run.steps": 500000,
        "adamw.learning_rate": learning_rate,
        "adamw.warmup_steps": warmup,
        "adamw.b2": 0.98,
        "adamw.eps": 1e-6,
        "adamw.weight_decay": 0.01,
        "adamw.clip_norm": 0.0,
    }


@pytest.mark.slow
def test_roberta_position_offset(tiny):
    """Offset 2 reads rows 2.. of a 514-style table: the same function as offset 0 on those rows."""
    offset = dataclasses.replace(TINY, max_position_embeddings=L + 2, position_offset=2, type_vocab_size=1)
    plain = dataclasses.replace(offset, max_position_embeddings=L, position_offset=0)
    batch = dict(make_batch(), segment_ids=np.zeros((B, L), np.int32))
    params = nn.unbox(jitted.init(BertPretrainingModel(offset), RNG, batch, deterministic=True))
    assert params["params"]["encoder"]["embeddings"]["position_embeddings"]["embedding"].shape == (L + 2, 32)
    shifted = jax.tree.map(lambda x: x, params)
    table = shifted["params"]["encoder"]["embeddings"]["position_embeddings"]["embedding"]
    shifted["params"]["encoder"]["embeddings"]["position_embeddings"]["embedding"] = table[2:]

    expected = jitted.apply(BertPretrainingModel(plain), shifted, batch, deterministic=True)["mlm_logits"]
    actual = jitted.apply(BertPretrainingModel(offset), params, batch, deterministic=True)["mlm_logits"]
    np.testing.assert_allclose(actual, expected, atol=1e-6)
    # Rows 0 and 1 are never read (fairseq's padding_idx = 1 and below).
    changed = jax.tree.map(lambda x: x, params)
    changed["params"]["encoder"]["embeddings"]["position_embeddings"]["embedding"] = table.at[:2].set(9.0)
    np.testing.assert_array_equal(
        jitted.apply(BertPretrainingModel(offset), changed, batch, deterministic=True)["mlm_logits"], actual
    )
    # ... and the offset is real: without it the same parameters give another function.
    unshifted = dataclasses.replace(offset, position_offset=0)
    assert not np.allclose(
        jitted.apply(BertPretrainingModel(unshifted), params, batch, deterministic=True)["mlm_logits"], actual
    )


# --- the MLM head --------------------------------------------------------------------


def _all_shapes(jaxpr):
    """Shapes of every value a jaxpr produces, nested jaxprs (jit, custom_vjp, ...) included."""
    for eqn in jaxpr.eqns:
        yield from (tuple(v.aval.shape) for v in eqn.outvars)
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    yield from _all_shapes(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    yield from _all_shapes(sub)


def _largest_array(fn, *args):
    return max(np.prod(s) for s in _all_shapes(jax.make_jaxpr(fn)(*args).jaxpr))


@pytest.mark.slow
def test_mlm_head_never_builds_full_vocab_logits(tiny):
    model, variables = tiny
    batch = make_batch()
    limit = B * L * TINY.vocab_size

    def loss(variables):
        out = jitted.apply(model, variables, batch, deterministic=False, rngs={"dropout": RNG})
        return out["mlm_logits"].sum() + out["sentence_logits"].sum()

    assert _largest_array(loss, variables) < limit
    assert _largest_array(jax.grad(loss), variables) < limit

    # The check itself can see a [B, L, V] array when there is one.
    def full_logits(variables):
        encoded = jitted.apply(
            Encoder(TINY),
            {"params": variables["params"]["encoder"]},
            batch["input_ids"],
            batch["input_mask"],
            batch["segment_ids"],
            deterministic=True,
        )
        return encoded.sequence_output @ encoded.word_embeddings.T

    assert _largest_array(full_logits, variables) >= limit


def _layer_norm(x, p, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


@pytest.mark.slow
def test_mlm_logits_match_reference(tiny):
    model, variables = tiny
    batch = make_batch()
    params = nn.unbox(variables["params"])
    encoded = jitted.apply(
        Encoder(TINY),
        {"params": params["encoder"]},
        batch["input_ids"],
        batch["input_mask"],
        batch["segment_ids"],
        deterministic=True,
    )
    hidden = np.asarray(encoded.sequence_output, np.float64)
    head = jax.tree.map(lambda x: np.asarray(x, np.float64), params["mlm_head"])
    table = np.asarray(params["encoder"]["embeddings"]["word_embeddings"]["embedding"], np.float64)

    x = hidden[np.arange(B)[:, None], batch["masked_lm_positions"]]  # [B, P, H]
    x = x @ head["transform"]["kernel"] + head["transform"]["bias"]
    x = np.asarray(jax.nn.gelu(x, approximate=False))
    x = _layer_norm(x, head["transform_layer_norm"], TINY.layer_norm_eps)
    expected = x @ table.T + head["output_bias"]

    logits = jitted.apply(model, variables, batch, deterministic=True)["mlm_logits"]
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)


# --- attention -----------------------------------------------------------------------


@pytest.mark.slow
def test_padding_does_not_leak(tiny):
    model, variables = tiny
    batch = make_batch(real_len=L - 5)
    changed = dict(batch, input_ids=batch["input_ids"].copy(), segment_ids=batch["segment_ids"].copy())
    changed["input_ids"][:, L - 5 :] = 7
    changed["segment_ids"][:, L - 5 :] = 1

    def encode(b):
        return jitted.apply(
            Encoder(TINY),
            {"params": variables["params"]["encoder"]},
            b["input_ids"],
            b["input_mask"],
            b["segment_ids"],
            deterministic=True,
        )

    before, after = encode(batch), encode(changed)
    np.testing.assert_allclose(
        before.sequence_output[:, : L - 5], after.sequence_output[:, : L - 5], atol=1e-6
    )
    assert not np.allclose(before.sequence_output[:, L - 5 :], after.sequence_output[:, L - 5 :])
    for key, value in jitted.apply(model, variables, batch, deterministic=True).items():
        np.testing.assert_allclose(
            value, jitted.apply(model, variables, changed, deterministic=True)[key], atol=1e-6
        )


@pytest.mark.slow
def test_packed_examples_do_not_attend_to_each_other(tiny):
    """A row packing examples of 10 and 8 tokens encodes the second as if it were alone."""
    _, variables = tiny
    rs = np.random.RandomState(1)
    ids = rs.randint(1, TINY.vocab_size, 18).astype(np.int32)
    zeros = np.zeros(L, np.int32)

    packed_ids, packed_mask, example_ids, positions = zeros.copy(), zeros.copy(), zeros.copy(), zeros.copy()
    packed_ids[:18], packed_mask[:18] = ids, 1
    example_ids[:10], example_ids[10:18] = 1, 2
    positions[:10], positions[10:18] = np.arange(10), np.arange(8)
    alone_ids, alone_mask = zeros.copy(), zeros.copy()
    alone_ids[:8], alone_mask[:8] = ids[10:], 1

    def encode(ids, mask, **kwargs):
        return (
            Encoder(TINY)
            .apply(
                {"params": variables["params"]["encoder"]},
                ids[None],
                mask[None],
                np.zeros((1, L), np.int32),
                deterministic=True,
                **kwargs,
            )
            .sequence_output[0]
        )

    packed = encode(packed_ids, packed_mask, positions=positions[None], example_ids=example_ids[None])
    alone = encode(alone_ids, alone_mask)
    np.testing.assert_allclose(packed[10:18], alone[:8], atol=1e-5)


@pytest.mark.slow
def test_dropout_and_determinism(tiny):
    model, variables = tiny
    batch = make_batch()

    def run(model=model, **kwargs):
        return jitted.apply(model, variables, batch, **kwargs)["mlm_logits"]

    reference = run(deterministic=True)
    np.testing.assert_array_equal(reference, run(deterministic=True))
    first = run(deterministic=False, rngs={"dropout": jax.random.key(1)})
    np.testing.assert_array_equal(first, run(deterministic=False, rngs={"dropout": jax.random.key(1)}))
    assert not np.allclose(first, run(deterministic=False, rngs={"dropout": jax.random.key(2)}))
    assert not np.allclose(first, reference)

    # Attention dropout alone (the explicit attention path) changes the output ...
    attention_only = BertPretrainingModel(dataclasses.replace(TINY, dropout_rate=0.0))
    assert not np.allclose(
        run(attention_only, deterministic=False, rngs={"dropout": jax.random.key(1)}), reference
    )
    # ... and with all rates 0, training mode is the inference function.
    no_dropout = BertPretrainingModel(dataclasses.replace(TINY, dropout_rate=0.0, attention_dropout_rate=0.0))
    np.testing.assert_allclose(run(no_dropout, deterministic=False), reference, atol=1e-6)


# --- sharding --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def single_device(tiny):
    model, variables = tiny
    batch = make_batch(batch_size=8)
    return batch, variables, loss_and_grads_step(model)(variables, batch, RNG)


@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape", [(8, 1, 1), (2, 2, 2)])
@pytest.mark.extended
def test_jit_on_mesh_matches_single_device(tiny, single_device, mesh_shape):
    model, _ = tiny
    batch, expected_variables, expected = single_device
    mesh = jax.make_mesh(mesh_shape, ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)

    def init_fn(rng):
        return jitted.init(model, rng, batch, deterministic=True)

    with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
        shardings = nn.logical_to_mesh_sharding(
            nn.get_partition_spec(jax.eval_shape(init_fn, RNG)), mesh, RULES
        )
        variables = jax.jit(init_fn, out_shardings=shardings)(RNG)
        sharded_batch = jax.device_put(batch, NamedSharding(mesh, PartitionSpec(("data", "fsdp"))))
        actual = loss_and_grads_step(model)(variables, sharded_batch, RNG)

    table = variables["params"]["encoder"]["embeddings"]["word_embeddings"]["embedding"].value
    assert table.sharding.spec == PartitionSpec("tensor", "fsdp")
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(variables), expected_variables)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5), jax.device_get(actual), expected)


# --- CLI ---------------------------------------------------------------------------------


def _summary(*args, capsys):
    """pretrain.summary in this process: (exit status, stdout lines as a dict, stderr)."""
    gin.clear_config()
    try:
        status = summary.main(list(args))
    finally:
        gin.clear_config()
    out, err = capsys.readouterr()
    lines = dict(line.split(": ") for line in out.splitlines() if ": " in line)
    return status, lines, err


def test_summary_cli(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    status, lines, err = _summary("--gin_file=configs/models/bert_base.gin", capsys=capsys)
    assert status == 0, err
    assert abs(int(lines["params"]) / 110e6 - 1) < 0.02
    assert abs(float(lines["train_gflops_per_sequence"]) / 70 - 1) < 0.03
    assert float(lines["train_flops_per_token"]) == pytest.approx(
        float(lines["train_gflops_per_sequence"]) * 1e9 / 128, rel=1e-4
    )


@pytest.mark.slow
def test_summary_cli_follows_the_recipe_objective(monkeypatch, capsys):
    """RoBERTa's recipe makes no sentence labels, so its model has no sentence head."""
    monkeypatch.chdir(ROOT)
    model = "--gin_file=configs/models/roberta_base.gin"
    status, with_head, err = _summary(model, "--seq_len=512", capsys=capsys)
    assert status == 0, err
    status, recipe, err = _summary(
        model,
        "--gin_file=configs/recipes/roberta.gin",
        "--gin_bindings=EncoderConfig.vocab_pad_multiple = 1",  # the recipe pads V to 50304 rows
        capsys=capsys,
    )
    assert status == 0, err
    # The NSP head (2-way) and the pooler it reads; RoBERTa's recipe has neither.
    assert int(with_head["params"]) - int(recipe["params"]) == 2 * (768 + 1) + 768 * (768 + 1)
    assert abs(int(recipe["params"]) / 125e6 - 1) < 0.03
    assert with_head["train_gflops_per_sequence"] == recipe["train_gflops_per_sequence"]  # both 512, P 80
    status, _, err = _summary(model, "--seq_len=513", capsys=capsys)
    assert status == 2 and "position_offset = 2" in err


def test_summary_cli_reports_config_errors(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    status, lines, err = _summary(
        "--gin_file=configs/models/bert_base.gin", "--gin_bindings=EncoderConfig.num_heads = 7", capsys=capsys
    )
    assert status == 2 and not lines
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "num_heads" in errors[0]


def test_summary_cli_reads_run_files_and_still_catches_typos(monkeypatch, capsys):
    """A run file (which also binds the trainer's configurables) works; a misspelled
    EncoderConfig parameter is still an error."""
    monkeypatch.chdir(ROOT)
    status, shared, err = _summary(
        "--gin_file=configs/runs/demo_albert.gin",
        "--gin_bindings=EncoderConfig.vocab_size=8192",
        capsys=capsys,
    )
    assert status == 0, err
    _, unshared, _ = _summary(
        "--gin_file=configs/runs/demo_albert.gin",
        "--gin_bindings=EncoderConfig.vocab_size=8192",
        "--gin_bindings=EncoderConfig.sharing='none'",
        capsys=capsys,
    )
    # 4 layers of H=128, FFN 512: not sharing adds 3 layers' parameters.
    layer = 4 * (128 * 128 + 128) + 2 * 128 * 512 + 512 + 128 + 2 * 2 * 128
    assert int(unshared["params"]) - int(shared["params"]) == 3 * layer
    status, _, err = _summary(
        "--gin_file=configs/models/bert_base.gin", "--gin_bindings=EncoderConfig.hiden_size=3", capsys=capsys
    )
    assert status == 2 and "doesn't have a parameter named 'hiden_size'" in err
