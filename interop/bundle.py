"""A pretrained model as the rest of the codebase sees it: config, parameters, tokenizer.

Reads and writes model workdirs (the layout is core/workdir.py): GLUE fine-tuning
(`--init_from`), checkpoint export, feature extraction, fill-mask and continued
pretraining (`run.init_from`, interop/warm_start.py) all go through `load_pretrained`, so
they never need the gin files of the run. The parameters are those of the pretraining tree
as readers see it (models/trees.py); its `encoder` subtree is the model every later stage
uses (every objective keeps the encoder to fine-tune there).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import tensorflow as tf

from core import workdir as workdir_lib
from core.workdir import TOKENIZER_DIR, WorkdirError
from data import shards, tokenizers
from models import trees
from models.encoder import EncoderConfig


@dataclasses.dataclass
class Pretrained:
    """A pretrained model as plain host data.

    params: the PretrainingModel parameter tree ({'encoder', 'mlm_head', ['sentence_head']},
      or ELECTRA's {'encoder', 'discriminator_head', ['generator', 'generator_head']}) as
      float NumPy arrays, whatever mesh it was trained on, as `models.trees.for_readers`
      gives it.
    """

    config: EncoderConfig
    params: dict[str, Any]
    tokenizer: tokenizers.Tokenizer
    step: int


def write_model_info(workdir: str, config: EncoderConfig, data_dir: str) -> None:
    """Records the model config and copies the shards' tokenizer into the workdir."""
    workdir_lib.write_config(workdir, config)
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
    through core/checkpointing.py, whose `params` subtree is read the same way.
    """
    workdir_lib.write_config(workdir, config)
    tokenizer.save(os.path.join(workdir, TOKENIZER_DIR))
    workdir_lib.save_params(workdir, params, step)


def load_model_config(workdir: str) -> EncoderConfig:
    return workdir_lib.read_config(workdir, EncoderConfig)


def load_pretrained(workdir: str, step: int | None = None) -> Pretrained:
    """Config, parameters and tokenizer of a pretraining (or imported) workdir."""
    config = load_model_config(workdir)
    tokenizer_dir = os.path.join(workdir, TOKENIZER_DIR)
    if not tf.io.gfile.isdir(tokenizer_dir):
        raise WorkdirError(
            f"no {TOKENIZER_DIR}/ in '{workdir}': the workdir was not written by pretrain.train"
        )
    tokenizer = tokenizers.load_tokenizer(tokenizer_dir)
    if not tokenizer.fits_vocab(config.vocab_size):
        raise WorkdirError(
            f"'{workdir}': tokenizer has {tokenizer.vocab_size} entries but the model {config.vocab_size}"
        )
    params, step = workdir_lib.load_params(workdir, step)
    return Pretrained(config=config, params=trees.for_readers(params), tokenizer=tokenizer, step=step)
