"""Divergence policy, start-up disk checks, incompatible checkpoints and the multi-host stop
agreement, in process. Kills, preemption and damaged checkpoints of real runs are in
tests/fault_injection.py (run by tests/test_fault_injection.py)."""

import asyncio
import collections
import dataclasses
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import types
import warnings

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorflow as tf

from core import checkpointing, preemption
from core.errors import ConfigError
from data import pipeline
from interop import bundle
from models.encoder import EncoderConfig
from pretrain import launches
from pretrain.monitor import DivergedError
from tests import tiny


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
def test_non_finite_loss_stops_and_never_saves_it(tmp_path, synthetic_shards, poisoned_steps):
    poisoned_steps.extend([7])
    with pytest.raises(DivergedError) as error:
        tiny.run(tmp_path, synthetic_shards, steps=12, checkpoint_every=5, log_every=100)
    message = str(error.value)
    assert "non-finite loss nan" in message and "at step 7" in message
    assert f"last good checkpoint: step 5 in {tmp_path}/checkpoints" in message
    assert "run.max_skipped_steps" in message
    # Step 10's state holds NaN parameters: it must not have been written.
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["5"]


@pytest.mark.slow(15)
@pytest.mark.extended
def test_skip_policy_skips_and_logs_each_step(tmp_path, synthetic_shards, poisoned_steps, caplog):
    poisoned_steps.extend([3, 8])
    with caplog.at_level(logging.WARNING, logger="pretrain.monitor"):
        summary = tiny.run(tmp_path, synthetic_shards, steps=10, max_skipped_steps=2)
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
@pytest.mark.extended
def test_skip_budget_exhausted_stops(tmp_path, synthetic_shards, poisoned_steps):
    poisoned_steps.extend([3, 6])
    with pytest.raises(DivergedError, match=r"at step 6 after 1 skipped steps \(run.max_skipped_steps = 1\)"):
        tiny.run(tmp_path, synthetic_shards, steps=10, max_skipped_steps=1)


@pytest.mark.slow(15)
@pytest.mark.extended
def test_checkpoint_of_another_model_is_an_error_and_stays(tmp_path, synthetic_shards):
    tiny.run(tmp_path, synthetic_shards, steps=5)
    described = {name: (tmp_path / name).read_text() for name in ("model_config.json", "config.gin")}
    wider = EncoderConfig(**{**tiny.TINY.__dict__, "intermediate_size": 48})
    with pytest.raises(ConfigError, match="EncoderConfig.intermediate_size = 48, but the checkpoints in"):
        tiny.run(tmp_path, synthetic_shards, steps=10, model_config=wider)
    # Without a launch history (an older version's workdir), the checkpoint's shapes say it.
    shutil.rmtree(tmp_path / launches.LAUNCHES_DIR)
    with pytest.raises(
        checkpointing.CheckpointError,
        match=r"has parameter encoder/layer_0/intermediate/bias of shape \(64,\), the config gives \(48,\)",
    ):
        tiny.run(tmp_path, synthetic_shards, steps=10, model_config=wider)
    assert os.listdir(tmp_path / "checkpoints") == ["5"]
    assert not os.path.exists(tmp_path / checkpointing.BAD_CHECKPOINTS)
    # The refused run left the workdir's description of its checkpoints as it was.
    assert {name: (tmp_path / name).read_text() for name in described} == described
    assert bundle.load_model_config(str(tmp_path)).intermediate_size == tiny.TINY.intermediate_size


