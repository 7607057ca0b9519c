"""Original TF1 checkpoints (google-research/bert, google-research/albert) -> workdirs: the
family's config file (bert_config.json / albert_config.json, formats.TF_FORMATS), the
newest checkpoint (read with `tf.train.load_checkpoint`) and the vocab."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from interop.convert import formats
from interop.convert.format import ModelFormat, encoder_config, read_json, warn_ignored
from interop.convert.layout import ConversionError
from interop.convert.tokenizer_files import check_vocab, read_tokenizer
from interop.convert.workdir import Imported
from models.encoder import EncoderConfig


def tf_config_to_ours(fmt: ModelFormat, tf_config: Mapping[str, Any], where: str) -> EncoderConfig:
    """EncoderConfig of a family's TF1 config file. Its "gelu" is the family's
    (`ModelFormat.tf_activation`): the exact erf form for BERT, the tanh approximation for
    ALBERT."""
    name = fmt.tf_config_file
    act = tf_config.get("hidden_act", "gelu")
    if act != "gelu":
        raise ConversionError(f"{where}: {name} hidden_act={act!r} is not supported: use 'gelu'")
    # modeling.py's layer_norm (tf.contrib.layers.layer_norm) uses epsilon 1e-12.
    extra: dict[str, Any] = {"layer_norm_eps": 1e-12, **fmt.tf_options(tf_config, where)}
    fields = {"type_vocab_size": 16, **tf_config}  # modeling.py's BertConfig default
    return encoder_config(fields, fmt.tf_activation, where, name, **extra)


def _checkpoint_prefix(directory: str, where: str) -> str:
    """The newest checkpoint in `directory`: the `checkpoint` file's, else the highest model.ckpt-N."""
    latest = tf.train.latest_checkpoint(directory)
    if latest:
        return latest
    prefixes = [p[: -len(".index")] for p in tf.io.gfile.glob(os.path.join(directory, "*.index"))]
    if not prefixes:
        raise ConversionError(
            f"{where}: no TF checkpoint (*.index, e.g. bert_model.ckpt.index) in the folder"
        )

    def step(prefix: str) -> int:
        match = re.search(r"-(\d+)$", prefix)
        return int(match.group(1)) if match else -1

    return max(prefixes, key=step)


def _folder_format(directory: str, where: str) -> ModelFormat:
    """The family of a TF1 folder, by its config file (the most specific family first)."""
    found = [fmt for name, fmt in formats.TF_FORMATS.items() if os.path.exists(os.path.join(directory, name))]
    if not found:
        raise ConversionError(
            f"{where}: no {' or '.join(formats.TF_FORMATS)}: pass the folder of a "
            "google-research/bert or /albert checkpoint"
        )
    return found[0]


def read_tf_model(directory: str) -> tuple[ModelFormat, EncoderConfig, dict[str, Any], list[str]]:
    """The config file and the newest checkpoint of a google-research folder: (family, config,
    our params, optional groups)."""
    where = f"tf:{directory}"
    if not os.path.isdir(directory):
        raise ConversionError(f"{where}: not a directory")
    fmt = _folder_format(directory, where)
    config = tf_config_to_ours(fmt, read_json(os.path.join(directory, fmt.tf_config_file), where), where)
    prefix = _checkpoint_prefix(directory, where)
    try:
        reader = tf.train.load_checkpoint(prefix)
    except (tf.errors.OpError, ValueError) as e:
        raise ConversionError(f"{where}: cannot read checkpoint {os.path.basename(prefix)}: {e}") from None
    shapes = reader.get_variable_to_shape_map()
    # TF-Hub exports put every variable under "module/".
    strip = "module/" if any(n.startswith("module/") for n in shapes) else ""
    names = {n.removeprefix(strip) for n in shapes}
    spec = fmt.expand("tf", config.num_layers)
    params, groups, used = fmt.build_params(
        spec, lambda n: reader.get_tensor(strip + n), names, config, where, "variable", fmt.tf_config_file
    )
    # Optimizer slots and the step counter are training state, not model.
    optimizer_slot = re.compile(r"/(adam|lamb)_[mv]$")
    warn_ignored(
        where,
        "variables",
        [n for n in names if n not in used and n != "global_step" and not optimizer_slot.search(n)],
    )
    return fmt, config, params, groups


def import_tf(directory: str) -> Imported:
    """Reads a google-research/bert (or /albert) checkpoint folder with its vocab."""
    where = f"tf:{directory}"
    fmt, config, params, groups = read_tf_model(directory)
    tokenizer = read_tokenizer(fmt, directory, where)
    check_vocab(config, tokenizer, where, fmt.tf_config_file)
    return Imported(fmt.model_type, config, params, tokenizer, groups, where)
