"""Every arm's model on every arm's held-out rows: the masked-LM accuracy of an ablation grid's
arms under each other's masking (`pretrain.ablate --cross_eval`).

An arm's own held-out metrics are measured with its own masking, so arms that mask
differently (characters against whole words, tokens against n-grams or spans, static against
dynamic) cannot be compared by them: predicting a whole masked word is harder than one
character of it. Here each arm's final parameters predict the masked tokens of each arm's
held-out rows, the rows its own evaluation used (`pretrain.trainer` `evaluate`: the first
`run.eval_batches` batches of `run.batch_size` rows of the held-out split, unshuffled), so
every column compares the arms on the same rows and the diagonal is each arm's own
evaluation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from core import cli
from core import workdir as workdir_lib
from core.errors import UserError
from data import pipeline
from data.pipeline_config import PipelineConfig
from interop import bundle
from models import trees


class CrossEvalError(UserError):
    """Arms that cannot be evaluated on each other's rows (one line)."""


@dataclasses.dataclass(frozen=True)
class Arm:
    """An arm's workdir (its final parameters) and its evaluation rows: the pipeline config,
    rows per batch and batches its gin files give."""

    workdir: str
    pipeline_config: PipelineConfig
    batch_size: int
    eval_batches: int


def arm(workdir: str, gin_files: list[str], bindings: list[str]) -> Arm:
    """The Arm that `gin_files` + `bindings` (the arm's training command's) make in `workdir`."""
    import gin

    from pretrain import trainer  # noqa: F401  (registers what the run files bind)

    def setting(name: str):  # a run setting, bound or at RunSettings' default
        try:
            return gin.query_parameter(f"run.{name}")
        except ValueError:
            return trainer.RunSettings.__dataclass_fields__[name].default

    gin.clear_config()
    try:
        cli.parse_gin(gin_files, bindings)
        config = PipelineConfig()
        found = Arm(workdir, config, setting("batch_size"), setting("eval_batches"))
        two_phases = setting("phase2_start") is not None
    finally:
        gin.clear_config()
    if two_phases:
        raise CrossEvalError(
            f"--cross_eval evaluates one phase's rows, and {workdir}'s arm trains two (run.phase2_start): "
            "leave it out, or compare the arms of one phase"
        )
    if config.masking == "in_step" or config.format == "xlnet_stream":
        raise CrossEvalError(
            f"--cross_eval compares masked-LM rows, and {workdir}'s arm makes none (its objective masks "
            f"{'in the step' if config.masking == 'in_step' else 'with XLNet permutations'}): leave it out"
        )
    return found


def rows(data_dir: str, of: Arm) -> list[dict[str, np.ndarray]]:
    """The held-out batches `of`'s own evaluation reads (one host)."""
    ds = pipeline.make_dataset(data_dir, "eval", of.pipeline_config, of.batch_size, shuffle=False)
    return list(ds.take(of.eval_batches).as_numpy_iterator())


def mlm_metrics(workdir: str) -> Callable[[list[dict[str, np.ndarray]]], tuple[float, float]] | None:
    """A function of held-out batches: (accuracy, loss) of the workdir's masked LM on their
    masked tokens (the share its argmax predicts; the mean negative log-likelihood, nats).
    None for a workdir without one (trees.NoMaskedLMError: a model imported without its head)."""
    params, _ = workdir_lib.load_params(workdir)  # the latest step
    try:
        model, params = trees.masked_lm(bundle.load_model_config(workdir), trees.for_readers(params))
    except trees.NoMaskedLMError:
        return None
    # Packed rows (DOC-SENTENCES) also carry each example's positions and ids, which keep
    # attention within an example, as in the trainer's evaluation.
    keys = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "positions", "example_ids")

    @jax.jit
    def apply(p, batch, targets):  # -> (argmax [B, P], negative log-likelihood [B, P])
        logits = model.apply({"params": p}, batch, deterministic=True)["mlm_logits"]
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
        return logits.argmax(-1), -jnp.take_along_axis(log_probs, targets[..., None], -1)[..., 0]

    def metrics(batches: list[dict[str, np.ndarray]]) -> tuple[float, float]:
        hits = nll = total = 0.0
        for batch in batches:
            inputs = {k: batch[k] for k in keys if k in batch}
            predicted, loss = map(np.asarray, apply(params, inputs, batch["masked_lm_ids"]))
            weights = batch["masked_lm_weights"]
            hits += float(((predicted == batch["masked_lm_ids"]) * weights).sum())
            nll += float((loss * weights).sum())
            total += float(weights.sum())
        return hits / total, nll / total

    return metrics


def table(data_dir: str, arms: dict[str, Arm]) -> str:
    """Markdown: a row per arm (its model), a column per arm (its held-out rows)."""
    held_out = {name: rows(data_dir, a) for name, a in arms.items()}
    lines = [
        "Held-out masked-LM accuracy (and loss) of each arm's model (rows) on each arm's held-out "
        "rows (columns: the rows and masks that arm's own evaluation used; the diagonal is its own).",
        "",
        "| model \\ rows of | " + " | ".join(arms) + " |",
        "|---|" + "---|" * len(arms),
    ]
    for name, a in arms.items():
        metrics = mlm_metrics(a.workdir)
        cells = ["-" if metrics is None else "{:.4f} ({:.3f})".format(*metrics(b)) for b in held_out.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
