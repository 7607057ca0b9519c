"""XLNet's SentencePiece tokenizer (kind "xlnet_spm"): zihangdai/xlnet `prepro_utils.py`
with the published spiece.model of xlnet-{base,large}-cased.

Text is prepared and cut as ALBERT's (`preprocess_text`: whitespace collapsed, `` and ''
as ", accents stripped; `encode_pieces`: a piece ending in digit + "," is split), which
ALBERT took from XLNet; but the published models are cased. The special pieces and their ids
are those of the original's spm_train flags (its README): <unk>=0 <s>=1 </s>=2, control
symbols <cls>=3 <sep>=4 <pad>=5 <mask>=6 <eod>=7, and the user symbol <eop>=8. A pair is
`A <sep> B <sep> <cls>` (data/pair_layout.py "xlnet"); documents in the pretraining stream
end with <eod> (`eod_id`).

Files: spiece.model and tokenizer_config.json {"kind": "xlnet_spm", "lowercase"}. A published
spiece.model loads directly (data/tokenizers/loader.py tells it from ALBERT's by its <eod>).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from data.tokenizers import base
from data.tokenizers.sentencepiece import SPIECE_UNDERLINE, SentencePieceTokenizer

XLNET_CONTROL_SYMBOLS = ("<cls>", "<sep>", "<pad>", "<mask>", "<eod>")
# The original README's --user_defined_symbols, in order (ids 8 ... 16 in the published model).
XLNET_USER_SYMBOLS = ("<eop>", ".", "(", ")", '"', "-", "\u2013", "\u00a3", "\u20ac")
XLNET_EOD = "<eod>"
# zihangdai/xlnet data_utils.py `_is_start_piece`: its `special_pieces` (ASCII punctuation
# without "'", where the original's string has a second '"').
_XLNET_SPECIAL_PIECES = frozenset('!"#$%&"()*+,-./:;?@[\\]^_`{|}~')


def is_xlnet_start_piece(piece: str) -> bool:
    """XLNet's `_is_start_piece`, exactly: a piece starting with "▁" or "<", or a lone ASCII
    punctuation piece (not "'"). Unlike ALBERT's rule, digits and non-Latin letters without "▁" continue
    the word before them ("▁19" "87" is one word)."""
    return piece.startswith((SPIECE_UNDERLINE, "<")) or piece in _XLNET_SPECIAL_PIECES


class XLNetTokenizer(SentencePieceTokenizer):
    """XLNet's tokenizer (see the module docstring). Implements `Tokenizer` with `pair_format`
    "xlnet" and `eod_id`."""

    pair_format = "xlnet"
    _SPECIAL_TOKENS = ("<pad>", "<unk>", "<cls>", "<sep>", "<mask>")
    _EOD_TOKEN = XLNET_EOD
    _KIND = "xlnet_spm"
    _HF_CLASS = "XLNetTokenizer"
    _REQUIRED_PIECES = ("<unk>", "<s>", "</s>", *XLNET_CONTROL_SYMBOLS, "<eop>")
    _FAMILY = "XLNet"
    _DEFAULT_LOWERCASE = False  # xlnet-{base,large}-cased
    # transformers' XLNetTokenizer options this tokenizer fixes to the original's values.
    HF_FIXED_SETTINGS = {"remove_space": True, "keep_accents": False}

    @classmethod
    def word_starts(cls, tokens: Sequence[str], specials: Collection[str]) -> np.ndarray:
        """bool [len(tokens)]: `is_xlnet_start_piece` of every piece (the specials start with
        "<", so they start words too), the rule XLNet's n-gram targets start on."""
        return np.array([is_xlnet_start_piece(t) or t in specials for t in tokens], dtype=bool)

    def hf_settings(self) -> dict:
        """transformers' XLNetTokenizer with this tokenizer's casing and `HF_FIXED_SETTINGS`."""
        return {"tokenizer_class": self._HF_CLASS, "do_lower_case": self._lowercase, **self.HF_FIXED_SETTINGS}


base.register_backend(XLNetTokenizer)