@pytest.mark.slow(20)
@pytest.mark.extended
def test_data_position_of_another_pipeline_is_an_error_not_damage(tmp_path, synthetic_shards, caplog):
    """A changed input pipeline cannot read the saved data position: one error line and
    every checkpoint stays where it is (it is not damaged); run.reset_data_iterator keeps
    the model and optimizer state and restarts the data stream. The launch history refuses
    a changed PipelineConfig first; the data position's own check is what is left for a
    workdir without one (an older version's, or pipeline code changed since)."""
    tiny.run(tmp_path, synthetic_shards, steps=5)
    unshuffled = dataclasses.replace(tiny.DATA, instance_shuffle_buffer=1)  # another dataset graph
    with pytest.raises(
        ConfigError, match="PipelineConfig.instance_shuffle_buffer = 1, but the checkpoints in"
    ):
        tiny.run(tmp_path, synthetic_shards, steps=10, pipeline_config=unshuffled)
    shutil.rmtree(tmp_path / launches.LAUNCHES_DIR)
    with pytest.raises(checkpointing.IteratorMismatchError, match="holds the data position of another input"):
        tiny.run(tmp_path, synthetic_shards, steps=10, pipeline_config=unshuffled)
    assert os.listdir(tmp_path / "checkpoints") == ["5"]
    assert not os.path.exists(tmp_path / checkpointing.BAD_CHECKPOINTS)
    with caplog.at_level(logging.INFO):
        summary = tiny.run(
            tmp_path, synthetic_shards, steps=10, pipeline_config=unshuffled, reset_data_iterator=True
        )
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


# A save that the disk cannot hold: step 1 is written, then a file-size limit (RLIMIT_FSIZE,
# as tests/fault_injection.py's disk-full scenario sets) makes orbax's background writes of
# step 2 fail, as a full disk does; the tool is a CLI entry like every other.
_FULL_DISK_SAVE = """
import resource, signal, sys
import jax
import tensorflow as tf
from core import checkpointing, cli

def run(args):
    cli.setup_logging()
    state = {f"w{i}": jax.random.normal(jax.random.key(i), (64, 256)) for i in range(12)}
    iterator = iter(tf.data.Dataset.range(10))
    ckpt = checkpointing.Checkpointer(args.workdir)
    ckpt.save(1, state, iterator)
    ckpt.wait()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, 16 * 1024))
    ckpt.save(2, state, iterator)  # 64 KiB arrays: their writes fail in orbax's threads
    ckpt.close()

def build_parser():
    parser = cli.parser("", "full_disk_save")
    parser.add_argument("workdir")
    return parser

sys.exit(cli.entry(build_parser, run)())
"""


@pytest.mark.slow(15)
def test_full_disk_during_an_async_save_is_one_error_line(tmp_path):
    """orbax's writer threads log the failure with tracebacks, asyncio logs the write tasks
    nobody awaited, tensorstore prints "Event loop is closed" for the pending writes: the
    user sees only the one `error:` line (stderr is a pipe, as in a terminal: a file would
    itself be cut by the size limit)."""
    result = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_SAVE, str(tmp_path)],
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-5000:]
    assert errors[0].startswith("error: saving checkpoint 2 in ")
    assert "the last complete checkpoint is step 1: free space" in errors[0]
    # Nothing else about the failure (orbax may warn, on a busy machine, that waiting for
    # the save of step 1 took long: that stays).
    others = [line for line in result.stderr.splitlines() if not line.startswith("error:")]
    noise = [line for line in others if re.search("error|exception|traceback|event loop", line, re.I)]
    assert not noise, result.stderr[-5000:]
    assert sorted(os.listdir(tmp_path / "checkpoints"))[0] == "1"


def test_reports_of_a_save_are_held_then_released_or_debug(caplog):
    """What the quieting holds is never lost: orbax's error reports during a save go out as
    they came when the save succeeds, to DEBUG when it fails (the caller reports it in one
    line); errors of other code, and orbax's outside a save, pass at once."""
    reports = checkpointing._SaveReports()
    orbax_file = os.path.join(os.path.dirname(ocp.__file__), "checkpoint_manager.py")

    def report(message, pathname=orbax_file, name="absl"):
        record = logging.makeLogRecord(
            dict(name=name, levelno=logging.ERROR, levelname="ERROR", msg=message, pathname=pathname)
        )
        logging.getLogger(name).handle(record)

    def shown():
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]

    caplog.set_level(logging.DEBUG)
    try:
        reports.begin()
        reports.end(failed=False)  # installed, no save in flight
        report("orbax outside a save")
        report("another library", pathname=__file__)
        assert shown() == ["orbax outside a save", "another library"]
        reports.begin()
        report("held, then released")
        report("another library during a save", pathname=__file__)
        assert shown()[2:] == ["another library during a save"]
        reports.end(failed=False)
        assert shown()[3:] == ["held, then released"]
        reports.begin()
        report("held, then debug")
        reports.end(failed=True)
        report("after the failure")  # the failed save's stragglers
        assert len(shown()) == 4
        debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
        assert debug[-2:] == [
            "orbax, of the failed save: held, then debug",
            "orbax, of the failed save: after the failure",
        ]
        loop = asyncio.new_event_loop()
        loop.close()
        try:
            loop.call_soon_threadsafe(print)
        except RuntimeError as e:
            closed = types.SimpleNamespace(exc_type=RuntimeError, exc_value=e, exc_traceback=e.__traceback__)
        assert checkpointing._on_a_closed_loop(closed)
        other = RuntimeError("elsewhere")
        assert not checkpointing._on_a_closed_loop(
            types.SimpleNamespace(exc_type=RuntimeError, exc_value=other, exc_traceback=None)
        )
    finally:
        for name in ("absl", "asyncio"):
            logging.getLogger(name).removeFilter(reports)
        sys.unraisablehook = reports._previous_hook


