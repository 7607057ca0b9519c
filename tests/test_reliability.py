"""Divergence policy, start-up disk checks, incompatible checkpoints and the multi-host stop
agreement, in process. Kills, preemption and damaged checkpoints of real runs are in
tests/fault_injection.py (run by tests/test_fault_injection.py)."""

import collections
import dataclasses
import logging
import os
import signal

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorflow as tf

from core import checkpointing, preemption
from data import pipeline
from models import pretrained
from models.encoder import EncoderConfig
from pretrain.monitor import DivergedError
from tests.test_train import DATA, TINY, _run, data_dir  # noqa: F401  (data_dir is a fixture)


@pytest.fixture
def poisoned_steps(monkeypatch):
    """Makes the loss (and so the gradients) NaN at the given 1-based steps of a fresh run,
    through the data: the training batches of those steps carry NaN prediction weights.
    (The step itself is untouched, so it compiles to what every other run here compiles.)"""
    bad_steps = []
    original = pipeline.make_dataset

    def poisoned(directory, split, *args, **kwargs):
        ds = original(directory, split, *args, **kwargs)
        if split != "train":
            return ds
        bad = tf.constant(bad_steps or [-1], tf.int64)

        def poison(index, batch):
            nan = tf.reduce_any(tf.equal(index + 1, bad))
            weights = batch["masked_lm_weights"]
            return dict(
                batch, masked_lm_weights=tf.where(nan, tf.fill(tf.shape(weights), float("nan")), weights)
            )

        return ds.enumerate().map(poison)

    monkeypatch.setattr(pipeline, "make_dataset", poisoned)
    return bad_steps


@pytest.mark.slow(15)
def test_non_finite_loss_stops_and_never_saves_it(tmp_path, data_dir, poisoned_steps):  # noqa: F811
    poisoned_steps.extend([7])
    with pytest.raises(DivergedError) as error:
        _run(tmp_path, data_dir, steps=12, checkpoint_every=5, log_every=100)
    message = str(error.value)
    assert "non-finite loss nan" in message and "at step 7" in message
    assert f"last good checkpoint: step 5 in {tmp_path}/checkpoints" in message
    assert "run.max_skipped_steps" in message
    # Step 10's state holds NaN parameters: it must not have been written.
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["5"]


@pytest.mark.slow(15)
def test_skip_policy_skips_and_logs_each_step(tmp_path, data_dir, poisoned_steps, caplog):  # noqa: F811
    poisoned_steps.extend([3, 8])
    with caplog.at_level(logging.WARNING, logger="pretrain.monitor"):
        summary = _run(tmp_path, data_dir, steps=10, max_skipped_steps=2)
    skipped = [r.getMessage() for r in caplog.records if "update skipped" in r.getMessage()]
    assert [m.split(":")[0] for m in skipped] == ["step 3", "step 8"]
    assert summary["skipped_steps"] == 2 and np.isfinite(summary["loss"])
    # A skipped update leaves the moments as they were but not the optimizer's step counts
    # (the schedule's and Adam's): they stay equal to the state's step, so the learning rate
    # logged is the one applied and the schedule still reaches 0 at the last step.
    saved = ocp.PyTreeCheckpointer().restore(str(tmp_path / "checkpoints" / "10" / "state"))
    counts = [
        int(x) for x in jax.tree.leaves(saved["opt_state"]) if np.issubdtype(np.asarray(x).dtype, np.integer)
    ]
    assert counts and set(counts) == {10} and int(saved["step"]) == 10


@pytest.mark.slow(15)
def test_skip_budget_exhausted_stops(tmp_path, data_dir, poisoned_steps):  # noqa: F811
    poisoned_steps.extend([3, 6])
    with pytest.raises(DivergedError, match=r"at step 6 after 1 skipped steps \(run.max_skipped_steps = 1\)"):
        _run(tmp_path, data_dir, steps=10, max_skipped_steps=1)


@pytest.mark.slow(15)
def test_checkpoint_of_another_model_is_an_error_and_stays(tmp_path, data_dir):  # noqa: F811
    _run(tmp_path, data_dir, steps=5)
    described = {name: (tmp_path / name).read_text() for name in ("model_config.json", "config.gin")}
    wider = EncoderConfig(**{**TINY.__dict__, "intermediate_size": 48})
    with pytest.raises(
        checkpointing.CheckpointError,
        match=r"has parameter encoder/layer_0/intermediate/bias of shape \(64,\), the config gives \(48,\)",
    ):
        _run(tmp_path, data_dir, steps=10, model_config=wider)
    assert os.listdir(tmp_path / "checkpoints") == ["5"]
    assert not os.path.exists(tmp_path / checkpointing.BAD_CHECKPOINTS)
    # The refused run left the workdir's description of its checkpoints as it was.
    assert {name: (tmp_path / name).read_text() for name in described} == described
    assert pretrained.load_model_config(str(tmp_path)).intermediate_size == TINY.intermediate_size


