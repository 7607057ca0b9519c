"""Fine-tuning: a tiny random model learns a synthetic pair task; pretrained weights are
loaded (pooler included); sweeps choose by the median and resume without redoing runs."""

import json
import os

import jax
import numpy as np
import pytest

from core import sharding
from core.errors import ConfigError
from finetune import sweep, trainer
from finetune.model import PretrainedWeightsError
from finetune.tasks import TASKS
from models.encoder import EncoderConfig
from tests import finetune_setup


@pytest.fixture(scope="module")
def tiny():
    return finetune_setup.tiny_model()


@pytest.mark.slow(20)
def test_tiny_random_model_learns_a_pair_task(tiny):
    tokenizer, config, params = tiny
    task = TASKS["rte"]
    train = trainer.featurize(finetune_setup.pair_examples(1024, 0), task, tokenizer, finetune_setup.LENGTH)
    dev = trainer.featurize(finetune_setup.pair_examples(256, 1), task, tokenizer, finetune_setup.LENGTH)
    result = trainer.finetune(
        finetune_setup.task_steps(config, task, "data:4,fsdp:2"),
        params,
        train,
        {"dev": dev},
        {"test": dev},
        # A random-init model sits on a plateau for an epoch or two, then learns the task.
        trainer.RunConfig(learning_rate=2e-3, batch_size=32, num_epochs=4, seed=0),
    )
    assert result.dev["dev"]["accuracy"] > 0.9, result.epochs
    assert result.score == max(e["score"] for e in result.epochs)  # the best epoch is kept
    assert result.test_logits["test"].shape == (256, 2)


@pytest.mark.slow(15)
@pytest.mark.extended
def test_regression_head_learns_scores(tiny):
    tokenizer, config, params = tiny
    task = TASKS["stsb"]
    train = trainer.featurize(
        finetune_setup.pair_examples(1024, 2, regression=True), task, tokenizer, finetune_setup.LENGTH
    )
    dev = trainer.featurize(
        finetune_setup.pair_examples(256, 3, regression=True), task, tokenizer, finetune_setup.LENGTH
    )
    result = trainer.finetune(
        finetune_setup.task_steps(config, task),
        params,
        train,
        {"dev": dev},
        {},
        trainer.RunConfig(5e-3, 32, 4, seed=0),
    )
    assert result.dev["dev"]["pearson"] > 0.9, result.epochs
    assert result.test_logits == {}


@pytest.mark.slow
def test_pretrained_encoder_and_pooler_are_loaded(tiny):
    tokenizer, config, params = tiny
    steps = finetune_setup.task_steps(config, TASKS["mnli"])
    schedule = dict(learning_rate=1e-3, warmup_steps=1, total_steps=10)
    state = steps.init(0, params, **schedule)
    loaded = jax.device_get(state.params)
    for path, value in jax.tree_util.tree_leaves_with_path(params["encoder"]):
        got = loaded["encoder"]
        for key in path:
            got = got[key.key]
        np.testing.assert_array_equal(got, value)
    assert loaded["classifier"]["kernel"].shape == (config.hidden_size, 3)
    other = jax.device_get(steps.init(1, params, **schedule).params)
    assert not np.array_equal(other["classifier"]["kernel"], loaded["classifier"]["kernel"])

    without_pooler = {"encoder": {k: v for k, v in params["encoder"].items() if k != "pooler"}}
    fresh = jax.device_get(steps.init(5, without_pooler, **schedule).params)  # not the pretraining init seed
    assert not np.array_equal(fresh["encoder"]["pooler"]["kernel"], params["encoder"]["pooler"]["kernel"])
    without_layer = {"encoder": {k: v for k, v in params["encoder"].items() if k != "layer_1"}}
    with pytest.raises(PretrainedWeightsError, match="no encoder parameter layer_1/"):
        steps.init(0, without_layer, **schedule)


def _fake_result(score: float) -> trainer.RunResult:
    dev = {"dev": {"accuracy": score}}
    return trainer.RunResult(
        [{"epoch": 1, "dev": dev, "score": score}], 1, dev, score, {"test": np.zeros((2, 2))}, 0.0
    )


