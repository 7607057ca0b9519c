"""BERT's two-phase schedule as one run: length 32 then 64 here (128 then 512 in the recipe),
one optimizer state and schedule, resumable in either phase and at the switch."""

import dataclasses
import os

import gin
import pytest

from core import preemption
from core.errors import ConfigError
from data.pipeline_config import PipelineConfig
from pretrain import step
from tests import tiny

PHASE2 = dataclasses.replace(tiny.DATA, max_seq_length=64, max_predictions_per_seq=10)


def _two_phase(workdir, data_dir, **kwargs):
    return tiny.run(workdir, data_dir, steps=12, phase2_start=6, phase2_pipeline_config=PHASE2, **kwargs)


@pytest.fixture
def traced_shapes(monkeypatch):
    """Batch shapes the train step was compiled for (it is traced once per shape)."""
    shapes = []
    original = step.train_step

    def recording(state, batch, rng, **kwargs):
        shapes.append((batch["input_ids"].shape, batch["masked_lm_positions"].shape))
        return original(state, batch, rng, **kwargs)

    monkeypatch.setattr(step, "train_step", recording)
    return shapes


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, synthetic_shards):
    return _two_phase(tmp_path_factory.mktemp("full"), synthetic_shards)["params_sha256"]


@pytest.mark.slow(25)
@pytest.mark.extended
def test_switches_length_and_predictions(tmp_path, synthetic_shards, traced_shapes):
    _two_phase(tmp_path, synthetic_shards)
    assert traced_shapes == [((16, 32), (16, 5)), ((16, 64), (16, 10))]


@pytest.mark.slow(60)
@pytest.mark.extended
def test_resume_in_either_phase_equals_uninterrupted(tmp_path, synthetic_shards, uninterrupted, monkeypatch):
    """Stopped (SIGTERM) in phase 1, at the switch and in phase 2, one after the other, and
    resumed each time: the final parameters are the uninterrupted run's."""
    stops = [4, 6, 9]  # in phase 1, at the switch, in phase 2

    def sigterm_at(watcher, step):  # what a SIGTERM during step `stops[0]` does
        if stops and step == stops[0]:
            watcher.signal_name = "SIGTERM"
        return watcher.signal_name is not None

    resumed_from = None
    for stop_at in list(stops):
        with monkeypatch.context() as patch:
            patch.setattr(preemption.StopWatcher, "should_stop", sigterm_at)
            stopped = _two_phase(tmp_path, synthetic_shards)
        assert stopped == {"step": stop_at, "stopped_by": "SIGTERM", "resumed_from": resumed_from}
        stops.pop(0)
        resumed_from = stop_at
    resumed = _two_phase(tmp_path, synthetic_shards)
    assert resumed["resumed_from"] == 9
    assert resumed["params_sha256"] == uninterrupted


def test_bad_phase_settings(tmp_path, synthetic_shards):
    with pytest.raises(ConfigError, match="must be in"):
        tiny.run(tmp_path, synthetic_shards, steps=6, phase2_start=6, phase2_pipeline_config=PHASE2)
    with pytest.raises(ConfigError, match="set both"):
        tiny.run(tmp_path, synthetic_shards, steps=6, phase2_start=3)
    too_long = dataclasses.replace(tiny.DATA, max_seq_length=128)
    with pytest.raises(ConfigError, match="exceeds EncoderConfig.max_position_embeddings = 64"):
        tiny.run(tmp_path, synthetic_shards, steps=6, phase2_start=3, phase2_pipeline_config=too_long)


def test_published_recipe_switches_at_900k_to_512():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cwd = os.getcwd()
    os.chdir(root)  # gin includes are relative to the repository root
    try:
        gin.clear_config()
        gin.parse_config_files_and_bindings(["configs/runs/bert_base_wikipedia.gin"], [])
        assert gin.query_parameter("run.phase2_start") == 900000
        assert (PipelineConfig().max_seq_length, PipelineConfig().max_predictions_per_seq) == (128, 20)
        with gin.config_scope("phase2"):
            phase2 = PipelineConfig()
        assert (phase2.max_seq_length, phase2.max_predictions_per_seq, phase2.masked_lm_prob) == (
            512,
            80,
            0.15,
        )
    finally:
        gin.clear_config()
        os.chdir(cwd)
