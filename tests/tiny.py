"""The tiny model the tests share, its batches, and a short training run of it.

One model shape (TINY) for the model tests and for every test that trains on the synthetic
shards (tests/conftest.py's `synthetic_shards`): a compiled program of a (config, batch)
pair is compiled once per `make test` and read from the persistent compilation cache by
every other test and subprocess that runs it.
"""

from __future__ import annotations

import contextlib
import dataclasses

import gin
import jax
import numpy as np

from core import axes, optim
from data import pipeline, synthetic
from models.encoder import EncoderConfig
from pretrain import trainer
from tests import jitted

TINY = EncoderConfig(
    vocab_size=synthetic.VOCAB_SIZE,
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
)
DATA = pipeline.PipelineConfig(
    max_seq_length=32, max_predictions_per_seq=5, document_shuffle_buffer=20, instance_shuffle_buffer=50
)
# SpanBERT's rows (whole documents, span masking) of conftest's `text_shards` (real WordPiece).
SPAN_DATA = pipeline.PipelineConfig(
    max_seq_length=64,
    format="doc_sentences",
    pack_examples=False,
    sentence_objective="none",
    masking_unit="span",
    masking="dynamic",
    document_shuffle_buffer=10,
    instance_shuffle_buffer=20,
)
BATCH = 16
RNG = jax.random.key(0)
# A model test's batch: B * L * V is larger than every array of the model, so "no array of
# B*L*V elements" is a sharp test that [B, L, V] never exists.
B, L, P = 2, 24, 4
# Logical-axis rules that use every mesh axis (data x fsdp x tensor).
RULES = (
    (axes.BATCH, ("data", "fsdp")),
    (axes.EMBED, "fsdp"),
    (axes.MLP, "tensor"),
    (axes.HEADS, "tensor"),
    (axes.VOCAB, "tensor"),
    (axes.LENGTH, None),
    (axes.KV, None),
    (axes.PREDICTIONS, None),
)


def make_batch(batch_size: int = B, seed: int = 0, real_len: int = L - 5) -> dict[str, np.ndarray]:
    """A random model batch: int32 input_ids, input_mask, segment_ids [batch_size, L] (rows of
    `real_len` real tokens, then padding) and masked_lm_positions [batch_size, P]."""
    rs = np.random.RandomState(seed)
    input_mask = np.zeros((batch_size, L), np.int32)
    input_mask[:, :real_len] = 1
    return {
        "input_ids": (rs.randint(1, TINY.vocab_size, (batch_size, L)) * input_mask).astype(np.int32),
        "input_mask": input_mask,
        "segment_ids": (np.arange(L)[None, :] >= real_len // 2).astype(np.int32) * input_mask,
        "masked_lm_positions": np.sort(
            np.stack([rs.choice(real_len, P, replace=False) for _ in range(batch_size)]), axis=1
        ).astype(np.int32),
    }


def loss_and_grads_step(model):
    """A jitted (variables, batch, rng) -> (deterministic outputs, (loss, gradients)) of a
    pretraining model with MLM and sentence heads, the loss drawn with dropout: a train step's
    work, without an optimizer."""

    def loss_fn(variables, batch, rng):
        out = jitted.apply(model, variables, batch, deterministic=False, rngs={"dropout": rng})
        return out["mlm_logits"].mean() + out["sentence_logits"].mean()

    def step(variables, batch, rng):
        outputs = jitted.apply(model, variables, batch, deterministic=True)
        return outputs, jax.value_and_grad(loss_fn)(variables, batch, rng)

    return jax.jit(step)


def settings(data_dir: str, steps: int, **overrides) -> trainer.RunSettings:
    """A short run of TINY on `data_dir`: log and checkpoint every 5 steps, 2 evaluation
    batches and no evaluation before the end, AdamW with 2 warmup steps."""
    base = trainer.RunSettings(
        data_dir=data_dir,
        model_config=TINY,
        pipeline_config=DATA,
        steps=steps,
        batch_size=BATCH,
        optimizer_fn=lambda total_steps: optim.adamw(total_steps, learning_rate=5e-3, warmup_steps=2),
        log_every=5,
        eval_every=1000,
        eval_batches=2,
        checkpoint_every=5,
    )
    return dataclasses.replace(base, **overrides)


def run(workdir, data_dir: str, steps: int, *, objective=None, mesh_spec=None, **overrides) -> dict:
    """`trainer.run` of `settings(...)` in `workdir`, with `make_objective.objective = objective`
    when given (default: the recipe's, MaskedLM); returns its summary."""
    with _objective(objective):
        return trainer.run(str(workdir), settings(data_dir, steps, **overrides), mesh_spec=mesh_spec)


@contextlib.contextmanager
def _objective(objective):
    if objective is None:
        yield
        return
    with gin.unlock_config():
        gin.bind_parameter("make_objective.objective", objective)
    try:
        yield
    finally:
        gin.clear_config()
