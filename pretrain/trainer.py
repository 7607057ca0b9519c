"""The pretraining loop: sharded state, one pure jitted step, eval, logging, checkpoints.

`run(...)` is the gin-configured entry point (called by pretrain/train.py and by tests).
The host loop does only NumPy/tf.data work per step: it pulls a batch, hands it to the
jitted `train_step` (donated state, metrics left on device), and fetches metrics only
every `log_every` steps.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import time
from typing import Any, Callable, Mapping

import flax.linen as nn
import flax.struct
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tensorflow as tf
from flax import traverse_util

from data import pipeline, shards
from models import axes
from models.encoder import EncoderConfig
from models.pretraining import PretrainingModel, flops_per_sequence
from pretrain import checkpointing, losses, optim, preemption, sharding
from pretrain import workdir as workdir_lib

log = logging.getLogger("pretrain")


class TrainError(ValueError):
    """A user-facing configuration problem found before training starts (one line)."""


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # [] int32
    params: Any  # float32 (param_dtype) parameter tree
    opt_state: Any


def params_sha256(params: Any) -> str:
    """Hash of all parameters in a canonical order (sorted paths; path, dtype, shape, bytes)."""
    digest = hashlib.sha256()
    flat = traverse_util.flatten_dict(jax.device_get(params), sep="/")
    for path in sorted(flat):
        value = np.ascontiguousarray(flat[path])
        digest.update(f"{path}:{value.dtype}:{value.shape}".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def _loss_grads_sums(params, batch, dropout_rng, denominators, model):
    def loss_fn(params):
        outputs = model.apply({"params": params}, batch, deterministic=False, rngs={"dropout": dropout_rng})
        return losses.pretraining_loss(outputs, batch, denominators)

    (loss, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return loss, grads, sums


def split_microbatches(batch: Mapping[str, jax.Array], k: int) -> dict[str, jax.Array]:
    """[B, ...] -> [k, B/k, ...]; microbatch j holds rows j, j+k, ... so that every
    device's rows contribute to every microbatch (no resharding between them)."""

    def split(x):
        x = x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)
        return nn.with_logical_constraint(x, (None, axes.BATCH) + (None,) * (x.ndim - 2))

    return {key: split(x) for key, x in batch.items()}


