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
import numpy as np

from core import cli
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

    gin.clear_config()
    try:
        cli.parse_gin(gin_files, bindings)
        config = PipelineConfig()
        found = Arm(
            workdir, config, gin.query_parameter("run.batch_size"), gin.query_parameter("run.eval_batches")
        )
    finally:
        gin.clear_config()
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


def mlm_accuracy(workdir: str) -> Callable[[list[dict[str, np.ndarray]]], float] | None:
    """A function of held-out batches: the share of their masked tokens that the workdir's
    masked LM predicts (its argmax). None for a workdir without one (trees.NoMaskedLMError:
    a model imported without its head)."""
    pretrained = bundle.load_pretrained(workdir)
    try:
        model, params = trees.masked_lm(pretrained.config, pretrained.params)
    except trees.NoMaskedLMError:
        return None
    keys = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")
    apply = jax.jit(lambda p, b: model.apply({"params": p}, b, deterministic=True)["mlm_logits"].argmax(-1))

    def accuracy(batches: list[dict[str, np.ndarray]]) -> float:
        hits = total = 0.0
        for batch in batches:
            predicted = np.asarray(apply(params, {k: batch[k] for k in keys}))
            weights = batch["masked_lm_weights"]
            hits += float(((predicted == batch["masked_lm_ids"]) * weights).sum())
            total += float(weights.sum())
        return hits / total

    return accuracy


def table(data_dir: str, arms: dict[str, Arm]) -> str:
    """Markdown: a row per arm (its model), a column per arm (its held-out rows)."""
    held_out = {name: rows(data_dir, a) for name, a in arms.items()}
    lines = [
        "Held-out masked-LM accuracy of each arm's model (rows) on each arm's held-out rows "
        "(columns: the rows and masks that arm's own evaluation used; the diagonal is its own).",
        "",
        "| model \\ rows of | " + " | ".join(arms) + " |",
        "|---|" + "---|" * len(arms),
    ]
    for name, a in arms.items():
        accuracy = mlm_accuracy(a.workdir)
        cells = ["-" if accuracy is None else f"{accuracy(batches):.4f}" for batches in held_out.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
