"""MacBERT's similar words: a table of words and a word like each, and the lookup that masking
uses to put the similar word where BERT puts [MASK] ("MLM as correction", Cui et al. 2020,
arXiv 2004.13922, section 3).

MacBERT took its similar words from the Synonyms toolkit (word2vec similarity; it downloads
its vectors, so it is not shipped here). A table is a UTF-8 text file, one word per line,
then the words like it, best first, separated by whitespace:

    语言  言语  语文
    预测  预见  预估

As in every example the paper gives (语言模型 -> 语法建模, 预测 -> 预见), a word is replaced by
one of the same length in tokens: `load` keeps, for each word, the first similar word that
the shards' tokenizer makes into as many tokens, none of them [UNK], and drops a word that
has none.

The table becomes constants (no lookup-table resource, so the pipeline's iterator state
saves and restores as before): the words' 62-bit hashes of their token ids, sorted, and the
similar words' ids in the same order.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from core.errors import UserError

_BUCKETS = 2**62  # hash range: a collision between two words of one table is out of reach


class SimilarWordsError(UserError):
    """A similar-word table that cannot be read (one line)."""


@dataclasses.dataclass(frozen=True)
class SimilarWords:
    """hashes: [N] int64, sorted, of each word's ids as text ("12 7 40"); similar: [N, None] int32 ragged,
    the ids of its similar word (as many as the word's). `size`: N."""

    hashes: tf.Tensor
    similar: tf.RaggedTensor

    @property
    def size(self) -> int:
        return int(self.hashes.shape[0])


def _hash(keys: tf.Tensor) -> tf.Tensor:
    return tf.strings.to_hash_bucket_fast(keys, _BUCKETS)


def load(path: str, tokenizer) -> SimilarWords:
    """The table at `path` for the shards' `tokenizer` (module docstring)."""
    if not tf.io.gfile.exists(path):
        raise SimilarWordsError(
            f"similar-word table '{path}' not found: PipelineConfig.similar_words names a file"
        )
    with tf.io.gfile.GFile(path, "rb") as f:
        content = f.read()
    try:
        lines = content.decode("utf-8-sig").splitlines()  # a byte-order mark is not a word
    except UnicodeDecodeError as e:
        raise SimilarWordsError(f"{path}: not UTF-8 (byte offset {e.start}): a table is UTF-8 text") from None
    # A similar word with a character the vocabulary lacks ([UNK]) or a special token is no word.
    unusable = {tokenizer.unk_id, *tokenizer.special_ids}
    pairs: dict[str, list[int]] = {}
    for line in lines:
        fields = line.split()
        if len(fields) < 2:
            continue
        word, others = fields[0], fields[1:]
        ids = tokenizer.encode(word)
        for other in others:
            similar = tokenizer.encode(other)
            if len(similar) == len(ids) and similar != ids and not unusable.intersection(similar):
                pairs.setdefault(" ".join(map(str, ids)), similar)
                break
    if not pairs:
        raise SimilarWordsError(
            f"{path}: no word has a similar word of as many tokens: each line is a word, then words like it"
        )
    keys = list(pairs)
    hashes = _hash(tf.constant(keys)).numpy()
    order = np.argsort(hashes, kind="stable")
    similar = tf.ragged.constant([pairs[keys[j]] for j in order], dtype=tf.int32, ragged_rank=1)
    return SimilarWords(tf.constant(hashes[order]), similar)


def similar_at(
    table: SimilarWords, input_ids: tf.Tensor, segment: tf.Tensor, num_words: tf.Tensor
) -> tf.Tensor:
    """[L] int32: at each token of a word, the token at its place in the word's similar word,
    and -1 where the word has none (and outside words).

    input_ids: [L] int32; segment: [L] int32, the word of each token and `num_words` for a
    token outside every word (data/masking.py `_words`)."""
    length = input_ids.shape[0]
    keys = tf.strings.unsorted_segment_join(
        tf.strings.as_string(input_ids), segment, num_words + 1, separator=" "
    )
    h = _hash(keys)  # [num_words + 1]; the last is the tokens outside words, never looked up
    i = tf.minimum(tf.searchsorted(table.hashes, h), table.size - 1)
    found = (tf.gather(table.hashes, i) == h) & (tf.range(num_words + 1) < num_words)
    rows = tf.gather(table.similar, i)
    position = tf.range(length)
    first = tf.math.unsorted_segment_min(position, segment, num_words + 1)
    offset = position - tf.gather(first, segment)
    ok = tf.gather(found, segment) & (offset < tf.cast(tf.gather(rows.row_lengths(), segment), tf.int32))
    flat = tf.concat([rows.flat_values, [-1]], 0)
    index = tf.where(
        ok, tf.cast(tf.gather(rows.row_starts(), segment), tf.int32) + offset, tf.shape(flat)[0] - 1
    )
    return tf.gather(flat, index)