def train_step(
    state: TrainState,
    batch: Mapping[str, jax.Array],
    rng: jax.Array,
    *,
    model: nn.Module,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    microbatches: int = 1,
    skip_nonfinite: bool = False,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step on the global batch, optionally accumulated over microbatches.

    Dropout randomness is fold_in(rng, step) (and the microbatch index): resumable and
    independent of the loop. With k microbatches the gradients of k slices, each
    normalised by the whole batch's counts, are summed in a `lax.scan`: the optimizer
    sees the same gradient as one step on the full batch, with 1/k of the activations.

    metrics["finite"] is 1 when loss and gradient norm are finite. With skip_nonfinite a
    step where they are not leaves parameters and optimizer state unchanged (the step
    counter still advances, so data and schedule move on); the host counts the skips.
    """
    dropout_rng = jax.random.fold_in(rng, state.step)
    denominators = losses.normalizers(batch)
    if microbatches == 1:
        loss, grads, sums = _loss_grads_sums(state.params, batch, dropout_rng, denominators, model)
    else:
        micro = split_microbatches(batch, microbatches)

        def accumulate(total, xs):
            index, microbatch = xs
            out = _loss_grads_sums(
                state.params, microbatch, jax.random.fold_in(dropout_rng, index), denominators, model
            )
            return jax.tree.map(jnp.add, total, out), None

        first = jax.tree.map(lambda x: x[0], micro)
        shapes = jax.eval_shape(
            functools.partial(_loss_grads_sums, model=model), state.params, first, dropout_rng, denominators
        )
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        (loss, grads, sums), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(microbatches), micro))
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    if skip_nonfinite:
        keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
        params = jax.tree.map(keep, params, state.params)
        opt_state = jax.tree.map(keep, opt_state, state.opt_state)
    metrics = dict(
        sums,
        loss=loss,
        grad_norm=grad_norm,
        learning_rate=schedule(state.step),
        finite=finite.astype(jnp.int32),
    )
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params: Any, batch: Mapping[str, jax.Array], *, model: nn.Module) -> dict[str, jax.Array]:
    """Metric sums of one held-out batch (no dropout)."""
    outputs = model.apply({"params": params}, batch, deterministic=True)
    return losses.pretraining_loss(outputs, batch)[1]


@dataclasses.dataclass
class Setup:
    """Everything built once before the loop (kept together instead of a long tuple)."""

    mesh: jax.sharding.Mesh
    rules: tuple
    model: PretrainingModel
    state: TrainState
    state_shardings: Any
    train_step: Callable
    eval_step: Callable


def shaped_like(tree: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs with the shapes/dtypes of `tree` and the given shardings."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def build(
    model_config: EncoderConfig,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    example_batch: Mapping[str, np.ndarray],
    mesh: jax.sharding.Mesh,
    rules: tuple,
    seed: int,
    sentence_objective: bool,
    microbatches: int = 1,
    materialize: bool = True,
    skip_nonfinite: bool = False,
    donate: bool = True,
) -> Setup:
    """Creates the sharded train state (eval_shape -> specs -> jit(init)) and the jitted steps.

    With materialize=False the state is only its shapes and shardings (ShapeDtypeStructs):
    enough to lower and compile the step, e.g. to read its memory use, allocating nothing.
    The step donates the incoming state (updated in place); donate=False exists only so
    that bench/pretrain.py can measure what that buys.
    """
    model = PretrainingModel(model_config, sentence_objective=sentence_objective)

    def init_boxed(rng):
        params = model.init(rng, example_batch, deterministic=True)["params"]
        return TrainState(step=jnp.zeros([], jnp.int32), params=params, opt_state=optimizer.init(params))

    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        abstract = jax.eval_shape(init_boxed, jax.random.key(seed))
        state_shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, rules)
        if materialize:
            state = jax.jit(lambda rng: nn.meta.unbox(init_boxed(rng)), out_shardings=state_shardings)(
                jax.random.key(seed)
            )
    if not materialize:  # outside the mesh: unboxing there would apply sharding constraints
        state = shaped_like(nn.meta.unbox(abstract), state_shardings)
    data = sharding.batch_sharding(mesh)
    step = jax.jit(
        functools.partial(
            train_step,
            model=model,
            optimizer=optimizer,
            schedule=schedule,
            microbatches=microbatches,
            skip_nonfinite=skip_nonfinite,
        ),
        in_shardings=(state_shardings, data, None),
        out_shardings=(state_shardings, None),
        donate_argnums=0 if donate else (),
    )
    evaluate = jax.jit(
        functools.partial(eval_step, model=model),
        in_shardings=(state_shardings.params, data),
        out_shardings=None,
    )
    return Setup(mesh, rules, model, state, state_shardings, step, evaluate)


def evaluate(
    setup: Setup,
    params: Any,
    data_dir: str,
    config: pipeline.PipelineConfig,
    batch_size: int,
    num_batches: int,
) -> dict[str, float]:
    """Mean metrics over the first `num_batches` batches of the held-out split (always the same).

    batch_size: global rows per eval batch; the caller passes the training microbatch
    size so that evaluation never needs more activation memory than a training step.
    """
    ds = pipeline.make_dataset(
        data_dir,
        "eval",
        config,
        batch_size // jax.process_count(),
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        shuffle=False,
    )
    totals = None
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
        for batch in ds.take(num_batches).as_numpy_iterator():
            sums = jax.device_get(setup.eval_step(params, sharding.global_batch(batch, setup.mesh)))
            totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
    return {k: float(v) for k, v in losses.summarize(totals).items()}


class MetricsWriter:
    """metrics.jsonl + TensorBoard, on process 0 only."""

    def __init__(self, workdir: str):
        self.enabled = jax.process_index() == 0
        if self.enabled:
            self._jsonl = tf.io.gfile.GFile(os.path.join(workdir, "metrics.jsonl"), "a")
            self._tb = tf.summary.create_file_writer(os.path.join(workdir, "tensorboard"))

    def write(self, step: int, split: str, values: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        self._jsonl.write(json.dumps({"step": step, "split": split, **values}) + "\n")
        self._jsonl.flush()
        with self._tb.as_default(step=step):
            for k, v in values.items():
                tf.summary.scalar(f"{split}/{k}", v)
        self._tb.flush()

    def text(self, name: str, value: str) -> None:
        if self.enabled:
            with self._tb.as_default(step=0):
                tf.summary.text(name, value)

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            self._tb.close()


def check_vocab(model_config: EncoderConfig, manifest: Mapping[str, Any], data_dir: str) -> None:
    if model_config.vocab_size != manifest["vocab_size"]:
        raise TrainError(
            f"model vocab_size={model_config.vocab_size} but the shards in {data_dir} were tokenized with a "
            f"vocabulary of {manifest['vocab_size']} ({manifest['tokenizer'].get('kind', '?')}): bind "
            f"EncoderConfig.vocab_size = {manifest['vocab_size']} "
            "or re-run data.preprocess with the right tokenizer"
        )


@gin.configurable(denylist=["workdir", "mesh_spec"])
def run(
    workdir: str,
    *,
    data_dir: str = gin.REQUIRED,
    model_config: EncoderConfig = gin.REQUIRED,
    pipeline_config: pipeline.PipelineConfig = gin.REQUIRED,
    steps: int = gin.REQUIRED,
    batch_size: int = 256,
    microbatches: int = 1,
    optimizer_fn: Callable = optim.adamw,
    seed: int = 0,
    log_every: int = 100,
    eval_every: int = 1000,
    eval_batches: int = 20,
    eval_at_start: bool = False,
    checkpoint_every: int = 1000,
    max_checkpoints: int = 3,
    max_skipped_steps: int = 0,
    phase2_start: int | None = None,
    phase2_pipeline_config: pipeline.PipelineConfig | None = None,
    init_from: str | None = None,
    mesh_spec: str | None = None,
) -> dict[str, Any]:
    """Pretrains (or resumes) in `workdir`; returns what it writes to `workdir/summary.json`.

    Args:
      workdir: checkpoints, metrics, TensorBoard, operative config and summary go here.
      data_dir: output of `data.preprocess` (manifest.json + shards).
      model_config, pipeline_config: the model and the instance/masking recipe; the 2-way
        sentence head (NSP or SOP) is trained iff pipeline_config.sentence_objective != "none".
      steps: total optimizer steps (the schedule decays to 0 there).
      batch_size: global batch (rows over all hosts).
      microbatches: gradient accumulation: the step runs k slices of the global batch
        in a scan and applies one update (RoBERTa's 8k / ALBERT's 4096 on few devices).
      optimizer_fn: `f(total_steps) -> (optax transformation, schedule)`, e.g. optim.adamw.
      seed: parameter init and dropout seed (the data seed is in pipeline_config).
      log_every, eval_every, checkpoint_every: cadences in steps (and always at the end).
      eval_batches: held-out batches (of batch_size rows) per evaluation.
      eval_at_start: also evaluate the initial parameters (the demo reports start vs end).
      max_skipped_steps: 0 stops the run at the first step with a non-finite loss or
        gradient norm; k > 0 skips up to k such updates (each logged) before stopping.
      phase2_start, phase2_pipeline_config: BERT's two phases in one run: from step
        `phase2_start` on, batches come from `phase2_pipeline_config` (e.g. length 512
        with P = 80 after length 128 with P = 20). Same parameters, optimizer state and
        learning-rate schedule; the data stream of phase 2 starts at its beginning.
      init_from: a workdir (ours, or `models.convert import`'s) whose parameters start the
        run: continued pretraining. Used only when `workdir` has no checkpoint yet; the
        optimizer state and step start fresh; heads the source lacks start from init.
      mesh_spec: e.g. 'data:4,fsdp:2,tensor:1'; None puts every device on `data`.

    A SIGTERM/SIGINT (preemption) stops after the current step with a checkpoint; the
    returned dict then has `stopped_by` and no summary.json is written.
    """
    start_time = time.time()
    manifest = shards.load_manifest(data_dir)
    check_vocab(model_config, manifest, data_dir)
    mesh = sharding.make_mesh(mesh_spec)
    local_batch = sharding.check_batch_size(batch_size, mesh, jax.process_count(), microbatches)
    checkpointing.check_writable(workdir)
    if jax.process_index() == 0:
        with tf.io.gfile.GFile(os.path.join(workdir, "config.gin"), "w") as f:
            f.write(gin.config_str())
        workdir_lib.write_model_info(workdir, model_config, data_dir)

    phases = _Phases(pipeline_config, phase2_start, phase2_pipeline_config, steps, model_config)
    optimizer, schedule = optimizer_fn(total_steps=steps)

    def train_iterator(step: int) -> tf.data.Iterator:
        """A fresh iterator of the phase that the step after `step` belongs to."""
        return iter(
            pipeline.make_dataset(
                data_dir,
                "train",
                phases.config(step),
                local_batch,
                process_index=jax.process_index(),
                process_count=jax.process_count(),
            )
        )

    iterator = train_iterator(0)
    example = {
        k: np.zeros((1, *v.shape[1:]), v.dtype.as_numpy_dtype) for k, v in iterator.element_spec.items()
    }
    rules = sharding.logical_axis_rules()
    setup = build(
        model_config,
        optimizer,
        schedule,
        example,
        mesh,
        rules,
        seed,
        phases.sentence_objective,
        microbatches,
        skip_nonfinite=max_skipped_steps > 0,
    )
    checkpointing.check_free_space(workdir, checkpointing.state_bytes(setup.state), max_checkpoints)

    ckpt = checkpointing.Checkpointer(workdir, max_to_keep=max_checkpoints)
    iterators = {}

    def iterator_for(step: int) -> tf.data.Iterator:
        # Checkpoint `step` holds the position of the stream that fed step `step` (the
        # loop switches to phase 2's fresh stream itself when it gets there).
        iterators[step] = iterator if phases.index(step - 1) == 0 else train_iterator(step - 1)
        return iterators[step]

    state, resumed_from = ckpt.restore_latest(shaped_like(setup.state, setup.state_shardings), iterator_for)
    if resumed_from is None:
        state = setup.state
        if init_from is not None:
            params = workdir_lib.warm_start_params(
                init_from, state.params, setup.state_shardings.params, manifest
            )
            state = state.replace(params=params)
            log.info("starting from the parameters of %s", init_from)
        if iterators:  # every checkpoint was damaged: start from a stream no restore touched
            iterator = train_iterator(0)
    else:
        iterator = iterators[resumed_from]
        log.info(
            "resumed from step %d in %s (phase %d)", resumed_from, workdir, phases.index(resumed_from) + 1
        )
    writer = MetricsWriter(workdir)
    writer.text("config", gin.config_str())

    def run_eval(at_step):
        # The same held-out rows as one full batch per eval batch, in microbatch-sized pieces.
        values = evaluate(
            setup,
            state.params,
            data_dir,
            phases.config(at_step),
            batch_size // microbatches,
            eval_batches * microbatches,
        )
        writer.write(at_step, "eval", values)
        log.info("eval step %d: %s", at_step, "  ".join(f"{k} {v:.4f}" for k, v in values.items()))
        return values

    rng = jax.random.key(seed + 1)
    step = int(state.step)
    initial_eval = run_eval(step) if eval_at_start and step == 0 else None
    monitor = _StepMonitor(max_skipped_steps, ckpt, workdir)
    window_tokens, window_start, window_steps = 0, time.time(), 0
    total_tokens, train_seconds = 0, 0.0
    last_train, eval_values, stopping = {}, None, False

    with preemption.StopWatcher() as watcher, jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        while step < steps and not stopping:
            if step == phase2_start:
                iterator = train_iterator(step)
                log.info("step %d: phase 2, %s", step, phases.describe(step))
            batch = next(iterator)
            local = {k: v.numpy() for k, v in batch.items()}
            window_tokens += int(local["input_mask"].sum()) * jax.process_count()
            state, metrics = setup.train_step(state, sharding.global_batch(local, mesh), rng)
            monitor.add(metrics)
            step += 1
            window_steps += 1
            stopping = watcher.should_stop(step)
            if step % log_every == 0 or step == steps:
                seconds = time.time() - window_start
                last_train = monitor.summary(step)
                last_train.update(
                    steps_per_second=window_steps / seconds,
                    tokens_per_second=window_tokens / seconds,
                    model_tflops_per_second=phases.flops_per_row(step - 1)
                    * batch_size
                    * window_steps
                    / seconds
                    / 1e12,
                )
                writer.write(step, "train", last_train)
                _log_train(step, steps, last_train)
                total_tokens += window_tokens
                train_seconds += seconds
                window_tokens, window_start, window_steps = 0, time.time(), 0
            if (step % eval_every == 0 or step == steps) and not stopping:
                eval_values = run_eval(step)
                window_start = time.time()
            if step % checkpoint_every == 0 or step == steps or stopping:
                monitor.check(step)  # never write a non-finite state
                ckpt.save(step, state, iterator)
    ckpt.close()

    if stopping:
        log.warning(
            "%s: stopped at step %d of %d, checkpoint in %s/checkpoints; run the same command to resume",
            watcher.signal_name,
            step,
            steps,
            workdir,
        )
        writer.close()
        return {"step": step, "stopped_by": watcher.signal_name, "resumed_from": resumed_from}

    with tf.io.gfile.GFile(os.path.join(workdir, "operative_config.gin"), "w") as f:
        f.write(gin.operative_config_str())
    if eval_values is None:  # nothing left to train: evaluate what was restored
        eval_values = run_eval(step)
    summary_path = os.path.join(workdir, "summary.json")
    tokens_per_second = total_tokens / train_seconds if train_seconds else None
    if tokens_per_second is None and tf.io.gfile.exists(summary_path):
        # Nothing was left to train: keep what the call that trained measured.
        with tf.io.gfile.GFile(summary_path) as f:
            previous = json.load(f)
        tokens_per_second = previous.get("tokens_per_second")
        last_train = previous.get("train") or {}
        initial_eval = initial_eval or previous.get("initial_eval")
    summary = {
        "step": step,
        "loss": eval_values["loss"],
        "mlm_accuracy": eval_values["mlm_accuracy"],
        "sentence_accuracy": eval_values.get("sentence_accuracy"),
        "eval": eval_values,
        "initial_eval": initial_eval,
        "train": last_train,
        "tokens_per_second": tokens_per_second,
        "wall_seconds": time.time() - start_time,
        "resumed_from": resumed_from,
        "skipped_steps": monitor.skipped,
        "params_sha256": params_sha256(state.params),
    }
    if jax.process_index() == 0:
        with tf.io.gfile.GFile(summary_path, "w") as f:
            json.dump(summary, f, indent=2)
    writer.close()
    return summary


class _Phases:
    """Which pipeline config feeds each step: one phase, or BERT's two (128 then 512)."""

    def __init__(
        self,
        first: pipeline.PipelineConfig,
        phase2_start: int | None,
        second: pipeline.PipelineConfig | None,
        steps: int,
        model_config: EncoderConfig,
    ):
        if (phase2_start is None) != (second is None):
            raise TrainError("set both run.phase2_start and run.phase2_pipeline_config, or neither")
        if phase2_start is not None and not 0 < phase2_start < steps:
            raise TrainError(f"run.phase2_start = {phase2_start} must be in (0, run.steps = {steps})")
        self._configs = [first] if second is None else [first, second]
        self._start = phase2_start
        self._model_config = model_config
        objectives = {config.sentence_objective for config in self._configs}
        if len(objectives) > 1:
            raise TrainError(
                f"phase 1 trains sentence_objective '{first.sentence_objective}' and phase 2 "
                f"'{second.sentence_objective}': bind PipelineConfig.sentence_objective for both"
            )
        # The sentence head (NSP or SOP: both 2-way on the pooled [CLS]) exists iff the
        # pipeline makes sentence labels: one setting, so model and data cannot disagree.
        self.sentence_objective = first.sentence_objective != "none"
        for config in self._configs:
            if config.max_seq_length > model_config.max_length:
                offset = model_config.position_offset  # RoBERTa's positions start at 2
                raise TrainError(
                    f"max_seq_length {config.max_seq_length} exceeds EncoderConfig.max_position_embeddings "
                    f"= {model_config.max_position_embeddings}"
                    + (f" minus position_offset = {offset}" if offset else "")
                )

    def index(self, step: int) -> int:
        """Phase (0 or 1) of the step that follows `step` completed steps."""
        return int(self._start is not None and step >= self._start)

    def config(self, step: int) -> pipeline.PipelineConfig:
        return self._configs[self.index(step)]

    def describe(self, step: int) -> str:
        config = self.config(step)
        return f"length {config.max_seq_length}, {config.max_predictions_per_seq} predictions per row"

    def flops_per_row(self, step: int) -> float:
        config = self.config(step)
        return flops_per_sequence(self._model_config, config.max_seq_length, config.max_predictions_per_seq)


class _StepMonitor:
    """Holds the per-step metrics on device until they are needed, and checks them.

    Metrics are fetched (a host sync) only at log and checkpoint steps. Every fetched
    step is checked: a non-finite loss or gradient norm is skipped and logged while the
    skip budget lasts, and otherwise stops the run before anything else is saved.
    """

    def __init__(self, max_skipped_steps: int, ckpt: checkpointing.Checkpointer, workdir: str):
        self.max_skipped_steps = max_skipped_steps
        self.skipped = 0
        self._ckpt = ckpt
        self._workdir = workdir
        self._on_device: list[dict[str, jax.Array]] = []
        self._window: list[dict[str, np.ndarray]] = []

    def add(self, metrics: dict[str, jax.Array]) -> None:
        self._on_device.append(metrics)

    def check(self, step: int) -> None:
        """Fetches the metrics of the steps up to `step` and checks each one."""
        fetched = jax.device_get(self._on_device)
        self._on_device = []
        first = step - len(fetched) + 1
        for offset, metrics in enumerate(fetched):
            if metrics["finite"]:
                self._window.append(metrics)
                continue
            at = first + offset
            what = f"loss {float(metrics['loss']):.4g}, gradient norm {float(metrics['grad_norm']):.4g}"
            if self.skipped < self.max_skipped_steps:
                self.skipped += 1
                log.warning(
                    "step %d: non-finite %s: update skipped (%d of at most %d)",
                    at,
                    what,
                    self.skipped,
                    self.max_skipped_steps,
                )
                continue
            self._ckpt.wait()
            last = self._ckpt.latest_step()
            where = f"step {last} in {self._workdir}/checkpoints" if last is not None else "none yet"
            budget = (
                f"after {self.skipped} skipped steps (run.max_skipped_steps = {self.max_skipped_steps})"
                if self.max_skipped_steps
                else "(set run.max_skipped_steps to skip such steps)"
            )
            raise TrainError(
                f"non-finite {what} at step {at} {budget}; nothing after it was saved; "
                f"last good checkpoint: {where}: lower the learning rate or check the data"
            )

    def summary(self, step: int) -> dict[str, float]:
        """Means over the finite steps since the last summary, plus the last grad norm and lr."""
        self.check(step)
        window, self._window = self._window, []
        if not window:
            return {"skipped_steps": self.skipped}
        sums = {
            k: float(np.sum([m[k] for m in window]))
            for k in window[0]
            if k not in ("loss", "grad_norm", "learning_rate", "finite")
        }
        out = losses.summarize(sums)
        out.update(
            grad_norm=float(window[-1]["grad_norm"]),
            learning_rate=float(window[-1]["learning_rate"]),
            skipped_steps=self.skipped,
        )
        return out


def _log_train(step: int, steps: int, values: Mapping[str, float]) -> None:
    if "loss" not in values:
        log.info("step %d/%d: every step since the last log was skipped", step, steps)
        return
    eta = (steps - step) / values["steps_per_second"]
    log.info(
        "step %d/%d  loss %.4f  mlm_acc %.4f  nsp_acc %s  lr %.3g  grad_norm %.3f  %.2f steps/s  "
        "%.0f tokens/s  %.3f TFLOP/s  eta %s",
        step,
        steps,
        values["loss"],
        values["mlm_accuracy"],
        f"{values.get('sentence_accuracy', float('nan')):.4f}",
        values["learning_rate"],
        values["grad_norm"],
        values["steps_per_second"],
        values["tokens_per_second"],
        values["model_tflops_per_second"],
        time.strftime("%H:%M:%S", time.gmtime(eta)),
    )
