"""ELECTRA's GLUE fine-tuning: the "electra" head (first token -> dropout -> dense, no
pooler), a pretrained discriminator loaded and stepped with layer-wise lr decay through
TaskSteps, the configs/glue/electra*.gin settings, and `python -m finetune.glue` on the
offline demo task from an ELECTRA-shaped workdir with the gin file's decay."""

import dataclasses
import json
import math
import os

import flax.linen as nn
import gin
import jax
import numpy as np
import pytest
from flax import traverse_util

from core import optim, sharding
from data import tokenizers
from finetune import demo_task, glue, sweep, trainer
from finetune.tasks import TASKS, read_glue_dir
from interop import bundle
from models.classifier import ClassifierModel
from models.encoder import Encoder, EncoderConfig
from tests import cli_run, jitted

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LENGTH = 16
# ELECTRA-Small's shape, shrunk: embedding width below the hidden width, no pooler.
CONFIG = EncoderConfig(
    vocab_size=60,
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    intermediate_size=64,
    max_position_embeddings=LENGTH,
    embedding_size=16,
    pooler=False,
    classifier_head="electra",
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
)


def _batch(rows: int, seed: int) -> dict[str, np.ndarray]:
    """Random [rows, LENGTH] int32 inputs (two segments, some padding), labels and weights."""
    rs = np.random.RandomState(seed)
    lengths = rs.randint(LENGTH // 2, LENGTH + 1, rows)
    mask = (np.arange(LENGTH) < lengths[:, None]).astype(np.int32)
    return {
        "input_ids": rs.randint(5, CONFIG.vocab_size, (rows, LENGTH)).astype(np.int32) * mask,
        "input_mask": mask,
        "segment_ids": (np.arange(LENGTH) >= lengths[:, None] // 2).astype(np.int32) * mask,
        "labels": rs.randint(0, 2, rows).astype(np.int32),
        "weights": np.ones(rows, np.float32),
    }


def _pretraining_tree(config: EncoderConfig) -> dict:
    """An ELECTRA-shaped pretraining tree: the discriminator `encoder` (no pooler) beside a
    generator-side subtree, which fine-tuning does not read."""
    batch = _batch(1, 0)
    inputs = (batch["input_ids"], batch["input_mask"], batch["segment_ids"])
    encoder = jitted.init(Encoder(config), jax.random.key(0), *inputs, deterministic=True)["params"]
    return {
        "encoder": jax.device_get(nn.meta.unbox(encoder)),
        "generator_head": {"output_bias": np.zeros(config.vocab_size, np.float32)},
    }


@pytest.fixture(scope="module")
def pretrained():
    return _pretraining_tree(CONFIG)


@pytest.mark.slow
def test_electra_head_is_dense_on_the_first_token(pretrained):
    model = ClassifierModel(CONFIG, 3)
    batch = {k: v for k, v in _batch(4, 1).items() if k in ("input_ids", "input_mask", "segment_ids")}
    params = jax.device_get(nn.meta.unbox(jitted.init(model, jax.random.key(1), batch, deterministic=True)))
    params = params["params"]
    assert set(params) == {"encoder", "classifier"}  # no classifier_dense, no pooler
    assert {k: v.shape for k, v in params["classifier"].items()} == {"kernel": (32, 3), "bias": (3,)}
    assert set(params["encoder"]) == set(pretrained["encoder"])
    assert "pooler" not in params["encoder"] and "embedding_projection" in params["encoder"]
    # Glorot uniform (tf.layers.dense's default in the original), not truncated normal 0.02
    # (which never exceeds 0.04).
    kernel = params["classifier"]["kernel"]
    assert 0.04 < np.abs(kernel).max() <= math.sqrt(6 / (32 + 3))

    params["classifier"]["bias"] = np.array([0.1, -0.2, 0.3], np.float32)
    logits = jitted.apply(model, {"params": params}, batch, deterministic=True)
    encoded = jitted.apply(
        Encoder(CONFIG),
        {"params": params["encoder"]},
        batch["input_ids"],
        batch["input_mask"],
        batch["segment_ids"],
        deterministic=True,
    )
    first = np.asarray(encoded.sequence_output[:, 0], np.float64)
    expected = first @ kernel + params["classifier"]["bias"]
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-5, atol=1e-6)

    # Training: dropout acts on the first token's hidden state itself. An identity
    # classifier shows it: each feature is dropped (0) or kept and scaled by 1 / (1 - 0.5).
    identity = {"kernel": np.eye(32, dtype=np.float32), "bias": np.zeros(32, np.float32)}
    dropped = jitted.apply(
        ClassifierModel(CONFIG, 32, classifier_dropout_rate=0.5),
        {"params": {"encoder": params["encoder"], "classifier": identity}},
        batch,
        deterministic=False,
        rngs={"dropout": jax.random.key(2)},
    )
    dropped = np.asarray(dropped)
    kept = dropped != 0
    assert 0.2 < kept.mean() < 0.8
    np.testing.assert_allclose(dropped[kept], 2 * first[kept], rtol=1e-5)


@pytest.mark.slow(15)
@pytest.mark.extended
def test_discriminator_loads_and_layerwise_decay_scales_its_step(pretrained):
    """The pretrained encoder (no pooler) is loaded as is; with Grid's layerwise_lr_decay
    0.8 each parameter moves by the plain step times decay ** (layers + 2 - depth)."""
    partitioner = sharding.Partitioner.create(None)
    batch = _batch(8, 2)
    moves, ulps = {}, {}
    for decay in (None, 0.8):
        optimizer = trainer.OptimizerConfig(weight_decay=0.01, schedule="electra", layerwise_lr_decay=decay)
        steps = trainer.TaskSteps(CONFIG, TASKS["rte"], optimizer, LENGTH, partitioner)
        state = steps.init(0, pretrained, learning_rate=1e-2, warmup_steps=0, total_steps=10)
        before = traverse_util.flatten_dict(jax.device_get(state.params))
        for path, value in traverse_util.flatten_dict(pretrained["encoder"]).items():
            np.testing.assert_array_equal(before[("encoder", *path)], value)
        with partitioner:
            state, loss = steps.train_step(state, partitioner.global_batch(batch), jax.random.key(0))
        assert np.isfinite(float(loss))
        after = traverse_util.flatten_dict(jax.device_get(state.params))
        moves[decay] = {p: after[p].astype(np.float64) - before[p] for p in before}
        ulps[decay] = {p: np.spacing(np.maximum(np.abs(after[p]), np.abs(before[p]))) for p in before}
    factors = traverse_util.flatten_dict(
        optim.layerwise_lr_factors(traverse_util.unflatten_dict(before), 0.8, CONFIG.num_layers)
    )
    assert factors[("classifier", "kernel")] == 1.0
    assert factors[("encoder", "embedding_projection", "kernel")] == 0.8**4
    for path, factor in factors.items():
        # A float32 parameter's move is exact up to half an ulp of where it lands.
        expected = moves[None][path] * factor
        bound = (ulps[0.8][path] + factor * ulps[None][path]) / 2 + 1e-5 * np.abs(expected)
        assert np.all(np.abs(moves[0.8][path] - expected) <= bound), path


@pytest.fixture
def _clean_gin(monkeypatch):
    monkeypatch.chdir(ROOT)  # includes and --gin_file are relative to the repository root
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.mark.parametrize(
    "size,learning_rate,decay", [("", 1e-4, 0.8), ("_small", 3e-4, 0.8), ("_large", 5e-5, 0.9)]
)
def test_electra_glue_configs(_clean_gin, size, learning_rate, decay):
    """arXiv 2003.10555 Table 7 and configure_finetuning.py, per model size."""
    gin.parse_config_files_and_bindings([f"configs/glue/electra{size}.gin"], [])
    grids = {name: sweep.task_grid(TASKS[name]) for name in ("mnli", "rte", "stsb", "cola")}
    for name, grid in grids.items():
        assert grid.learning_rates == (learning_rate,) and grid.layerwise_lr_decay == decay
        assert grid.num_epochs == ((10,) if name in ("rte", "stsb") else (3,)), name
        assert (grid.batch_sizes, grid.warmup_ratio, grid.max_seq_length) == ((32,), 0.1, 128)
        assert len(grid.seeds) == 10  # the paper's median of 10 runs
        assert dataclasses.asdict(grid.optimizer) == {
            "weight_decay": 0.01,  # the code's weight_decay_rate (Table 7 says 0)
            "b1": 0.9,
            "b2": 0.999,
            "eps": 1e-6,
            "clip_norm": 1.0,
            "schedule": "electra",
            "decay_all_parameters": False,
            "layerwise_lr_decay": decay,
        }
        assert (grid.dropout_rate, grid.classifier_dropout_rate) == (0.1, 0.1)


@pytest.mark.slow(20)
@pytest.mark.extended
def test_glue_on_the_demo_task_from_an_electra_workdir(_clean_gin, tmp_path, capsys):
    glue_dir = str(tmp_path / "glue")
    demo_task.make_task(glue_dir, train=64, dev=32, test=16)
    sentences = [example.text_a for example in read_glue_dir(glue_dir, TASKS["word_order"]).train]
    tokenizer = tokenizers.train_wordpiece([sentences], 300)
    config = dataclasses.replace(CONFIG, vocab_size=tokenizer.vocab_size, max_position_embeddings=32)
    workdir = str(tmp_path / "electra")
    bundle.save_pretrained(workdir, config, _pretraining_tree(config), tokenizer, step=5)
    out = tmp_path / "out"
    result = cli_run.run(
        glue.main,
        [
            f"--init_from={workdir}",
            "--tasks=word_order",
            f"--glue_dir={glue_dir}",
            f"--workdir={out}",
            "--gin_file=configs/glue/electra.gin",
            "--gin_bindings=Grid.seeds = (0,)",
            "--gin_bindings=Grid.num_epochs = (1,)",
            "--gin_bindings=Grid.batch_sizes = (16,)",
            "--gin_bindings=Grid.max_seq_length = 32",
        ],
        capsys,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    entry = json.loads((out / "results.json").read_text())["tasks"]["word_order"]
    assert entry["grid"]["layerwise_lr_decay"] == 0.8 and entry["grid"]["schedule"] == "electra"
    assert entry["chosen"]["learning_rate"] == 1e-4  # the head's (base) learning rate
    run = sweep.run_dir(str(out), TASKS["word_order"], trainer.RunConfig(1e-4, 16, 1, 0))
    with open(os.path.join(run, "result.json")) as f:
        epochs = json.load(f)["epochs"]
    assert len(epochs) == 1 and np.isfinite(epochs[0]["train_loss"])
    assert 0.0 <= entry["metrics"]["dev"]["accuracy"] <= 1.0
