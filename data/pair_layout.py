"""How one text or a pair of texts becomes a model input row: the one definition of each
pair layout, used by the tokenizers (fine-tuning, feature extraction: Python lists) and by
the tf.data instances (pretraining: tensors).

    "bert"     [CLS] A [SEP] B [SEP]      segment ids 0 for [CLS], A and the first [SEP];
                                          1 for B and the last [SEP]  (google-research/bert)
    "roberta"  <s> A </s></s> B </s>      segment ids all 0  (fairseq; RoBERTa has one
                                          token type)
    "xlnet"    A <sep> B <sep> <cls>      segment ids 0 for A and its <sep>, 1 for B and its
                                          <sep>, 2 for <cls>  (zihangdai/xlnet
                                          classifier_utils.py: the summary reads the last
                                          position)

A single text is `[CLS] A [SEP]` (`<s> A </s>`), segment ids all 0, in the first two layouts;
`A <sep> <cls>`, segment ids 0 0 2, in XLNet's, whose padded rows are padded on the left
(segment id 4) so that <cls> is always last (`PairLayout.placement`). Each tokenizer names its layout
(`Tokenizer.pair_format`); the layouts differ only in the number of separators between A
and B, B's segment id and where the classification token sits and with which segment id,
which is all the code below reads (no branch per name).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from core.errors import ConfigError

if TYPE_CHECKING:
    import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class PairLayout:
    """name; separators: [SEP]s between A and B; b_segment: segment id of B and its [SEP];
    cls_last: the classification token closes the row (XLNet) instead of opening it, with
    segment id cls_segment; and then a padded row is padded on the left, so that the token
    sits at the last position, with segment id pad_segment (XLNet's classifier_utils.py:
    SEG_ID_PAD = 4)."""

    name: str
    separators: int
    b_segment: int
    cls_last: bool = False
    cls_segment: int = 0
    pad_segment: int = 0

    def single_segments(self, tokens: int) -> list[int]:
        """The segment ids of a single-text row of `tokens` tokens (`ids(a, None)`'s)."""
        if self.cls_last:
            return [0] * (tokens - 1) + [self.cls_segment]
        return [self.cls_segment] + [0] * (tokens - 1)

    def placement(self, tokens: int, length: int) -> slice:
        """Where a row of `tokens` tokens sits in a padded row of `length`: at the start, or at
        the end when the classification token closes the row (left padding)."""
        return slice(length - tokens, length) if self.cls_last else slice(0, tokens)

    def num_specials(self, pair: bool = True) -> int:
        """Special tokens in a row: [CLS] and the closing [SEP], plus the separators of a pair."""
        return 2 + (self.separators if pair else 0)

    def ids(
        self, a: Sequence[int], b: Sequence[int] | None, *, cls_id: int, sep_id: int
    ) -> tuple[list[int], list[int]]:
        """(input ids, segment ids) of one row as Python lists; b None = a single text."""
        if b is None:
            ids = [*a, sep_id, cls_id] if self.cls_last else [cls_id, *a, sep_id]
            return ids, self.single_segments(len(ids))
        ids = [*a, *[sep_id] * self.separators, *b, sep_id]
        segments = [0] * (len(a) + self.separators) + [self.b_segment] * (len(b) + 1)
        if self.cls_last:
            return [*ids, cls_id], [*segments, self.cls_segment]
        return [cls_id, *ids], [self.cls_segment, *segments]

    def tensors(self, a: tf.Tensor, b: tf.Tensor, *, cls_id: int, sep_id: int) -> tuple[tf.Tensor, tf.Tensor]:
        """(input ids, segment ids) of a pair as [n] int32 tensors; a, b: [None] int32."""
        import tensorflow as tf  # here: the rest of this module is used without TensorFlow

        cls, sep = tf.constant([cls_id], tf.int32), tf.constant([sep_id], tf.int32)
        cls_segment = tf.constant([self.cls_segment], tf.int32)
        separators = tf.repeat(sep, self.separators)
        first = tf.zeros([tf.size(a) + self.separators], tf.int32)
        second = tf.fill([tf.size(b) + 1], tf.constant(self.b_segment, tf.int32))
        if self.cls_last:
            tokens = tf.concat([a, separators, b, sep, cls], axis=0)
            return tokens, tf.concat([first, second, cls_segment], axis=0)
        tokens = tf.concat([cls, a, separators, b, sep], axis=0)
        return tokens, tf.concat([cls_segment, first, second], axis=0)


LAYOUTS = {
    "bert": PairLayout("bert", separators=1, b_segment=1),
    "roberta": PairLayout("roberta", separators=2, b_segment=0),
    "xlnet": PairLayout("xlnet", separators=1, b_segment=1, cls_last=True, cls_segment=2, pad_segment=4),
}
NAMES = tuple(LAYOUTS)


def get(name: str) -> PairLayout:
    if name not in LAYOUTS:
        raise ConfigError(f"pair_format must be one of {NAMES}, got {name!r}")
    return LAYOUTS[name]
