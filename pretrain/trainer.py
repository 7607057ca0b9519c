"""The pretraining loop: prepare, restore or init, train, finish; for any objective.

`run(workdir, settings)` is the entry point (pretrain/train.py, tests); the settings are one
`RunSettings`, which gin configures as `run` (`run.steps = 100`). It builds what the run
needs (`Trainer.__init__`), restores the latest checkpoint or starts fresh
(`restore_or_init`), trains (`train`: the host does only NumPy/tf.data work per step, hands
each batch to the jitted step with the state donated and the metrics left on device, and
fetches metrics every `log_every` steps) and writes the summary (`finish`). What is
trained and how a batch becomes a loss is the objective's business
(pretrain/objectives/); nothing here depends on which one runs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import numbers
import os
import time
from collections.abc import Callable
from typing import Any

import gin
import jax
import numpy as np
import tensorflow as tf

from core import checkpointing, prng, sharding
from core import lease as workdir_lease
from core import workdir as workdir_lib
from core.checkpointing import Checkpointer
from core.errors import ConfigError
from core.metrics_log import MetricsWriter
from core.optim import adamw
from core.preemption import StopWatcher
from core.state import TrainState, params_sha256
from core.throughput import Throughput, format_duration
from data import pipeline, shards
from interop import bundle, warm_start
from models.encoder import EncoderConfig
from pretrain import launches
from pretrain import step as step_lib
from pretrain.monitor import StepMonitor
from pretrain.objectives import make_objective
from pretrain.phases import Phases

log = logging.getLogger(__name__)


@gin.configurable("run")
@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The settings of a pretraining run, checked; gin configures them as `run`, the name the
    gin files bind (`run.steps = 100`, `run.model_config = @EncoderConfig()`).

    Attributes:
      data_dir: output of `data.preprocess` (manifest.json + shards). Required.
      model_config, pipeline_config: the encoder and the instance/masking recipe. Required.
        The objective trained is the recipe's `make_objective` (pretrain/objectives/), by
        default MaskedLM: MLM, plus NSP/SOP when the pipeline makes sentence labels.
      steps: total optimizer steps (the schedule decays to 0 there). Required.
      batch_size: global batch (rows over all hosts).
      microbatches: gradient accumulation: the step runs k slices of the global batch
        in a scan and applies one update (RoBERTa's 8k / ALBERT's 4096 on few devices).
      optimizer_fn: `f(total_steps) -> (optax transformation, schedule)`, e.g. core.optim.adamw.
      seed: parameter init and dropout seed (the data seed is in pipeline_config).
      log_every, eval_every, checkpoint_every: cadences in steps (and always at the end).
      eval_batches: held-out batches (of batch_size rows) per evaluation.
      eval_at_start: also evaluate the initial parameters (the demo reports start vs end).
      max_checkpoints: checkpoints kept (older ones are deleted).
      checkpoint_carry: checkpoints hold the state the objective carries from step to step
        (XLNet's memories; nothing for the other objectives), so that a resume continues
        exactly. False leaves it out (at XLNet-large's recipe it is ~36x the parameters and
        Adam state: docs/architecture.md) and a resumed run restarts it from its initial
        value, as the original XLNet does after every restart.
      max_skipped_steps: 0 stops the run at the first step with a non-finite loss or
        gradient norm; k > 0 skips up to k such updates (each logged) before stopping.
      dropout_prng: the PRNG of the dropout masks, one of core.prng.DROPOUT_PRNGS:
        "threefry" (JAX's default; the fastest on CPUs) or "rbg" (t5x's and MaxText's
        choice on TPUs). Changing it changes the masks: a resume that does (which the launch
        history records) no longer ends on the uninterrupted run's parameters.
      reset_data_iterator: when the latest checkpoint's data position was saved by another
        input pipeline (a changed PipelineConfig or pipeline code), restore the model and
        optimizer state and restart the data stream instead of stopping with an error.
        The data order then differs from an uninterrupted run's.
      phase2_start, phase2_pipeline_config: BERT's two phases in one run (pretrain/phases.py).
      init_from: a workdir (ours, or `interop.convert import`'s) whose parameters start the
        run: continued pretraining. Used only when the run's workdir has no checkpoint yet;
        the optimizer state and step start fresh; heads the source lacks start from init.

    The mesh is not a setting of the run (the same run resumes on another mesh): `run`
    takes it as `mesh_spec`.
    """

    data_dir: str | None = None
    model_config: EncoderConfig | None = None
    pipeline_config: pipeline.PipelineConfig | None = None
    steps: int | None = None
    batch_size: int = 256
    microbatches: int = 1
    optimizer_fn: Callable = adamw
    seed: int = 0
    log_every: int = 100
    eval_every: int = 1000
    eval_batches: int = 20
    eval_at_start: bool = False
    checkpoint_every: int = 1000
    max_checkpoints: int = 3
    checkpoint_carry: bool = True
    max_skipped_steps: int = 0
    dropout_prng: str = "threefry"
    reset_data_iterator: bool = False
    phase2_start: int | None = None
    phase2_pipeline_config: pipeline.PipelineConfig | None = None
    init_from: str | None = None

    def __post_init__(self):
        for name in ("data_dir", "model_config", "pipeline_config", "steps"):
            if getattr(self, name) is None:
                raise ConfigError(f"run.{name} is not set: bind it in the gin file or with --gin_bindings")
        for name in _INT_SETTINGS:
            value = getattr(self, name)
            if not (value is None and name == "phase2_start") and not _is_int(value):
                raise ConfigError(f"run.{name} must be an integer, got {value!r}")
        for name in ("eval_at_start", "checkpoint_carry", "reset_data_iterator"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ConfigError(f"run.{name} must be True or False, got {getattr(self, name)!r}")
        for name in ("steps", "batch_size", "log_every", "eval_every", "checkpoint_every", "max_checkpoints"):
            if getattr(self, name) < 1:
                raise ConfigError(f"run.{name} must be >= 1, got {getattr(self, name)}")
        prng.check_dropout_prng(self.dropout_prng)


# Checked in RunSettings: gin passes whatever a binding says, and `run.steps = 'ten'` would
# otherwise fail deep in the run with a TypeError.
_INT_SETTINGS = (
    "steps",
    "batch_size",
    "microbatches",
    "seed",
    "log_every",
    "eval_every",
    "eval_batches",
    "checkpoint_every",
    "max_checkpoints",
    "max_skipped_steps",
    "phase2_start",
)


def _is_int(value: Any) -> bool:
    """An int or a NumPy integer, and not a bool (which Python counts as an int)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def run(workdir: str, settings: RunSettings | None = None, *, mesh_spec: str | None = None) -> dict[str, Any]:
    """Pretrains (or resumes) in `workdir`; returns what it writes to `workdir/summary.json`.

    Args:
      workdir: checkpoints, metrics, TensorBoard, operative config and summary go here.
      settings: the run's settings (RunSettings); None = `RunSettings()`, i.e. the gin
        bindings of `run`.
      mesh_spec: e.g. 'data:4,fsdp:2,tensor:1'; None puts every device on `data`.

    A SIGTERM/SIGINT (preemption) stops after the current step with a checkpoint; the
    returned dict then has `stopped_by` and no summary.json is written.
    """
    trainer = Trainer(workdir, settings if settings is not None else RunSettings(), mesh_spec=mesh_spec)
    try:
        state, iterator, resumed_from = trainer.restore_or_init()
        return trainer.finish(trainer.train(state, iterator), resumed_from)
    finally:
        trainer.lease.release()


@dataclasses.dataclass
class Outcome:
    """What the loop ends with (see Trainer.train)."""

    state: TrainState
    step: int
    stopped_by: str | None
    last_train: dict[str, float]
    eval_values: dict[str, float] | None
    initial_eval: dict[str, float] | None
    throughput: Throughput
    skipped_steps: int


class Trainer:
    """One call of `run`: everything built once, then the phases of the run."""

    def __init__(self, workdir: str, settings: RunSettings, *, mesh_spec: str | None = None):
        """Prepare: check the data, mesh and batch, take the workdir's lease, then check the
        workdir and disk and the launch's settings against the workdir's history, and build the
        objective, the sharded steps and the checkpointer (`_prepare`). Nothing is trained and
        no state is allocated yet; the caller releases `self.lease`."""
        s = self.settings = settings
        self.workdir = workdir
        self.start_time = time.time()
        self.manifest = shards.load_manifest(s.data_dir)
        _check_vocab(s.model_config, self.manifest)
        self.partitioner = sharding.Partitioner.create(mesh_spec)
        self.local_batch = sharding.check_batch_size(
            s.batch_size, self.partitioner.mesh, jax.process_count(), s.microbatches
        )
        if s.init_from is not None and not workdir_lib.finished_steps(workdir):
            warm_start.check_source(s.init_from, self.manifest)  # before anything is written
        # The workdir's lease (core/lease.py) before anything is written: a second launch on a
        # live run's workdir stops here, writing nothing.
        self.lease = workdir_lease.acquire(workdir, "pretraining")
        try:
            self._prepare()
        except BaseException:
            self.lease.release()
            raise

    def _prepare(self) -> None:
        """Builds the objective, the sharded steps and the checkpointer, after the launch's
        settings are checked against the workdir's history."""
        s, workdir = self.settings, self.workdir
        checkpointing.check_writable(workdir)
        self.phases = Phases(
            s.pipeline_config, s.phase2_start, s.phase2_pipeline_config, s.steps, s.model_config
        )
        # The dataset built to check the batch keys, kept for the phase's first iterator. Every
        # other iterator gets a dataset of its own: a second iterator of the same tf.data
        # Dataset is shuffled differently (reshuffle_each_iteration), and the stream must be a
        # function of the config alone for resume to be exact.
        self._unused_datasets: dict[int, tf.data.Dataset] = {}
        self.objective = make_objective(s.model_config, s.pipeline_config)
        self.batch_keys = self._check_batch_keys()
        optimizer, schedule = s.optimizer_fn(total_steps=s.steps)
        self.changes, self.restart_stream = self._check_launch()
        self.steps = step_lib.build(
            objective=self.objective,
            optimizer=optimizer,
            schedule=schedule,
            partitioner=self.partitioner,
            batch_size=s.batch_size,
            microbatches=s.microbatches,
            skip_nonfinite=s.max_skipped_steps > 0,
            dropout_prng=s.dropout_prng,
        )
        saved = self.steps.states.abstract
        if not s.checkpoint_carry:
            saved = saved.replace(carry=None)
        checkpointing.check_free_space(workdir, checkpointing.state_bytes(saved), s.max_checkpoints)
        self.ckpt = Checkpointer(workdir, max_to_keep=s.max_checkpoints, save_carry=s.checkpoint_carry)
        self.writer = MetricsWriter(workdir)

    def _check_launch(self) -> tuple[list[launches.Change], bool]:
        """This launch's settings against the workdir's last launch, when it resumes
        (pretrain/launches.py): returns the changes carried out and whether the data stream
        restarts; raises ConfigError for a change a resume may not make."""
        self.view = launches.settings_view(self.settings, self.objective)
        steps = workdir_lib.finished_steps(self.workdir)
        if not steps:
            return [], False
        before = launches.previous(self.workdir, steps[-1])
        if before is None:
            log.info(
                "%s has no launch history (an older version's workdir): it starts with this launch",
                self.workdir,
            )
            return [], False
        changed = launches.changes(before, self.view, self.manifest.fields.get("fingerprint"))
        return changed, launches.check(changed, self.workdir, before, self.settings.reset_data_iterator)

    def _check_batch_keys(self) -> tuple[str, ...]:
        """The keys the objective reads (the same in every phase); each must be in every
        phase's batches. The loop sends only these to the devices."""
        wanted = tuple(self.objective.batch_spec(1, 8, 1))
        for index, config in enumerate(self.phases.configs):
            self._unused_datasets[index] = self.train_dataset(index)
            made = set(self._unused_datasets[index].element_spec)
            missing = sorted(set(wanted) - made)
            if missing:
                raise ConfigError(
                    f"the objective {type(self.objective).__name__} reads {missing}, which the pipeline "
                    f"(PipelineConfig format {config.format!r}, sentence_objective "
                    f"{config.sentence_objective!r}) does not make: change the recipe's PipelineConfig"
                )
        return wanted

    def train_dataset(self, phase: int) -> tf.data.Dataset:
        """A new training dataset of a phase (this host's rows of each global batch)."""
        return pipeline.make_dataset(
            self.settings.data_dir,
            "train",
            self.phases.configs[phase],
            self.local_batch,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
        )

    def train_iterator(self, step: int) -> tf.data.Iterator:
        """A fresh iterator of the phase that the step after `step` belongs to."""
        phase = self.phases.index(step)
        dataset = self._unused_datasets.pop(phase, None)
        return iter(dataset if dataset is not None else self.train_dataset(phase))

    def restore_or_init(self) -> tuple[TrainState, tf.data.Iterator, int | None]:
        """The latest readable checkpoint and its data position, or a fresh state (from
        `init_from`'s parameters when set) and a fresh data stream. Returns (state,
        iterator, the step restored or None)."""
        restored = self._restore_or_init()
        # Written only once the state is in hand: a refused restore (a checkpoint of another
        # model or input pipeline) or a failed warm start leaves the workdir's description of
        # its checkpoints as it was.
        self._write_run_info(resumed_from=restored[2])
        return restored

    def _restore_or_init(self) -> tuple[TrainState, tf.data.Iterator, int | None]:
        s = self.settings
        iterators: dict[int, tf.data.Iterator] = {}

        def iterator_for(step: int) -> tf.data.Iterator:
            # Checkpoint `step` holds the position of the stream that fed step `step` (the
            # loop switches to phase 2's fresh stream itself when it gets there).
            iterators[step] = self.train_iterator(step - 1)
            return iterators[step]

        state, resumed_from = self.ckpt.restore_latest(
            self.steps.states.abstract,
            iterator_for,
            reset_iterator=s.reset_data_iterator,
            restart_stream=self.restart_stream,
        )
        if resumed_from is not None:
            log.info(
                "resumed from step %d in %s (phase %d)",
                resumed_from,
                self.workdir,
                self.phases.index(resumed_from) + 1,
            )
            if state.carry is None:  # not saved, or its rows' stream restarts: from its start
                state = state.replace(carry=self.steps.states.initial_carry())
            return state, iterators[resumed_from], resumed_from
        state = self.steps.states(jax.random.key(s.seed))
        if s.init_from is not None:
            params = warm_start.warm_start_params(
                s.init_from, state.params, self.steps.states.shardings.params, self.manifest
            )
            state = state.replace(params=params)
            log.info("starting from the parameters of %s", s.init_from)
        # A stream no failed restore has touched.
        return state, self.train_iterator(0), None

    def _write_run_info(self, resumed_from: int | None) -> None:
        """This launch's record in the launch history (pretrain/launches.py), config.gin (also
        as TensorBoard text), and the model config and tokenizer that readers of the workdir
        load."""
        s = self.settings
        config = gin.config_str()
        self.writer.text("config", config)
        if jax.process_index() == 0:
            record = launches.append(
                self.workdir,
                launch_id=self.lease.launch_id,
                resumed_from=resumed_from,
                data_fingerprint=self.manifest.fields.get("fingerprint"),
                changed=self.changes,
                view=self.view,
            )
            log.info("launch recorded in %s", record)
            with tf.io.gfile.GFile(os.path.join(self.workdir, "config.gin"), "w") as f:
                f.write(config)
            bundle.write_model_info(self.workdir, s.model_config, s.data_dir)

    def evaluate(self, params: Any, step: int) -> dict[str, float]:
        """Mean metrics over the first `eval_batches` held-out batches (always the same rows),
        written to metrics.jsonl and the log.

        Each evaluation batch has the rows of one training batch, fed in microbatch-sized
        pieces, so that evaluation never needs more activation memory than a training step.
        """
        s = self.settings
        # A new dataset each time, for the same reason as train_iterator's: the same rows.
        ds = pipeline.make_dataset(
            s.data_dir,
            "eval",
            self.phases.config(step),
            s.batch_size // s.microbatches // jax.process_count(),
            process_index=jax.process_index(),
            process_count=jax.process_count(),
            shuffle=False,
        )
        totals = None
        carry = self.steps.eval_carry()  # evaluation's stream, from its start every time
        with self.partitioner:
            for index, batch in enumerate(ds.take(s.eval_batches * s.microbatches).as_numpy_iterator()):
                inputs = self.partitioner.global_batch({k: batch[k] for k in self.batch_keys})
                sums, carry = self.steps.eval_step(params, inputs, index, carry)
                sums = jax.device_get(sums)
                totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
        values = {k: float(v) for k, v in self.objective.summarize(totals).items()}
        self.writer.write(step, "eval", values)
        log.info("eval step %d: %s", step, "  ".join(f"{k} {v:.4f}" for k, v in values.items()))
        return values

    def _evals_left(self, step: int) -> int:
        s = self.settings
        return (s.steps // s.eval_every - step // s.eval_every) + (s.steps % s.eval_every != 0)

    def train(self, state: TrainState, iterator: tf.data.Iterator) -> Outcome:
        """The loop: one jitted step per batch; metrics fetched (a sync) at log and
        checkpoint steps; evaluation and checkpoints at their cadences; a preemption
        signal stops after the current step with a checkpoint."""
        s = self.settings
        rng = jax.random.key(s.seed + 1)
        step = int(state.step)
        initial_eval = self.evaluate(state.params, step) if s.eval_at_start and step == 0 else None
        monitor = StepMonitor(self.objective, s.max_skipped_steps, self.ckpt, self.workdir)
        rates = Throughput(s.steps)
        last_train: dict[str, float] = {}
        eval_values = None
        stopping = False
        rates.start()
        with StopWatcher() as watcher, self.partitioner:
            while step < s.steps and not stopping:
                if step == s.phase2_start:
                    iterator = self.train_iterator(step)
                    # The carry belongs to phase 1's stream, whose rows end here.
                    state = state.replace(carry=self.steps.states.initial_carry())
                    log.info("step %d: phase 2, %s", step, self.phases.describe(step))
                local = {k: v.numpy() for k, v in next(iterator).items() if k in self.batch_keys}
                config = self.phases.config(step)
                rates.add(
                    int(local["input_mask"].sum()) * jax.process_count(),
                    self.objective.flops_per_row(config.max_seq_length, config.max_predictions_per_seq)
                    * s.batch_size,
                )
                state, metrics = self.steps.train_step(state, self.partitioner.global_batch(local), rng)
                monitor.add(metrics)
                step += 1
                stopping = watcher.should_stop(step)
                if not rates.started:  # the first step of this call compiles: keep it out of the rates
                    jax.block_until_ready(metrics)
                    log.info("step %d done (compilation included) in %.1f s", step, rates.begin())
                if step % s.log_every == 0 or step == s.steps:
                    self.lease.check()  # another launch owns the workdir now: write nothing more
                    last_train = monitor.summary(step)  # the fetch: step `step` is complete
                    last_train.update(rates.close(step, self._evals_left(step)))
                    self.writer.write(step, "train", last_train)
                    self._log_train(step, last_train)
                if (step % s.eval_every == 0 or step == s.steps) and not stopping:
                    monitor.check(step)  # complete the steps before the clock pauses
                    with rates.paused():
                        eval_values = self.evaluate(state.params, step)
                if step % s.checkpoint_every == 0 or step == s.steps or stopping:
                    monitor.check(step)  # never write a non-finite state
                    self.lease.check()
                    self.ckpt.save(step, state, iterator)
        self.ckpt.close()
        return Outcome(
            state=state,
            step=step,
            stopped_by=watcher.signal_name if stopping else None,
            last_train=last_train,
            eval_values=eval_values,
            initial_eval=initial_eval,
            throughput=rates,
            skipped_steps=monitor.skipped,
        )

    def _log_train(self, step: int, values: dict[str, float]) -> None:
        if "loss" not in values:
            log.info("step %d/%d: every step since the last log was skipped", step, self.settings.steps)
            return
        shown = "  ".join(
            f"{label} {values[key]:.4f}"
            for key, label in self.objective.log_labels().items()
            if key in values
        )
        rates = ""
        if "steps_per_second" in values:
            rates = (
                f"  {values['steps_per_second']:.2f} steps/s  {values['tokens_per_second']:.0f} tokens/s  "
                f"{values['model_tflops_per_second']:.3f} TFLOP/s  "
                f"eta {format_duration(values['eta_seconds'])}"
            )
        log.info(
            "step %d/%d  loss %.4f  %s  lr %.3g  grad_norm %.3f%s",
            step,
            self.settings.steps,
            values["loss"],
            shown,
            values["learning_rate"],
            values["grad_norm"],
            rates,
        )

    def finish(self, outcome: Outcome, resumed_from: int | None) -> dict[str, Any]:
        """Writes operative_config.gin and summary.json (not after a preemption stop)."""
        s = self.settings
        if outcome.stopped_by:
            log.warning(
                "%s: stopped at step %d of %d, checkpoint in %s/checkpoints; run the same command to resume",
                outcome.stopped_by,
                outcome.step,
                s.steps,
                self.workdir,
            )
            self.writer.close()
            return {"step": outcome.step, "stopped_by": outcome.stopped_by, "resumed_from": resumed_from}
        self.lease.check()
        with tf.io.gfile.GFile(os.path.join(self.workdir, "operative_config.gin"), "w") as f:
            f.write(gin.operative_config_str())
        eval_values = outcome.eval_values
        if eval_values is None:  # nothing left to train: evaluate what was restored
            eval_values = self.evaluate(outcome.state.params, outcome.step)
        summary_path = os.path.join(self.workdir, "summary.json")
        previous = {}  # the record of the call that trained, when this one trained nothing
        if not outcome.throughput.started and jax.process_index() == 0 and tf.io.gfile.exists(summary_path):
            # Process 0 alone reads it, as it alone writes it (others could read it half-written).
            with tf.io.gfile.GFile(summary_path) as f:
                previous = json.load(f)
        # This call's rates and times, or those of the call that trained (None without its record).
        source = previous
        if outcome.throughput.started:
            source = {**outcome.throughput.totals(), "wall_seconds": time.time() - self.start_time}
        measured = {k: source.get(k) for k in ("tokens_per_second", "train_seconds", "wall_seconds")}
        summary = {
            **previous,  # what other tools added to the record (the demo's report) stays
            "step": outcome.step,
            "objective": type(self.objective).__name__,
            "headline_metric": self.objective.headline_metric,
            **eval_values,
            "eval": eval_values,
            "initial_eval": outcome.initial_eval or previous.get("initial_eval"),
            "train": outcome.last_train or previous.get("train") or {},
            **measured,  # of the call that trained
            "resumed_from": resumed_from,
            "skipped_steps": outcome.skipped_steps,
            "params_sha256": params_sha256(outcome.state.params),
        }
        if jax.process_index() == 0:
            with tf.io.gfile.GFile(summary_path, "w") as f:
                json.dump(summary, f, indent=2)
        self.writer.close()
        return summary


def _check_vocab(model_config: EncoderConfig, manifest: shards.Manifest) -> None:
    if model_config.vocab_size != manifest.vocab_size:
        raise ConfigError(
            f"model vocab_size={model_config.vocab_size} but the shards in {manifest.directory} were "
            f"tokenized with a vocabulary of {manifest.vocab_size} ({manifest.tokenizer.get('kind', '?')}): "
            f"bind EncoderConfig.vocab_size = {manifest.vocab_size} "
            "or re-run data.preprocess with the right tokenizer"
        )
