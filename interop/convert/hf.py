"""Hugging Face folders <-> workdirs: config.json, the weights and the tokenizer files.

The family of a folder is its config.json's model_type (formats.py); everything a family
does differently is a hook of its format (format.py).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from interop import bundle
from interop.convert import formats
from interop.convert.format import ModelFormat
from interop.convert.hf_files import read_hf_config, read_hf_tensors
from interop.convert.layout import ConversionError
from interop.convert.tokenizer_files import check_vocab, read_tokenizer, write_hf_tokenizer
from interop.convert.workdir import Imported
from models.encoder import EncoderConfig

log = logging.getLogger("convert")

# The top-level subtrees of a tree with a generator (ELECTRA, DeBERTa-v3) that are the generator.
GENERATOR_PARTS = ("generator", "generator_head")
# Top-level subtrees of our pretraining trees that no transformers class has: an export
# writes the rest of the model and leaves these out with a warning. SpanBERT's span boundary
# objective head exists only in pretraining (facebookresearch/SpanBERT's releases drop it too).
NOT_EXPORTED = {"sbo_head": "the span boundary (SBO) head"}


def hf_config_to_ours(hf: Mapping[str, Any], where: str) -> tuple[ModelFormat, EncoderConfig]:
    """The family and EncoderConfig of an HF config.json; refuses model types and options we
    cannot reproduce."""
    fmt = formats.by_model_type(hf, where)
    return fmt, fmt.config_from_hf(hf, where)


def read_hf_model(directory: str) -> tuple[ModelFormat, EncoderConfig, dict[str, Any], list[str]]:
    """config.json and the weights of an HF folder: (family, config, our params, optional groups).

    A config.json without model_type is read as the family whose old folders wrote such
    configs when its keys and weight names are that family's (BERT's: pytorch-pretrained-bert
    folders, e.g. SpanBERT's release); any other config without model_type is refused as an
    unsupported model type.
    """
    where = f"hf:{directory}"
    hf = read_hf_config(directory, where)
    tensors = None
    candidate = formats.untyped_candidate(hf)
    if candidate is not None:
        tensors = read_hf_tensors(directory, where)
        if formats.claims_untyped(candidate, tensors):
            log.info(
                "%s: config.json has no model_type; its keys and weight names are %s's: read as %s",
                where,
                candidate.model_type.upper(),
                candidate.model_type.upper(),
            )
            hf = {**hf, "model_type": candidate.model_type}
    fmt, config = hf_config_to_ours(hf, where)
    if tensors is None:
        tensors = read_hf_tensors(directory, where)
    fmt.check_hf_tensors(tensors, where)
    params, groups = fmt.params_from_hf(config, tensors, where)
    return fmt, fmt.imported_config(config, groups), params, groups


def import_hf(directory: str, generator_dir: str | None = None) -> Imported:
    """Reads an HF model folder (config.json, weights, tokenizer files) into our format; with
    `generator_dir` (ELECTRA: an ElectraForMaskedLM folder), the generator too."""
    where = f"hf:{directory}"
    fmt, config, params, groups = read_hf_model(directory)
    source = where
    if generator_dir is not None:
        params.update(fmt.read_generator(generator_dir, config, params, where))
        groups = [*groups, "generator"]
        source = f"{where} + hf:{generator_dir}"
    tokenizer = read_tokenizer(fmt, directory, where)
    check_vocab(config, tokenizer, where, "config.json")
    return Imported(fmt.model_type, config, params, tokenizer, groups, source)


# --- writing a folder ------------------------------------------------------------------


def hf_model_files(
    config: EncoderConfig, params: Mapping[str, Any], pad_id: int, fmt: ModelFormat | None = None
) -> tuple[dict, dict[str, np.ndarray]]:
    """(config.json contents, tensors by HF name) of our config and parameters, laid out as
    `fmt` (default: the family of `config`, `formats.format_of`)."""
    return (fmt or formats.format_of(config)).hf_files(config, params, pad_id)


def write_hf_model(
    output: str,
    config: EncoderConfig,
    params: Mapping[str, Any],
    pad_id: int,
    fmt: ModelFormat | None = None,
) -> str:
    """Writes config.json and model.safetensors (`hf_model_files`); returns the HF class
    named in config.json."""
    from safetensors.numpy import save_file

    hf_config, tensors = hf_model_files(config, params, pad_id, fmt)
    os.makedirs(output, exist_ok=True)
    save_file(tensors, os.path.join(output, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(output, "config.json"), "w") as f:
        json.dump(hf_config, f, indent=2)
    return hf_config["architectures"][0]


def _check_empty(folder: str | None) -> None:
    """Export writes only into a new or empty folder: never over files a user keeps there
    (their own config.json or weights), as import never writes over a workdir."""
    if folder is None or not os.path.isdir(folder) or not os.listdir(folder):
        return
    held = sorted(os.listdir(folder))
    raise ConversionError(
        f"'{folder}' is not empty (it holds {', '.join(held[:3])}{', ...' if len(held) > 3 else ''}): "
        "export to a new or empty folder"
    )


def export_hf(workdir: str, output: str, step: int | None = None, generator_output: str | None = None) -> str:
    """Writes config.json, model.safetensors and tokenizer files of `workdir` to `output`; of
    a workdir's generator (ELECTRA, DeBERTa-v3), with `generator_output`, also to that folder
    (`ModelFormat.generator_model`: an ElectraForMaskedLM / DebertaV2ForMaskedLM).

    Returns the HF class written into `output`'s config.json: the one with exactly the
    workdir's heads (e.g. BertForPreTraining with MLM + NSP, BertForMaskedLM with only MLM,
    BertModel without; ElectraForPreTraining for an ELECTRA discriminator). Subtrees with no
    transformers counterpart (NOT_EXPORTED: SpanBERT's SBO head) are left out with a warning,
    so a SpanBERT workdir exports as BertForMaskedLM.
    """
    for folder in (output, generator_output):
        _check_empty(folder)
    pretrained = bundle.load_pretrained(workdir, step)
    config, params, tokenizer = pretrained.config, pretrained.params, pretrained.tokenizer
    try:
        fmt = formats.format_of(config)
        generator = None
        if generator_output is not None:
            generator = fmt.generator_model(config, params)
        elif "generator" in params:
            log.warning(
                "'%s': the %s generator is not exported: pass --generator_to=hf:DIR for it",
                workdir,
                fmt.generator_family,
            )
        for part, what in NOT_EXPORTED.items():
            if part in params:
                log.warning("'%s': %s has no transformers counterpart: not exported", workdir, what)
        write_hf_tokenizer(tokenizer, config, output)
        model = {k: v for k, v in params.items() if k not in GENERATOR_PARTS and k not in NOT_EXPORTED}
        architecture = write_hf_model(output, config, model, tokenizer.pad_id, fmt)
        if generator is not None:
            generator_format, generator_config, tree = generator
            write_hf_tokenizer(tokenizer, config, generator_output)
            write_hf_model(generator_output, generator_config, tree, tokenizer.pad_id, generator_format)
        return architecture
    except ConversionError as e:
        raise ConversionError(f"'{workdir}': {e}") from None
