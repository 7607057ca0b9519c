"""Every gin file under configs/ parses and builds its objects (abstractly), so a broken
config fails here and not on a TPU pod."""

import glob
import os

import gin
import jax
import pytest

from core import optim
from core.state import count_params
from data.pipeline_config import PipelineConfig
from finetune import sweep, tasks  # registers Grid (configs/glue)
from models.encoder import EncoderConfig
from pretrain import ablate, trainer
from pretrain.objectives import make_objective

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIN_FILES = sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "configs", "**", "*.gin"), recursive=True)
)


@pytest.fixture(autouse=True)
def _clean_gin():
    gin.clear_config()
    cwd = os.getcwd()
    os.chdir(ROOT)  # includes are relative to the repository root
    yield
    os.chdir(cwd)
    gin.clear_config()


def test_there_are_configs():
    names = {os.path.basename(p) for p in GIN_FILES}
    assert {
        "bert_tiny.gin",
        "bert_base.gin",
        "bert_large.gin",
        "bert.gin",
        "demo.gin",
        "bert_base_wikipedia.gin",
    } <= names


def _as_launched(path: str) -> list[str]:
    """The gin files a file is launched with, in order: a model size file, then its family's
    recipe (configs/models/xlnet_base.gin + configs/recipes/xlnet.gin); an ablation arm after
    its grid's base run when the grid names one (base.txt); any other file alone."""
    parts = path.split(os.sep)
    if parts[1] == "ablations":
        return [*(ablate.grid_base(os.path.join(ROOT, *parts[:3])) or []), path]
    recipe = os.path.join("configs", "recipes", parts[2].split("_")[0] + ".gin")
    if parts[1] == "models" and os.path.exists(os.path.join(ROOT, recipe)):
        return [path, recipe]
    return [path]


@pytest.mark.slow
# `make test` builds the files users launch as they are (recipes, runs, GLUE grids); the model
# sizes and ablation arms, each combined with a recipe at launch, are in the extended tier.
@pytest.mark.extended(keep=[p for p in GIN_FILES if p.split(os.sep)[1] in ("recipes", "runs", "glue")])
@pytest.mark.parametrize("path", GIN_FILES)
def test_gin_file_parses_and_builds(path):
    gin.parse_config_files_and_bindings(_as_launched(path), [])
    config = EncoderConfig()
    pipeline_config = PipelineConfig()
    assert pipeline_config.max_predictions_per_seq <= pipeline_config.max_seq_length
    objective = make_objective(config, pipeline_config)  # the recipe's objective, model and heads
    assert count_params(jax.eval_shape(objective.init, jax.random.key(0))) > 0
    optimizer, schedule = optim.adamw(total_steps=100)
    assert float(schedule(50)) >= 0
    if path.startswith(os.path.join("configs", "runs")):
        for name in ("steps", "batch_size", "model_config", "pipeline_config", "optimizer_fn"):
            gin.query_parameter(f"run.{name}")
        # The run's settings pass their checks (pretrain/demo.py binds the demo's data_dir).
        trainer.RunSettings(data_dir="shards/")
    if path.startswith(os.path.join("configs", "glue")):
        for task in tasks.TASKS.values():  # every task's grid, per-task scopes included
            assert sweep.task_grid(task).runs()