@pytest.mark.slow(20)
def test_data_position_of_another_pipeline_is_an_error_not_damage(tmp_path, data_dir, caplog):  # noqa: F811
    """A changed input pipeline cannot read the saved data position: one error line and
    every checkpoint stays where it is (it is not damaged); run.reset_data_iterator keeps
    the model and optimizer state and restarts the data stream."""
    _run(tmp_path, data_dir, steps=5)
    unshuffled = dataclasses.replace(DATA, instance_shuffle_buffer=1)  # another dataset graph
    with pytest.raises(checkpointing.IteratorMismatchError, match="holds the data position of another input"):
        _run(tmp_path, data_dir, steps=10, pipeline_config=unshuffled)
    assert os.listdir(tmp_path / "checkpoints") == ["5"]
    assert not os.path.exists(tmp_path / checkpointing.BAD_CHECKPOINTS)
    with caplog.at_level(logging.INFO):
        summary = _run(tmp_path, data_dir, steps=10, pipeline_config=unshuffled, reset_data_iterator=True)
    assert summary["step"] == 10 and "resumed from step 5" in caplog.text
    assert "the data stream restarts from its beginning" in caplog.text


def test_failed_save_names_the_last_checkpoint_complete_on_disk(tmp_path):
    """An async save that fails surfaces at the next save, when orbax already counts the
    failed step: the error must name the newest step that is complete on disk."""
    ckpt = checkpointing.Checkpointer(str(tmp_path))
    for name in ("2", "4", "6.orbax-checkpoint-tmp-1795000000"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    error = ckpt._save_error(8, OSError("File too large"))
    assert "the last complete checkpoint is step 4:" in str(error)


def test_unwritable_workdir_is_reported_before_anything_runs(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(checkpointing.CheckpointError, match="is not writable .* choose another --workdir"):
        checkpointing.check_writable(str(blocker / "run"))


def test_too_little_disk_for_one_checkpoint(tmp_path, monkeypatch, caplog):
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(checkpointing.shutil, "disk_usage", lambda path: usage(10**9, 0, 5 * 10**8))
    with pytest.raises(checkpointing.CheckpointError, match="only 0.50 GB free .* needs about 1.30 GB"):
        checkpointing.check_free_space(str(tmp_path), 13 * 10**8, max_to_keep=3)
    with caplog.at_level(logging.WARNING, logger="core.checkpointing"):
        checkpointing.check_free_space(str(tmp_path), 2 * 10**8, max_to_keep=3)
    assert "less than the 3 checkpoints" in caplog.text
    checkpointing.check_free_space("gs://bucket/run", 13 * 10**8, max_to_keep=3)  # no local limit


def test_state_bytes_counts_params_and_optimizer_state():
    tree = {"a": np.zeros((3, 4), np.float32), "b": [np.zeros(5, np.int32)]}
    assert checkpointing.state_bytes(tree) == 3 * 4 * 4 + 5 * 4


def test_single_host_stop_on_sigterm_and_handlers_restored():
    before = signal.getsignal(signal.SIGTERM)
    with preemption.StopWatcher() as watcher:
        assert not watcher.should_stop(1)
        os.kill(os.getpid(), signal.SIGTERM)
        assert watcher.should_stop(2) and watcher.signal_name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_multi_host_stop_waits_for_the_agreed_step(monkeypatch):
    """On a pod the step comes from JAX's preemption sync service, and SIGTERM stays JAX's."""
    monkeypatch.setattr(preemption.jax, "process_count", lambda: 4)
    agreed = []
    monkeypatch.setattr(
        preemption.multihost_utils,
        "reached_preemption_sync_point",
        lambda step: agreed.append(step) or step == 7,
    )
    before = signal.getsignal(signal.SIGTERM)
    with preemption.StopWatcher() as watcher:
        assert signal.getsignal(signal.SIGTERM) is before
        assert [watcher.should_stop(s) for s in range(5, 9)] == [False, False, True, False]
    assert agreed == [5, 6, 7, 8]
