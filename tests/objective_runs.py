"""A short `pretrain.trainer.run` of a non-default objective, for the family members' resume
tests (tests/test_electra.py, tests/test_spanbert.py): checkpoints every 5 steps, no evaluation
during training, the same small optimizer."""

from __future__ import annotations

import gin

from core import optim
from pretrain import trainer


def run(workdir, data_dir, steps, *, objective, model_config, pipeline_config, batch_size) -> dict:
    """trainer.run with `make_objective.objective = objective`; returns its summary."""
    with gin.unlock_config():
        gin.bind_parameter("make_objective.objective", objective)
    try:
        return trainer.run(
            str(workdir),
            data_dir=data_dir,
            model_config=model_config,
            pipeline_config=pipeline_config,
            steps=steps,
            batch_size=batch_size,
            optimizer_fn=lambda total_steps: optim.adamw(10, learning_rate=1e-3, warmup_steps=2),
            log_every=5,
            eval_every=1000,
            eval_batches=2,
            checkpoint_every=5,
        )
    finally:
        gin.clear_config()
