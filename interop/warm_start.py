"""Continued pretraining: a fresh pretraining tree started from a workdir's parameters
(`run.init_from`: one of our workdirs or an imported published model)."""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import numpy as np
import tensorflow as tf
from flax import traverse_util

from core import workdir as workdir_lib
from core.workdir import TOKENIZER_DIR, WorkdirError
from data import shards, tokenizers
from models.pretraining import VOCAB_ROWS, resize_vocab_rows

log = logging.getLogger(__name__)


def check_source(init_from: str, manifest: shards.Manifest) -> None:
    """Fails, before a run writes anything, when `init_from` is not a model to start from:
    no finished checkpoint, no tokenizer/, or another tokenizer than the shards'."""
    try:
        workdir_lib.latest_step(init_from)
    except WorkdirError as e:
        raise WorkdirError(
            f"run.init_from '{init_from}': {e} "
            "(it takes a workdir of pretrain.train or interop.convert import)"
        ) from None
    _check_tokenizer(init_from, manifest)


def _check_tokenizer(init_from: str, manifest: shards.Manifest) -> None:
    source_identity = _tokenizer_identity(init_from)
    shards_identity = manifest.tokenizer or None
    if shards_identity is not None and source_identity != shards_identity:
        raise WorkdirError(
            f"run.init_from '{init_from}' has another tokenizer than the shards "
            f"({source_identity.get('kind')} {source_identity.get('vocab_size')} vs "
            f"{shards_identity.get('kind')} {shards_identity.get('vocab_size')}): preprocess the "
            f"corpus with --tokenizer={os.path.join(init_from, TOKENIZER_DIR)}"
        )


def warm_start_params(init_from: str, params: Any, shardings: Any, manifest: shards.Manifest) -> Any:
    """`params` (the fresh, sharded pretraining tree) with every parameter `init_from` has:
    continued pretraining from one of our workdirs or an imported published model.

    A parameter the source lacks (an imported `BertModel` has no MLM or NSP head, RoBERTa no
    sentence head) keeps its fresh init, with a log line; a parameter of another shape, or
    one the model does not have, is an error, as is a tokenizer other than the shards'.
    Returns the tree with each array placed with its sharding.
    """
    _check_tokenizer(init_from, manifest)
    source, step = workdir_lib.load_params(init_from)
    target = traverse_util.flatten_dict(params)
    # Another vocab_pad_multiple only adds or drops rows that are never used.
    rows = {target[p].shape[0] for p in VOCAB_ROWS if p in target}
    table = traverse_util.flatten_dict(source).get(VOCAB_ROWS[0])
    if len(rows) == 1 and table is not None and table.shape[0] >= manifest.vocab_size:
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
            f"no {TOKENIZER_DIR}/ in '{workdir}': run.init_from takes a workdir of pretrain.train or "
            "interop.convert import"
        )
    return tokenizers.load_tokenizer(tokenizer_dir).identity()
