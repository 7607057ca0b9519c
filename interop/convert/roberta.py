"""RoBERTa: HF model_type "roberta" (fairseq's RoBERTa has no TF1 checkpoints and no
sentence head); its tokenizer is byte-level BPE (vocab.json + merges.txt)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from data import tokenizers
from interop.convert.bert import EMBEDDINGS, LAYER
from interop.convert.format import ModelFormat
from interop.convert.layout import BIAS, DENSE, NORM, ConversionError, heads, rows
from models.encoder import EncoderConfig


def read_bpe_files(directory: str, where: str, family: str, bpe: type) -> tokenizers.Tokenizer:
    """A folder's vocab.json + merges.txt as the byte-level BPE tokenizer class `bpe`."""
    vocab, merges = (
        os.path.join(directory, n) for n in (tokenizers.BPE_VOCAB_FILE, tokenizers.BPE_MERGES_FILE)
    )
    if not (os.path.exists(vocab) and os.path.exists(merges)):
        raise ConversionError(f"{where}: no vocab.json + merges.txt: a {family} folder needs its BPE files")
    return bpe.from_files(vocab, merges)


def has_bpe_files(directory: str) -> bool:
    """Whether a folder has vocab.json or merges.txt (`read_bpe_files` wants both)."""
    return any(
        os.path.exists(os.path.join(directory, n))
        for n in (tokenizers.BPE_VOCAB_FILE, tokenizers.BPE_MERGES_FILE)
    )


@dataclasses.dataclass(frozen=True)
class RobertaFormat(ModelFormat):
    tokenizer_class: type = tokenizers.ByteLevelBPETokenizer

    def describes(self, config: EncoderConfig) -> bool:
        return config.sharing == "none" and not config.factorized_embedding and config.position_offset > 0

    def hf_options(self, hf: Mapping[str, Any], where: str) -> dict[str, Any]:
        # HF (as fairseq) numbers positions from padding_idx + 1 (create_position_ids_from_input_ids).
        return {"position_offset": hf.get("pad_token_id", 1) + 1}

    def imported_config(self, config: EncoderConfig, groups: Sequence[str]) -> EncoderConfig:
        # The family's fine-tuning head (fairseq's RobertaClassificationHead); a pooler only
        # when the folder has one (RobertaModel does, RobertaForMaskedLM not).
        return dataclasses.replace(config, pooler="pooler" in groups, classifier_head="roberta")

    def has_tokenizer_files(self, directory: str) -> bool:
        return has_bpe_files(directory)

    def read_tokenizer(self, directory: str, settings: Mapping[str, Any], where: str) -> tokenizers.Tokenizer:
        return read_bpe_files(directory, where, "RoBERTa", self.tokenizer_class)

    def check_export(self, config: EncoderConfig, groups: set[str], pad_id: int) -> None:
        if config.position_offset != pad_id + 1:
            raise ConversionError(
                f"position_offset={config.position_offset} but HF RoBERTa numbers positions from "
                f"pad id + 1 = {pad_id + 1}: the model cannot be expressed in transformers"
            )


ROBERTA = RobertaFormat(
    model_type="roberta",
    hf_base="roberta.",
    table=(
        *rows("encoder", "encoder/embeddings/", "{base}embeddings.", None, EMBEDDINGS),
        *rows("encoder", "encoder/layer_{i}/", "{base}encoder.layer.{i}.", None, LAYER),
        *heads(
            ("pooler", "encoder/pooler", DENSE, "{base}pooler.dense", None),
            ("mlm_head", "mlm_head/transform", DENSE, "lm_head.dense", None),
            ("mlm_head", "mlm_head/transform_layer_norm", NORM, "lm_head.layer_norm", None),
            ("mlm_head", "mlm_head/output_bias", BIAS, "lm_head.bias", None),
        ),
    ),
    hf_tied={
        "lm_head.decoder.weight": "{base}embeddings.word_embeddings.weight",
        "lm_head.decoder.bias": "lm_head.bias",
    },
    hf_classes={"sentence_head": None, "mlm_head": "RobertaForMaskedLM", None: "RobertaModel"},
    layout="roberta the same with a position offset",
)
