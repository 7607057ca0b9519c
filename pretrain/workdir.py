"""What a pretraining workdir hands to the rest of the codebase: model config, tokenizer, params.

    WORKDIR/model_config.json    EncoderConfig fields (written when pretraining starts)
    WORKDIR/tokenizer/           the tokenizer the shards were made with (load_tokenizer)
    WORKDIR/checkpoints/<step>/  orbax TrainState {step, params, opt_state}

GLUE fine-tuning (`--init_checkpoint`), checkpoint export and feature extraction all read
a workdir through `load_pretrained`, so they never need the gin files of the run.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorflow as tf

from data import shards, tokenizers
from models.encoder import EncoderConfig

MODEL_CONFIG = "model_config.json"
TOKENIZER_DIR = "tokenizer"
CHECKPOINTS_DIR = "checkpoints"


class WorkdirError(ValueError):
    """A workdir that cannot serve as a pretrained model (one line, user-facing)."""


@dataclasses.dataclass
class Pretrained:
    """A pretrained model as plain host data.

    params: the PretrainingModel parameter tree ({'encoder', 'mlm_head', ['sentence_head']})
      as float NumPy arrays, whatever mesh it was trained on.
    """

    config: EncoderConfig
    params: dict[str, Any]
    tokenizer: tokenizers.Tokenizer
    step: int


def write_model_info(workdir: str, config: EncoderConfig, data_dir: str) -> None:
    """Records the model config and copies the shards' tokenizer into the workdir."""
    tf.io.gfile.makedirs(workdir)
    with tf.io.gfile.GFile(os.path.join(workdir, MODEL_CONFIG), "w") as f:
        json.dump(dataclasses.asdict(config), f, indent=2)
    source = os.path.join(data_dir, shards.TOKENIZER_DIR)
    if tf.io.gfile.isdir(source):
        tokenizers.load_tokenizer(source).save(os.path.join(workdir, TOKENIZER_DIR))


def save_pretrained(
    workdir: str,
    config: EncoderConfig,
    params: dict[str, Any],
    tokenizer: tokenizers.Tokenizer,
    step: int = 0,
) -> None:
    """Writes a workdir that `load_pretrained` reads: config, tokenizer and params only.

    Used by checkpoint import and by tests; pretraining writes the full train state
    through pretrain/checkpointing.py, whose `params` subtree is read the same way.
    """
    tf.io.gfile.makedirs(workdir)
    with tf.io.gfile.GFile(os.path.join(workdir, MODEL_CONFIG), "w") as f:
        json.dump(dataclasses.asdict(config), f, indent=2)
    tokenizer.save(os.path.join(workdir, TOKENIZER_DIR))
    path = os.path.join(_absolute(workdir), CHECKPOINTS_DIR, str(step), "state")
    checkpointer = ocp.PyTreeCheckpointer()
    checkpointer.save(path, {"params": jax.device_get(nn.meta.unbox(params))}, force=True)


def _absolute(workdir: str) -> str:
    """orbax wants absolute local paths; GCS paths pass through."""
    return workdir if "://" in workdir else os.path.abspath(workdir)


def load_model_config(workdir: str) -> EncoderConfig:
    path = os.path.join(workdir, MODEL_CONFIG)
    if not tf.io.gfile.exists(path):
        raise WorkdirError(
            f"no {MODEL_CONFIG} in '{workdir}': pass the workdir of a pretraining run "
            "(python -m pretrain.train) or of an imported checkpoint"
        )
    with tf.io.gfile.GFile(path) as f:
        fields = json.load(f)
    known = {field.name for field in dataclasses.fields(EncoderConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise WorkdirError(
            f"{path} has fields this code does not know: {unknown}; is it from a newer version?"
        )
    return EncoderConfig(**fields)


def latest_step(workdir: str) -> int:
    directory = os.path.join(workdir, CHECKPOINTS_DIR)
    steps = (
        [int(name.rstrip("/")) for name in tf.io.gfile.listdir(directory)]
        if tf.io.gfile.isdir(directory)
        else []
    )
    steps = [s for s in steps if tf.io.gfile.exists(os.path.join(directory, str(s), "state"))]
    if not steps:
        raise WorkdirError(f"no finished checkpoint in '{directory}': pretraining has not saved one yet")
    return max(steps)


def load_params(workdir: str, step: int | None = None) -> tuple[dict[str, Any], int]:
    """The parameters of checkpoint `step` (default: the latest) as NumPy arrays, and the step.

    Restores only the `params` subtree (not the optimizer state) onto the host, so any
    device count can read a checkpoint written on any mesh.
    """
    step = latest_step(workdir) if step is None else step
    path = os.path.join(_absolute(workdir), CHECKPOINTS_DIR, str(step), "state")
    checkpointer = ocp.PyTreeCheckpointer()
    try:
        metadata = checkpointer.metadata(path)
        tree = metadata.item_metadata.tree if hasattr(metadata, "item_metadata") else metadata
        params_metadata = tree["params"]
        restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), params_metadata)
        restored = checkpointer.restore(
            path,
            args=ocp.args.PyTreeRestore(
                item={"params": params_metadata}, restore_args={"params": restore_args}, partial_restore=True
            ),
        )
    except (FileNotFoundError, KeyError, ValueError) as e:
        raise WorkdirError(f"cannot read the parameters of checkpoint {step} in '{workdir}': {e}") from None
    return restored["params"], step


def load_pretrained(workdir: str, step: int | None = None) -> Pretrained:
    """Config, parameters and tokenizer of a pretraining (or imported) workdir."""
    config = load_model_config(workdir)
    tokenizer_dir = os.path.join(workdir, TOKENIZER_DIR)
    if not tf.io.gfile.isdir(tokenizer_dir):
        raise WorkdirError(
            f"no {TOKENIZER_DIR}/ in '{workdir}': the workdir was not written by pretrain.train"
        )
    tokenizer = tokenizers.load_tokenizer(tokenizer_dir)
    if tokenizer.vocab_size != config.vocab_size:
        raise WorkdirError(
            f"'{workdir}': tokenizer has {tokenizer.vocab_size} entries but the model {config.vocab_size}"
        )
    params, step = load_params(workdir, step)
    return Pretrained(config=config, params=params, tokenizer=tokenizer, step=step)
