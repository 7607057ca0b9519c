"""XLNet: HF model_type "xlnet" (XLNetLMHeadModel, XLNetModel); models/xlnet.py,
`EncoderConfig.xlnet` from config.json's keys (zihangdai/xlnet has TF1 checkpoints, which
this converter does not read).

transformers keeps XLNet's arrays as the original does: q/k/v/r [d_model, n_head, d_head],
the output o [d_model, n_head, d_head] (ours [N, D, H]), r_w/r_r/r_s_bias [n_head, d_head]
per layer (untie_r), seg_embed [2, n_head, d_head], and mask_emb [1, 1, d_model] in the
transformer (ours: `plm_head/mask_emb`, read only with the LM head's `lm_loss.bias`: an
XLNetModel's query-stream start is left out, as fine-tuning reads none). The LM decoder is
tied to the word table. config.json names its own keys (d_model, n_layer, n_head, d_inner,
ff_activation, dropout: one rate for everything); options our encoder does not have
(untie_r false, attn_type "uni", same_length) are refused. mem_len and reuse_len are
training settings (absent from the published configs: the recipe's are kept then). The
tokenizer is XLNet's spiece.model (`XLNetTokenizer`), cased unless tokenizer_config.json
says do_lower_case.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from data import tokenizers
from interop.convert.format import OUR_ACTIVATIONS_TO_HF, ModelFormat, tree_shapes
from interop.convert.layout import ARRAY, BIAS, DENSE, NORM, ROLLED, UNIT_AXES, ConversionError, Module, rows
from models import xlnet
from models.encoder import EncoderConfig
from models.xlnet_options import XLNetOptions

log = logging.getLogger("convert")

# A layer: ours under encoder/layer_{i}/, HF under {base}layer.{i}.
_LAYER = (
    ("attention/query/kernel", ARRAY, "rel_attn.q"),
    ("attention/key/kernel", ARRAY, "rel_attn.k"),
    ("attention/value/kernel", ARRAY, "rel_attn.v"),
    ("attention/relative/kernel", ARRAY, "rel_attn.r"),
    ("attention/output/kernel", ROLLED, "rel_attn.o"),
    ("attention/r_w", ARRAY, "rel_attn.r_w_bias"),
    ("attention/r_r", ARRAY, "rel_attn.r_r_bias"),
    ("attention/r_s", ARRAY, "rel_attn.r_s_bias"),
    ("attention/seg_embed", ARRAY, "rel_attn.seg_embed"),
    ("attention_layer_norm", NORM, "rel_attn.layer_norm"),
    ("intermediate", DENSE, "ff.layer_1"),
    ("output", DENSE, "ff.layer_2"),
    ("output_layer_norm", NORM, "ff.layer_norm"),
)
_MASK_EMB = "{base}mask_emb"
_LM_BIAS = "lm_loss.bias"
# config.json keys whose other values our encoder cannot reproduce: key -> (wanted, why).
_REFUSED = {
    "untie_r": (True, "our encoder has per-layer relative biases (untie_r), as every published XLNet"),
    "attn_type": ("bi", "XLNet's bidirectional attention is the one this encoder has"),
    "same_length": (False, "every query attends to the whole memory and row here"),
    "tie_word_embeddings": (True, "our LM decoder is tied to the word embeddings"),
}


@dataclasses.dataclass(frozen=True)
class XLNetFormat(ModelFormat):
    tokenizer_class: type = tokenizers.XLNetTokenizer

    def describes(self, config: EncoderConfig) -> bool:
        return config.xlnet is not None

    def hf_refusals(self, hf: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
        return _REFUSED

    def config_from_hf(self, hf: Mapping[str, Any], where: str) -> EncoderConfig:
        act = self.checked_activation(hf, "ff_activation", where)
        try:
            d_model, n_head = hf["d_model"], hf["n_head"]
            d_head = hf.get("d_head", d_model / n_head)
            if d_head * n_head != d_model:
                raise ConversionError(
                    f"{where}: config.json d_head={d_head} x n_head={n_head} is not d_model={d_model}: "
                    "our heads split the model width"
                )
            defaults = XLNetOptions()
            options = XLNetOptions(
                mem_len=defaults.mem_len if hf.get("mem_len") is None else hf["mem_len"],
                reuse_len=defaults.reuse_len if hf.get("reuse_len") is None else hf["reuse_len"],
                clamp_len=hf.get("clamp_len", -1),
            )
            return EncoderConfig(
                vocab_size=hf["vocab_size"],
                hidden_size=d_model,
                num_layers=hf["n_layer"],
                num_heads=n_head,
                intermediate_size=hf["d_inner"],
                type_vocab_size=0,
                dropout_rate=hf.get("dropout", 0.1),
                attention_dropout_rate=hf.get("dropout", 0.1),
                hidden_act=act,
                initializer_range=hf.get("initializer_range", 0.02),
                layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
                pooler=False,
                classifier_head="xlnet",
                xlnet=options,
            )
        except KeyError as e:
            raise ConversionError(f"{where}: config.json has no {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ConversionError(f"{where}: config.json: {e}") from None

    def our_shapes(self, config: EncoderConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
        return tree_shapes(xlnet.abstract_params(config))

    def params_from_hf(
        self, config: EncoderConfig, tensors: Mapping[str, np.ndarray], where: str
    ) -> tuple[dict[str, Any], list[str]]:
        base = self.hf_base if any(k.startswith(self.hf_base) for k in tensors) else ""
        mask_emb = _MASK_EMB.format(base=base)
        if _LM_BIAS not in tensors and mask_emb in tensors:
            log.info("%s: no LM head (%s): its query-stream start %s is left out", where, _LM_BIAS, mask_emb)
            tensors = {k: v for k, v in tensors.items() if k != mask_emb}
        return super().params_from_hf(config, tensors, where)

    def has_tokenizer_files(self, directory: str) -> bool:
        return os.path.exists(os.path.join(directory, tokenizers.SP_MODEL_FILE))

    def read_tokenizer(self, directory: str, settings: Mapping[str, Any], where: str) -> tokenizers.Tokenizer:
        path = os.path.join(directory, tokenizers.SP_MODEL_FILE)
        if not os.path.exists(path):
            raise ConversionError(
                f"{where}: no {tokenizers.SP_MODEL_FILE}: an XLNet folder needs its SentencePiece model"
            )
        return tokenizers.XLNetTokenizer.from_model_file(path, lowercase=settings.get("do_lower_case", False))

    def hf_config(self, config: EncoderConfig, groups: set[str], pad_id: int) -> dict[str, Any]:
        """XLNet's own config.json keys (transformers' XLNetConfig)."""
        if config.attention_dropout_rate != config.dropout_rate:
            log.warning(
                "transformers' XLNet has one dropout rate: config.json's dropout is the hidden rate %g "
                "(the attention's %g is not written)",
                config.dropout_rate,
                config.attention_dropout_rate,
            )
        opts = config.xlnet
        return {
            "architectures": [self.hf_architecture(groups)],
            "model_type": self.model_type,
            "vocab_size": config.vocab_size,
            "d_model": config.hidden_size,
            "n_layer": config.num_layers,
            "n_head": config.num_heads,
            "d_head": config.hidden_size // config.num_heads,
            "d_inner": config.intermediate_size,
            "ff_activation": OUR_ACTIVATIONS_TO_HF[config.hidden_act],
            "untie_r": True,
            "attn_type": "bi",
            "initializer_range": config.initializer_range,
            "layer_norm_eps": config.layer_norm_eps,
            "dropout": config.dropout_rate,
            "mem_len": opts.mem_len,
            "reuse_len": opts.reuse_len,
            "clamp_len": opts.clamp_len,
            "bi_data": False,
            "same_length": False,
            "summary_type": "last",
            "summary_use_proj": True,
            "summary_activation": "tanh",
            "summary_last_dropout": 0.1,
            "pad_token_id": pad_id,
            "tie_word_embeddings": True,
        }


XLNET = XLNetFormat(
    model_type="xlnet",
    hf_base="transformer.",
    table=(
        Module("encoder", "encoder/word_embeddings", ARRAY, "{base}word_embedding.weight", None),
        *rows("encoder", "encoder/layer_{i}/", "{base}layer.{i}.", None, _LAYER),
        Module("plm_head", "plm_head/mask_emb", UNIT_AXES, _MASK_EMB, None),
        Module("plm_head", "plm_head/output_bias", BIAS, _LM_BIAS, None),
    ),
    hf_tied={"lm_loss.weight": "{base}word_embedding.weight"},
    hf_classes={"plm_head": "XLNetLMHeadModel", None: "XLNetModel"},
    layout="xlnet with EncoderConfig.xlnet set",
)
