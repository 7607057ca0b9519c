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
import logging
import os
from typing import Any

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorflow as tf
from flax import traverse_util

from data import shards, tokenizers
from models.encoder import EncoderConfig
from models.pretraining import VOCAB_ROWS, resize_vocab_rows

MODEL_CONFIG = "model_config.json"
TOKENIZER_DIR = "tokenizer"
CHECKPOINTS_DIR = "checkpoints"

log = logging.getLogger(__name__)


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


def warm_start_params(init_from: str, params: Any, shardings: Any, manifest: dict) -> Any:
    """`params` (the fresh, sharded pretraining tree) with every parameter `init_from` has:
    continued pretraining from one of our workdirs or an imported published model.

    A parameter the source lacks (an imported `BertModel` has no MLM or NSP head, RoBERTa no
    sentence head) keeps its fresh init, with a log line; a parameter of another shape, or
    one the model does not have, is an error, as is a tokenizer other than the shards'.
    Returns the tree with each array placed with its sharding.
    """
    source_identity = _tokenizer_identity(init_from)
    shards_identity = manifest.get("tokenizer")
    if shards_identity is not None and source_identity != shards_identity:
        raise WorkdirError(
            f"run.init_from '{init_from}' has another tokenizer than the shards "
            f"({source_identity.get('kind')} {source_identity.get('vocab_size')} vs "
            f"{shards_identity.get('kind')} {shards_identity.get('vocab_size')}): preprocess the "
            f"corpus with --tokenizer={os.path.join(init_from, TOKENIZER_DIR)}"
        )
    source, step = load_params(init_from)
    target = traverse_util.flatten_dict(params)
    # Another vocab_pad_multiple only adds or drops rows that are never used.
    rows = {target[p].shape[0] for p in VOCAB_ROWS if p in target}
    table = traverse_util.flatten_dict(source).get(VOCAB_ROWS[0])
    if len(rows) == 1 and table is not None and table.shape[0] >= manifest["vocab_size"]:
        source = resize_vocab_rows(source, rows.pop())
    source = traverse_util.flatten_dict(source)
    target_shardings = traverse_util.flatten_dict(shardings)
    unused = sorted("/".join(p) for p in source if p not in target)
    if unused:
        raise WorkdirError(
            f"run.init_from '{init_from}' has parameters the model does not: {unused[:3]}: "
            "use its model_config.json (the same EncoderConfig) for this run"
        )
    loaded, fresh = {}, []
    for path, value in target.items():
        if path not in source:
            fresh.append("/".join(path))
            loaded[path] = value
            continue
        stored = np.asarray(source[path])
        if stored.shape != value.shape:
            raise WorkdirError(
                f"run.init_from '{init_from}': {'/'.join(path)} has shape {stored.shape}, the model "
                f"wants {value.shape}: use its model_config.json (the same EncoderConfig) for this run"
            )
        loaded[path] = jax.device_put(stored.astype(value.dtype), target_shardings[path])
    if fresh:
        log.info(
            "run.init_from %s (step %d) has no %s: these start from a fresh init", init_from, step, fresh
        )
    return traverse_util.unflatten_dict(loaded)


def _tokenizer_identity(workdir: str) -> dict:
    """The identity() of a workdir's tokenizer (WorkdirError when it has none)."""
    tokenizer_dir = os.path.join(workdir, TOKENIZER_DIR)
    if not tf.io.gfile.isdir(tokenizer_dir):
        raise WorkdirError(
            f"no {TOKENIZER_DIR}/ in '{workdir}': pass a workdir of pretrain.train or models.convert"
        )
    return tokenizers.load_tokenizer(tokenizer_dir).identity()
