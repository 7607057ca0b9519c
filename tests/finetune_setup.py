"""A synthetic GLUE-style pair task and a tiny random "pretrained" model that learns it, for
the fine-tuning tests."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np

from core import sharding
from data import tokenizers
from finetune import trainer
from finetune.tasks import Example
from models.encoder import EncoderConfig
from models.pretraining import BertPretrainingModel, example_batch
from tests import jitted

KEY = "red"
WORDS = ["green", "blue", "yellow", "cat", "dog", "bird", "fish", "tree", "rock", "house", "road", "lamp"]
LENGTH = 16


def pair_examples(n: int, seed: int, regression: bool = False) -> list[Example]:
    """Label: does sentence B contain the key word? A holds it half the time as a distractor,
    so the model must tell the segments apart (a pair task, not a bag of words)."""
    rng = np.random.default_rng(seed)
    examples = []
    for i in range(n):
        positive = i % 2 == 0
        a, b = list(rng.choice(WORDS, 5)), list(rng.choice(WORDS, 5))
        if rng.random() < 0.5:
            a[rng.integers(5)] = KEY
        if positive:
            b[rng.integers(5)] = KEY
        label = (4.0 if positive else 1.0) if regression else (0 if positive else 1)  # RTE: 0 = entailment
        examples.append(Example(f"synthetic:{i}", str(i), " ".join(a), " ".join(b), label))
    return examples


def tiny_model():
    """A WordPiece vocab of the words, a 2-layer hidden-32 config and its random "pretrained" params."""
    tokenizer = tokenizers.train_wordpiece([[" ".join([KEY, *WORDS])] * 3], 100)
    config = EncoderConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        intermediate_size=64,
        max_position_embeddings=LENGTH,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
    )
    model = BertPretrainingModel(config)
    params = nn.meta.unbox(
        jitted.init(model, jax.random.key(0), example_batch(1, 8, 2), deterministic=True)["params"]
    )
    return tokenizer, config, jax.device_get(params)


def task_steps(config, task, mesh_spec=None):
    return trainer.TaskSteps(
        config,
        task,
        trainer.OptimizerConfig(weight_decay=0.0),
        LENGTH,
        sharding.Partitioner.create(mesh_spec),
        classifier_dropout_rate=0.0,
    )
