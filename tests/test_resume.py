"""Stop + resume equals an uninterrupted run, for every objective: a run restarted from a
checkpoint in its middle ends with the same parameters (params_sha256) as the run that never
stopped, so the restored state, data position and every random stream (dropout with either
PRNG; ELECTRA's and DeBERTa-v3's masking and sampling; SpanBERT's span masking) continue
exactly, the flash kernel's attention dropout included.

Each case trains 10 steps with checkpoints at 5 and 10, removes checkpoint 10 (what a
preemption after step 9 leaves), and runs the same command again: it resumes from step 5.
BERT's two phases resume in either phase in tests/test_two_phase.py; a killed process, a
SIGTERM and damaged checkpoints in tests/fault_injection.py.
"""

import dataclasses
import json
import os
import shutil

import pytest

from core import data_position
from data import shards
from models.disentangled import DisentangledConfig
from pretrain.objectives import DebertaRTD, ElectraRTD, SpanBoundary
from tests import tiny

IN_STEP = dataclasses.replace(tiny.DATA, masking="in_step", sentence_objective="none")
# v2 with buckets and the convolution, so every piece of the encoder runs.
DEBERTA = dataclasses.replace(
    tiny.TINY,
    type_vocab_size=0,
    layer_norm_eps=1e-7,
    pooler=False,
    classifier_head="deberta",
    disentangled=DisentangledConfig(
        position_buckets=8, max_relative_positions=32, conv_kernel_size=3, conv_act="gelu"
    ),
)
# name -> (shards fixture, settings of tiny.run beyond its defaults, metrics evaluation reports)
CASES = {
    "mlm_threefry": ("synthetic_shards", {}, ("mlm_accuracy", "sentence_accuracy")),
    "mlm_rbg": ("synthetic_shards", {"dropout_prng": "rbg"}, ("mlm_accuracy", "sentence_accuracy")),
    # Attention dropout drawn inside the flash kernel (Pallas interpret mode here).
    "mlm_flash": (
        "synthetic_shards",
        {"model_config": dataclasses.replace(tiny.TINY, attention_implementation="flash")},
        ("mlm_accuracy", "sentence_accuracy"),
    ),
    "electra": (
        "synthetic_shards",
        {
            "objective": ElectraRTD,
            "model_config": dataclasses.replace(tiny.TINY, pooler=False, classifier_head="electra"),
            "pipeline_config": IN_STEP,
        },
        ("mlm_accuracy", "disc_accuracy", "disc_precision", "disc_recall", "replaced_rate"),
    ),
    "spanbert": (
        "text_shards",
        {"objective": SpanBoundary, "pipeline_config": tiny.SPAN_DATA, "batch_size": 8},
        ("mlm_accuracy", "sbo_accuracy"),
    ),
    "deberta_v3": (
        "synthetic_shards",
        {"objective": DebertaRTD, "model_config": DEBERTA, "pipeline_config": IN_STEP},
        ("mlm_accuracy", "disc_accuracy"),
    ),
}


@pytest.mark.slow(30)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.extended(keep=["mlm_threefry"])
def test_resume_after_stop_equals_uninterrupted_run(case, tmp_path, request):
    fixture, settings, metrics = CASES[case]
    data_dir = request.getfixturevalue(fixture)
    if fixture == "text_shards":
        vocab = shards.load_manifest(data_dir).vocab_size
        settings = {**settings, "model_config": dataclasses.replace(tiny.TINY, vocab_size=vocab)}
    full = tiny.run(tmp_path, data_dir, steps=10, **settings)
    assert full["step"] == 10 and full.get("resumed_from") is None
    objective = settings.get("objective")
    assert full["objective"] == (objective.__name__ if objective else "MaskedLM")
    assert set(metrics) <= set(full["eval"]), sorted(full["eval"])
    # What a preemption after step 9 leaves: the checkpoint of step 5 is the newest.
    shutil.rmtree(tmp_path / "checkpoints" / "10")  # its data positions with it
    os.remove(tmp_path / "summary.json")
    resumed = tiny.run(tmp_path, data_dir, steps=10, **settings)
    assert resumed["resumed_from"] == 5
    assert resumed["params_sha256"] == full["params_sha256"]
    assert json.loads((tmp_path / "summary.json").read_text())["params_sha256"] == full["params_sha256"]
    if case == "mlm_threefry":
        _resume_from_the_older_layout(tmp_path, data_dir, settings, full["params_sha256"])


def _resume_from_the_older_layout(workdir, data_dir, settings, uninterrupted):
    """Checkpoint 5 as versions before the data position was an orbax item left it (the
    positions in data_iterators/5/) resumes exactly too."""
    shutil.rmtree(workdir / "checkpoints" / "10")
    os.remove(workdir / "summary.json")
    shutil.move(workdir / "checkpoints" / "5" / data_position.ITEM, workdir / data_position.LEGACY_DIR / "5")
    resumed = tiny.run(workdir, data_dir, steps=10, **settings)
    assert resumed["resumed_from"] == 5 and resumed["params_sha256"] == uninterrupted
