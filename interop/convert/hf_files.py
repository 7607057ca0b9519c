"""Reading a Hugging Face folder's files: config.json and every tensor, by current names.

Weights are read without torch: `model.safetensors` (or a sharded
`model.safetensors.index.json`) through safetensors' NumPy API; only a folder that has
nothing but `pytorch_model.bin` needs torch.
"""

from __future__ import annotations

import os
import re

import numpy as np

from interop.convert.format import read_json
from interop.convert.layout import ConversionError


def read_hf_weights(directory: str, where: str) -> dict[str, np.ndarray]:
    """Every tensor of an HF folder as NumPy: model.safetensors, a sharded safetensors index,
    or (needs torch) pytorch_model.bin."""
    from safetensors.numpy import load_file

    single = os.path.join(directory, "model.safetensors")
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(single):
        return _load_safetensors(load_file, single, where)
    if os.path.exists(index):
        files = sorted(set(read_json(index, where).get("weight_map", {}).values()))
        tensors = {}
        for name in files:
            tensors.update(_load_safetensors(load_file, os.path.join(directory, name), where))
        return tensors
    binary = os.path.join(directory, "pytorch_model.bin")
    if os.path.exists(binary):
        try:
            import torch
        except ImportError:
            raise ConversionError(
                f"{where}: has only pytorch_model.bin, which needs torch to read: pip install torch==2.13.0 "
                "(CPU is enough), or save the model as model.safetensors"
            ) from None
        state = torch.load(binary, map_location="cpu", weights_only=True)
        return {name: t.detach().float().numpy() for name, t in state.items()}
    raise ConversionError(
        f"{where}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin: "
        "pass a folder written by transformers' save_pretrained"
    )


def _load_safetensors(load_file, path: str, where: str) -> dict[str, np.ndarray]:
    try:
        return load_file(path)
    except Exception as e:  # safetensors raises its own SafetensorError for damaged files
        raise ConversionError(f"{where}: cannot read {os.path.basename(path)}: {e}") from None


def _legacy_hf_name(name: str) -> str:
    """Old HF BERT files call LayerNorm parameters gamma/beta."""
    name = re.sub(r"(LayerNorm|layer_norm)\.beta$", r"\1.bias", name)
    return re.sub(r"(LayerNorm|layer_norm)\.gamma$", r"\1.weight", name)


def read_hf_config(directory: str, where: str) -> dict:
    """config.json of an HF folder."""
    if not os.path.isdir(directory):
        raise ConversionError(f"{where}: not a directory")
    config_path = os.path.join(directory, "config.json")
    if not os.path.exists(config_path):
        raise ConversionError(
            f"{where}: no config.json: pass a folder written by transformers' save_pretrained"
        )
    return read_json(config_path, where)


def read_hf_tensors(directory: str, where: str) -> dict[str, np.ndarray]:
    """Every tensor of an HF folder by its current HF name."""
    return {_legacy_hf_name(k): v for k, v in read_hf_weights(directory, where).items()}
