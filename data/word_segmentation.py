"""Chinese words for whole-word masking, as Chinese-BERT-wwm finds them.

BERT's tokenizer makes every CJK ideograph a token of its own, so the vocabulary's "##"
rule (`Tokenizer.word_start_mask`) sees each Chinese character as a word and whole-word
masking on Chinese text would mask single characters. Chinese-BERT-wwm (Cui et al. 2021,
"Pre-Training with Whole Word Masking for Chinese BERT", arXiv 1906.08101; the
ymcui/Chinese-BERT-wwm README) segments the text into words with a word segmenter (LTP) and
masks every character of a chosen word together, while the tokens stay characters and the
loss stays one prediction per character.

Here the segmenter runs once, in `data.preprocess --word_segmenter=jieba`: each document
record then lists the positions of the tokens that continue a word (`word_continues`,
data/shards.py), and the pipeline's whole-word, n-gram and span masking treat such a token as
part of the word before it (data/masking.py).

Which tokens continue a word (`continuing_tokens`): a token that is one CJK ideograph and is
not the first character of a segmented word of two or more characters, all of them CJK
ideographs. That is the rule of transformers' reference for these models
(examples/research_projects/mlm_wwm/run_chinese_ref.py: it keeps the words "whose every
character is Chinese" and longer than one), with the word positions the segmenter gives
rather than its forward maximum matching against the line's word set: a word with a digit
or a Latin letter in it ("2019年", "GPT4") masks token by token, as there; Latin words keep
WordPiece's "##" rule.
"CJK ideograph" is google-research/bert tokenization.py's `_is_chinese_char` (the unified
ideographs, extensions A-E and the compatibility ideographs; not punctuation, kana or Hangul).

The segmenter: jieba's algorithm and dictionary (the most used offline Chinese segmenter,
fxsjy/jieba) through rjieba, the Rust port's Python binding (messense/rjieba over jieba-rs,
which transformers' RoFormer tokenizer uses): the same words as jieba, 10 to 18 times faster
(`python -m bench.word_segmenters`). Precise mode without the HMM for unknown words: on the
People's Daily 1998-01 gold segmentation its word F1 is higher without it (0.834 against
0.812) and it runs 1.7 times faster. HFL's LTP needs a model download; a run that wants LTP's
words can preprocess with its own segmenter behind the same interface (`SEGMENTERS`).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import rjieba

from core.errors import UserError


class SegmenterError(UserError):
    """A word segmenter that cannot be used as asked (one line)."""


# google-research/bert tokenization.py `_is_chinese_char`: the CJK Unified Ideographs block,
# extensions A to E and the compatibility ideographs (inclusive code point ranges).
_CJK_IDEOGRAPHS = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


def is_cjk_ideograph(char: str) -> bool:
    """Whether `char` (one character) is a CJK ideograph as BERT's tokenizer counts them."""
    code = ord(char)
    return any(low <= code <= high for low, high in _CJK_IDEOGRAPHS)


class Segmenter(Protocol):
    """A word segmenter: `identity()` (recorded in the shards' manifest and fingerprint, so
    that shards of another segmenter or version are never taken for these) and
    `words(text)`: the words as (start, end) character offsets covering `text` in order."""

    def identity(self) -> dict: ...

    def words(self, text: str) -> list[tuple[int, int]]: ...


class Jieba:
    """jieba's precise mode through rjieba, without the HMM (module docstring)."""

    def identity(self) -> dict:
        return {
            "name": "jieba",
            "library": "rjieba",
            "version": importlib.metadata.version("rjieba"),
            "hmm": False,
        }

    def words(self, text: str) -> list[tuple[int, int]]:
        return [(start, end) for _, start, end in rjieba.tokenize(text, hmm=False)]


SEGMENTERS = {"jieba": Jieba}


def segmenter(name: str) -> Segmenter:
    """The segmenter called `name` (a key of SEGMENTERS)."""
    if name not in SEGMENTERS:
        raise SegmenterError(f"unknown word segmenter {name!r}: choose one of {', '.join(SEGMENTERS)}")
    return SEGMENTERS[name]()


def inner_characters(text: str, words: Sequence[tuple[int, int]]) -> np.ndarray:
    """bool [len(text)]: the characters that continue a word: every character after the first
    of a word of two or more characters that are all CJK ideographs."""
    inner = np.zeros(len(text), bool)
    for start, end in words:
        if end - start > 1 and all(is_cjk_ideograph(c) for c in text[start:end]):
            inner[start + 1 : end] = True
    return inner


def continuing_tokens(text: str, offsets: Sequence[tuple[int, int]], inner: np.ndarray) -> list[int]:
    """Indices of the tokens that continue a word: a token of exactly one character (a CJK
    ideograph is always one token) whose character is inner (`inner_characters`).

    offsets: each token's (start, end) character offsets in `text`, as the `tokenizers`
    library gives them."""
    return [
        i
        for i, (start, end) in enumerate(offsets)
        if end - start == 1 and inner[start] and is_cjk_ideograph(text[start])
    ]


def cjk_token_share(tokens: Sequence[str], counts: np.ndarray) -> float:
    """The share of the counted tokens that are one CJK ideograph (a "##" prefix allowed).

    tokens: the vocabulary (id -> token); counts: [vocab_size] int64 tokens per id (the
    shards' unigram counts)."""
    total = int(counts.sum())
    if not total:
        return 0.0
    bare = [t.removeprefix("##") for t in tokens]
    cjk = np.array([len(t) == 1 and is_cjk_ideograph(t) for t in bare], bool)
    return float(counts[cjk].sum()) / total