def test_tensorstores_errors_are_recognised_without_a_traceback():
    """asyncio's "Future exception was never retrieved" for a write of a failed save carries
    tensorstore's error with no frame of orbax's: recognised by its message (seen once in a
    full-disk run, after the one error line)."""
    write = ValueError(
        'OUT_OF_RANGE: Error writing "w7/0.0" in OCDBT database at local file "/ckpt/2/state/": '
        "Failed writing: ... File too large [os_error_code='27']"
    )
    assert checkpointing._from_tensorstore(write)
    assert not checkpointing._from_tensorstore(ValueError("OUT_OF_RANGE: something else"))
    record = logging.makeLogRecord(
        dict(
            name="asyncio",
            levelno=logging.ERROR,
            msg="Future exception was never retrieved",
            exc_info=(ValueError, write, None),
        )
    )
    assert checkpointing._from_orbax(record)


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


@pytest.mark.slow
def test_a_failed_save_silences_only_its_own_unawaited_writes(monkeypatch):
    """After a failed save, Python's "coroutine ... was never awaited" about orbax's pending
    writes (seen at exit on a loaded machine, after the one error line) stays quiet; the
    same warning about any other coroutine still shows."""
    # This test's own _SaveReports installs its hook: put back the one before it, or the
    # module's instance would chain to this one, and this one back to it, at its next save.
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)

    async def async_serialize_from_host():
        async def write_fragment():
            pass

        return write_fragment()

    async def other():
        pass

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reports = checkpointing._SaveReports()
        reports.begin()
        reports.end(failed=True)
        pending = asyncio.run(async_serialize_from_host())
        unrelated = other()
        del pending, unrelated  # never started: freed, and so reported, at once
    assert [str(w.message) for w in caught] == [f"coroutine '{other.__qualname__}' was never awaited"]


# Checkpointing and the workdir's files with TensorFlow's import blocked (tests/no_tensorflow.py):
# a train state without a data iterator saved, restored and its config read back.
_CHECKPOINT_WITHOUT_TENSORFLOW = """
import sys
import jax, jax.numpy as jnp, numpy as np
from tests import no_tensorflow
from core import checkpointing, workdir
from models.encoder import EncoderConfig

directory = sys.argv[1]
state = {"w": jnp.arange(6.0), "step": jnp.int32(3)}
ckpt = checkpointing.Checkpointer(directory)
ckpt.save(3, state, None)
ckpt.close()
abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
restored, step = checkpointing.Checkpointer(directory).restore_latest(abstract, lambda step: None)
assert step == 3 and np.array_equal(restored["w"], state["w"]), (step, restored)
workdir.write_config(directory, EncoderConfig(num_layers=1))
assert workdir.read_config(directory, EncoderConfig).num_layers == 1
assert workdir.finished_steps(directory) == [3]
no_tensorflow.assert_none_loaded()
"""


@pytest.mark.slow
def test_checkpointing_needs_no_tensorflow(tmp_path):
    """TensorFlow is the input pipeline's: a state without a data iterator is saved and restored,
    and the workdir's files written and read, with TensorFlow's import blocked."""
    result = subprocess.run(
        [sys.executable, "-c", _CHECKPOINT_WITHOUT_TENSORFLOW, str(tmp_path)],
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
