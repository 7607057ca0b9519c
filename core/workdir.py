"""The files of a model workdir: what pretraining writes and every later stage reads.

    WORKDIR/model_config.json    the model's config dataclass as JSON (EncoderConfig fields)
    WORKDIR/tokenizer/           the tokenizer of the model's ids (data/tokenizers/ files)
    WORKDIR/checkpoints/<step>/  orbax; `state` holds {step, params, opt_state} (pretraining)
                                 or {params} (an imported or exported model)

This module knows the layout and the parameters; interop/bundle.py adds the config
and tokenizer types on top (Pretrained, load_pretrained), so GLUE fine-tuning, export,
feature extraction and fill-mask never need the gin files of the run.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, TypeVar

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from core.checkpointing import orbax_reports_held, saved_tree
from core.errors import UserError, one_line

MODEL_CONFIG = "model_config.json"
TOKENIZER_DIR = "tokenizer"
CHECKPOINTS_DIR = "checkpoints"

Config = TypeVar("Config")


class WorkdirError(UserError):
    """A workdir that cannot serve as a pretrained model (one line, user-facing)."""


def absolute(path: str) -> str:
    """orbax wants absolute local paths; object-store paths (gs://...) pass through."""
    return path if "://" in path else os.path.abspath(path)


def write_config(workdir: str, config: Any) -> None:
    """Writes the model's config dataclass to WORKDIR/model_config.json."""
    epath.Path(workdir).mkdir(parents=True, exist_ok=True)
    with epath.Path(workdir, MODEL_CONFIG).open("w") as f:
        json.dump(dataclasses.asdict(config), f, indent=2)


def read_config(workdir: str, config_class: type[Config]) -> Config:
    """The config dataclass of WORKDIR/model_config.json; fields this code does not know are an error."""
    path = os.path.join(workdir, MODEL_CONFIG)
    if not epath.Path(path).exists():
        raise WorkdirError(
            f"no {MODEL_CONFIG} in '{workdir}': pass the workdir of a pretraining run "
            "(python -m pretrain.train) or of an imported checkpoint"
        )
    with epath.Path(path).open() as f:
        fields = json.load(f)
    known = {field.name for field in dataclasses.fields(config_class)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise WorkdirError(
            f"{path} has fields this code does not know: {unknown}; is it from a newer version?"
        )
    return config_class(**fields)


def finished_steps(workdir: str) -> list[int]:
    """The steps of the workdir's finalized checkpoints (orbax's rule) that hold a `state`
    item, ascending."""
    directory = epath.Path(workdir, CHECKPOINTS_DIR)
    return sorted(s for s in ocp.utils.checkpoint_steps(directory) if (directory / str(s) / "state").exists())


def latest_step(workdir: str) -> int:
    """The newest finished checkpoint step of the workdir."""
    steps = finished_steps(workdir)
    if not steps:
        directory = os.path.join(workdir, CHECKPOINTS_DIR)
        raise WorkdirError(f"no finished checkpoint in '{directory}': pretraining has not saved one yet")
    return steps[-1]


def save_params(workdir: str, params: Any, step: int = 0) -> None:
    """Writes `params` as checkpoint `step` ({params} only), readable by `load_params`: a step
    finalized as pretraining's are (a checkpoint manager's save), on any file system."""
    with ocp.CheckpointManager(os.path.join(absolute(workdir), CHECKPOINTS_DIR)) as manager:
        state = {"params": jax.device_get(nn.meta.unbox(params))}
        manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)), force=True)
        manager.wait_until_finished()


def load_params(workdir: str, step: int | None = None) -> tuple[dict[str, Any], int]:
    """The parameters of checkpoint `step` (default: the latest) as NumPy arrays, and the step.

    Restores only the `params` subtree (not the optimizer state) onto the host, so any
    device count can read a checkpoint written on any mesh.
    """
    if step is None:
        step = latest_step(workdir)
    elif step not in (steps := finished_steps(workdir)):
        raise WorkdirError(
            f"no checkpoint step {step} in '{workdir}' (it has steps {steps}): pick one of those"
        )
    path = os.path.join(absolute(workdir), CHECKPOINTS_DIR, str(step), "state")
    checkpointer = ocp.PyTreeCheckpointer()
    try:
        with orbax_reports_held():
            params_metadata = saved_tree(path)["params"]
            restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), params_metadata)
            restored = checkpointer.restore(
                path,
                args=ocp.args.PyTreeRestore(
                    item={"params": params_metadata},
                    restore_args={"params": restore_args},
                    partial_restore=True,
                ),
            )
    # orbax and tensorstore raise whatever a damaged file makes them (ValueError, KeyError,
    # AttributeError on missing metadata, tensorstore's own errors): all mean "unreadable".
    except Exception as e:  # pylint: disable=broad-except
        raise WorkdirError(
            f"cannot read the parameters of checkpoint {step} in '{workdir}' ({one_line(e)}): it is "
            "damaged or incomplete; pick another with --step, or import or train it again"
        ) from None
    return restored["params"], step