def test_sweep_chooses_by_median_over_seeds(tmp_path):
    # lr 1e-5: one lucky seed (mean 0.37, median 0.1); lr 2e-5: steady (mean 0.4, median 0.5).
    scores = {(1e-5, 0): 0.9, (1e-5, 1): 0.1, (1e-5, 2): 0.1, (2e-5, 0): 0.5, (2e-5, 1): 0.5, (2e-5, 2): 0.2}
    grid = sweep.Grid(learning_rates=(1e-5, 2e-5), batch_sizes=(32,), num_epochs=(3,), seeds=(0, 1, 2))
    result = sweep.sweep(
        TASKS["rte"], grid, str(tmp_path), lambda run: _fake_result(scores[(run.learning_rate, run.seed)])
    )
    assert result.chosen["learning_rate"] == 2e-5 and result.chosen["score_median"] == 0.5
    assert result.chosen["score_mean"] == pytest.approx(0.4) and result.chosen_seed in (0, 1)
    assert result.chosen["dev_median"] == {"dev": {"accuracy": 0.5}}
    assert [c["name"] for c in result.configurations] == ["lr1e-05_bs32_ep3", "lr2e-05_bs32_ep3"]


@pytest.mark.slow(15)
@pytest.mark.extended
def test_half_finished_sweep_resumes_without_redoing_runs(tiny, tmp_path):
    tokenizer, config, params = tiny
    task = TASKS["rte"]
    train = trainer.featurize(finetune_setup.pair_examples(128, 0), task, tokenizer, finetune_setup.LENGTH)
    dev = trainer.featurize(finetune_setup.pair_examples(64, 1), task, tokenizer, finetune_setup.LENGTH)
    steps = finetune_setup.task_steps(config, task)
    trained = []

    def train_one(run):
        trained.append((run.learning_rate, run.seed))
        return trainer.finetune(steps, params, train, {"dev": dev}, {"test": dev}, run)

    grid = sweep.Grid(learning_rates=(1e-3, 3e-3), batch_sizes=(32,), num_epochs=(1,), seeds=(0, 1))
    first = sweep.sweep(task, grid, str(tmp_path), train_one)
    assert (first.trained, first.reused, len(trained)) == (4, 0, 4)

    # Stop "half way": two runs lose their result (one keeps its logits, as if killed while saving).
    for run in grid.runs()[2:]:
        directory = sweep.run_dir(str(tmp_path), task, run)
        os.remove(os.path.join(directory, "result.json"))
    os.remove(os.path.join(sweep.run_dir(str(tmp_path), task, grid.runs()[3]), "test_logits.npz"))
    trained.clear()
    second = sweep.sweep(task, grid, str(tmp_path), train_one)
    assert (second.trained, second.reused) == (2, 2)
    assert trained == [(3e-3, 0), (3e-3, 1)]  # only the unfinished runs trained again
    assert second.configurations[0] == first.configurations[0]  # read back unchanged
    with open(os.path.join(sweep.run_dir(str(tmp_path), task, grid.runs()[0]), "result.json")) as f:
        assert json.load(f)["run"]["learning_rate"] == 1e-3
    third = sweep.sweep(task, grid, str(tmp_path), train_one)
    assert (third.trained, third.reused) == (0, 4)


def test_length_is_checked_against_the_position_table_after_its_offset():
    """RoBERTa's table has 514 rows of which positions use rows 2..513: 512 tokens fit, 513
    do not (fine-tuning used to check 514, and then read past the table)."""
    config = EncoderConfig(
        vocab_size=50,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        intermediate_size=32,
        max_position_embeddings=18,
        position_offset=2,
    )
    partitioner = sharding.Partitioner.create(None)
    trainer.TaskSteps(config, TASKS["rte"], trainer.OptimizerConfig(), 16, partitioner)
    with pytest.raises(ConfigError, match="Grid.max_seq_length 17 exceeds .* minus position_offset = 2"):
        trainer.TaskSteps(config, TASKS["rte"], trainer.OptimizerConfig(), 17, partitioner)


def test_the_epoch_line_names_dev_files_only_where_a_task_has_several():
    assert trainer._dev_text({"dev": {"accuracy": 0.918}}) == "accuracy=0.9180"
    two = {"dev_matched": {"accuracy": 0.8412}, "dev_mismatched": {"accuracy": 0.839}}
    assert trainer._dev_text(two) == "dev_matched:accuracy=0.8412  dev_mismatched:accuracy=0.8390"
