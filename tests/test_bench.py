"""The benchmarks run and print their JSON line (functional only: timings are not tested),
and packing, which the speed work relies on, leaves each example's MLM loss unchanged."""

import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np

from models.encoder import EncoderConfig
from models.pretraining import PretrainingModel
from pretrain import losses

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _json_line(*args):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_pretrain_benchmark_prints_its_result():
    result = _json_line(
        "bench.pretrain",
        "--gin_file=configs/models/bert_tiny.gin",
        "--gin_bindings=EncoderConfig.vocab_size=2048",
        "--batch=4",
        "--seq=32",
        "--steps=2",
    )
    assert result["name"] == "ours" and result["batch"] == 4 and result["seq"] == 32
    assert result["predictions"] == 5  # 20 per 128 tokens
    assert result["tokens_per_second"] > 0 and result["compile_seconds"] > 0
    # 4 rows of 32 real tokens per step.
    assert (
        abs(result["tokens_per_second"] - 128 * result["steps_per_second"])
        < 1e-3 * result["tokens_per_second"]
    )
    assert 0 < result["mfu"] < 1 and result["peak_memory_bytes"] > 0
    assert result["config"]["vocab_size"] == 2048


def test_input_pipeline_benchmark_prints_its_result():
    result = _json_line("bench.input_pipeline", "--batch=8", "--seq=32", "--batches=5")
    assert result["examples_per_second"] > 0 and result["tokens_per_second"] > result["examples_per_second"]


def test_packed_rows_give_each_example_its_unpacked_mlm_loss():
    """Two examples packed into one row (example_ids, restarting positions) have the same
    masked-position logits and per-example MLM loss as each example alone in its row."""
    config = EncoderConfig(
        vocab_size=300,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    model = PretrainingModel(config, sentence_objective=False)
    rng = np.random.default_rng(0)
    lengths, length = (11, 9), 24
    examples = [rng.integers(5, 300, n).astype(np.int32) for n in lengths]
    masked = [np.array([1, 4, 7]), np.array([2, 5, 8])]  # positions within each example

    def one(tokens, where):
        b = {k: np.zeros((1, length), np.int32) for k in ("input_ids", "input_mask", "segment_ids")}
        b["input_ids"][0, : len(tokens)], b["input_mask"][0, : len(tokens)] = tokens, 1
        b["masked_lm_positions"] = where[None].astype(np.int32)
        b["masked_lm_ids"] = tokens[where][None]
        b["masked_lm_weights"] = np.ones((1, len(where)), np.float32)
        return b

    packed = {
        k: np.zeros((1, length), np.int32)
        for k in ("input_ids", "input_mask", "segment_ids", "positions", "example_ids")
    }
    offset = 0
    for k, tokens in enumerate(examples):
        span = slice(offset, offset + len(tokens))
        packed["input_ids"][0, span], packed["input_mask"][0, span] = tokens, 1
        packed["positions"][0, span], packed["example_ids"][0, span] = np.arange(len(tokens)), k + 1
        offset += len(tokens)
    where = np.concatenate([masked[0], masked[1] + lengths[0]])
    packed["masked_lm_positions"] = where[None].astype(np.int32)
    packed["masked_lm_ids"] = packed["input_ids"][:, where]
    packed["masked_lm_weights"] = np.ones((1, len(where)), np.float32)

    params = nn.meta.unbox(model.init(jax.random.key(0), packed, deterministic=True))
    packed_logits = np.asarray(model.apply(params, packed, deterministic=True)["mlm_logits"])[0]
    for k, tokens in enumerate(examples):
        alone = one(tokens, masked[k])
        logits = model.apply(params, alone, deterministic=True)["mlm_logits"]
        np.testing.assert_allclose(packed_logits[3 * k : 3 * k + 3], np.asarray(logits)[0], atol=2e-5)
        piece = {key: packed[key][:, 3 * k : 3 * k + 3] for key in ("masked_lm_ids", "masked_lm_weights")}
        loss_packed = losses.mlm_loss_and_metrics(
            packed_logits[None, 3 * k : 3 * k + 3], piece["masked_lm_ids"], piece["masked_lm_weights"]
        )
        loss_alone = losses.mlm_loss_and_metrics(logits, alone["masked_lm_ids"], alone["masked_lm_weights"])
        np.testing.assert_allclose(loss_packed["mlm_loss_sum"], loss_alone["mlm_loss_sum"], rtol=1e-5)
