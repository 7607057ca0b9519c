"""What the interop tests share: small transformers models with every parameter random, their
folders (with a WordPiece vocab), fixed inputs, and our outputs and theirs on them."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import torch  # requirements-test.txt: the reference implementation, CPU
import transformers

from interop import bundle, encode
from models.pretraining import BertPretrainingModel
from tests import jitted

WORDS = ["paris", "is", "the", "capital", "of", "france", ".", "berlin", "germany", "##s", "a", "city"]


def vocab(size: int) -> list[str]:
    specials = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    return specials + WORDS + [f"w{i}" for i in range(size - len(specials) - len(WORDS))]


# The interop tests' model size in transformers' config keys: V 64, H 32, N 4, 2 layers,
# 40 positions.
SIZE = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=40,
)


def bert_config(**overrides) -> transformers.BertConfig:
    return transformers.BertConfig(**{**SIZE, "type_vocab_size": 2, **overrides})


def randomize(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter random (HF initialises biases to 0 and LayerNorm to 1, which would hide
    a swapped or transposed bias)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(1.0 + 0.1 * noise if "LayerNorm.weight" in name else 0.2 * noise)
    return model.eval()


def save_hf(model: torch.nn.Module, directory: str) -> str:
    model.save_pretrained(directory)
    with open(os.path.join(directory, "vocab.txt"), "w") as f:
        f.write("".join(t + "\n" for t in vocab(model.config.vocab_size)))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"do_lower_case": True}, f)
    return directory


def inputs() -> dict[str, np.ndarray]:
    """Two rows: a padded single sentence and a full-length pair."""
    ids = np.array([[3, 6, 7, 8, 20, 5, 4, 0, 0, 0], [3, 12, 13, 4, 14, 15, 16, 30, 40, 4]], np.int64)
    mask = (ids != 0).astype(np.int64)
    segments = np.array([[0] * 10, [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]], np.int64)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": segments}


def hf_outputs(model: torch.nn.Module, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Their last hidden state, pooled output (if there is a pooler), MLM and NSP/SOP logits (if heads)."""
    tensors = {k: torch.from_numpy(v) for k, v in inputs.items()}
    with torch.no_grad():
        base = getattr(model, model.base_model_prefix, model)
        encoded = base(**tensors)
        result = {"last_hidden_state": encoded.last_hidden_state.numpy()}
        if encoded.pooler_output is not None:
            result["pooled_output"] = encoded.pooler_output.numpy()
        if model is not base:
            out = model(**tensors)
            result["mlm_logits"] = (
                out.prediction_logits if hasattr(out, "prediction_logits") else out.logits
            ).numpy()
            for name in ("seq_relationship_logits", "sop_logits"):
                if hasattr(out, name):
                    result["sentence_logits"] = getattr(out, name).numpy()
    return result


def our_outputs(pretrained: bundle.Pretrained, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Our encoder outputs and, where the heads exist, MLM logits at every position and NSP logits."""
    batch = {k: v.astype(np.int32) for k, v in inputs.items()}
    out = encode.encode(pretrained, batch, batch_size=2)
    result = {k: out[k] for k in ("last_hidden_state", "pooled_output") if k in out}
    params = pretrained.params
    if "mlm_head" in params:
        sentence = "sentence_head" in params
        config = dataclasses.replace(pretrained.config, pooler=encode.has_pooler(params))
        model = BertPretrainingModel(config, sentence_head=sentence)
        length = batch["input_ids"].shape[1]
        logits = jitted.apply(
            model,
            {"params": params},
            {
                "input_ids": batch["input_ids"],
                "input_mask": batch["attention_mask"],
                "segment_ids": batch["token_type_ids"],
                "masked_lm_positions": np.tile(np.arange(length, dtype=np.int32), (2, 1)),
            },
            deterministic=True,
        )
        result["mlm_logits"] = np.asarray(logits["mlm_logits"])
        if sentence:
            result["sentence_logits"] = np.asarray(logits["sentence_logits"])
    return result


def max_diffs(ours: dict, theirs: dict, mask: np.ndarray | None = None) -> dict[str, float]:
    """Max abs difference per output; with `mask` [B, L], per-token outputs only at real tokens."""
    assert set(ours) == set(theirs), (sorted(ours), sorted(theirs))
    diffs = {}
    for key in sorted(ours):
        diff = np.abs(ours[key] - theirs[key])
        if mask is not None and diff.ndim == 3:
            diff = diff[mask.astype(bool)]
        diffs[key] = float(diff.max())
    return diffs


def encode_lines(workdir, tmp_path, text: str) -> dict[str, np.ndarray]:
    """`interop.encode` of `text` (one sentence or A<TAB>B per line): the npz's arrays."""
    lines = tmp_path / "lines.txt"
    lines.write_text(text)
    out = tmp_path / "features.npz"
    assert encode.main([f"--workdir={workdir}", f"--input={lines}", f"--output={out}"]) == 0
    return dict(np.load(out))
