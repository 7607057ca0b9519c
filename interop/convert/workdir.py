"""An imported model as a workdir that `interop.bundle.load_pretrained` reads, with a record
of where it came from."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import tensorflow as tf

from core import lease
from core import workdir as workdir_lib
from data import tokenizers
from interop import bundle
from interop.convert.layout import ConversionError
from models.encoder import EncoderConfig

# Beside the model: the source and which optional parts (pooler, MLM head, NSP/SOP head,
# ELECTRA's discriminator head and generator, DeBERTa-v3's RTD head) it had; parts it
# lacked are left out of the parameters rather than filled with random values.
CONVERTED_FROM = "converted_from.json"


@dataclasses.dataclass
class Imported:
    """A converted model, ready for `write_workdir`.

    params: the pretraining tree as float32 NumPy arrays, without the optional groups the
    source lacked; groups: the optional groups present.
    """

    model_type: str
    config: EncoderConfig
    params: dict[str, Any]
    tokenizer: tokenizers.Tokenizer
    groups: list[str]
    source: str


def write_workdir(workdir: str, imported: Imported) -> None:
    """Writes `imported` as a workdir (step 0) that `load_pretrained` reads, plus converted_from.json."""
    with lease.held(workdir, "interop.convert import"):  # one writer per workdir (core/lease.py)
        if tf.io.gfile.exists(os.path.join(workdir, workdir_lib.MODEL_CONFIG)):
            raise ConversionError(f"'{workdir}' already holds a model: choose a new --workdir")
        bundle.save_pretrained(workdir, imported.config, imported.params, imported.tokenizer, step=0)
        info = {"source": imported.source, "model_type": imported.model_type, "groups": imported.groups}
        with tf.io.gfile.GFile(os.path.join(workdir, CONVERTED_FROM), "w") as f:
            json.dump(info, f, indent=2)
