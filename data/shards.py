"""The on-disk format of tokenized documents, shared by `data.preprocess` (writer) and
`data.pipeline` (reader).

A preprocessed directory holds:

    train-00000-of-00008.tfrecord ...   documents for training (one tf.train.Example each;
                                        a random sample of the corpus in a random order)
    eval-00000-of-00001.tfrecord        held-out documents
    tokenizer/                          the tokenizer that made the ids
    manifest.json                       written last: its presence means the shards are complete;
                                        also holds the train split's unigram_counts (tokens per
                                        id: span masking's random replacements draw from them)

Each record has the features
    token_ids         int64 list   all tokens of the document, sentences concatenated
    sentence_lengths  int64 list   tokens per sentence (all > 0)
    doc_id            int64        position of the document in the corpus (unique)
    word_continues    int64 list   with --word_segmenter only: positions in token_ids of the
                                   tokens that continue a segmented word (data/word_segmentation.py);
                                   the manifest's `word_segmenter` names the segmenter
(parsed back by `data.instances.parse_document`).

`load_manifest` is the one reader of manifest.json: every stage (pipeline, trainer,
demo, ablation runner, continued pretraining) takes the `Manifest` it returns.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from core.errors import UserError
from data import masking

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TOKENIZER_DIR = "tokenizer"
WORD_CONTINUES = "word_continues"  # the record feature
WORD_SEGMENTER = "word_segmenter"  # the manifest field: the segmenter's identity


class ShardsError(UserError):
    """A user-facing problem with a preprocessed directory (one line)."""


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


def encode_document(
    doc_id: int, sentences: Sequence[Sequence[int]], word_continues: Sequence[int] = ()
) -> bytes:
    """One document record: sentences are lists of token ids (each non-empty); word_continues
    the positions of the tokens that continue a word (written only when there are some)."""
    feature = {
        "token_ids": tf.train.Feature(
            int64_list=tf.train.Int64List(value=itertools.chain.from_iterable(sentences))
        ),
        "sentence_lengths": tf.train.Feature(
            int64_list=tf.train.Int64List(value=[len(s) for s in sentences])
        ),
        "doc_id": tf.train.Feature(int64_list=tf.train.Int64List(value=[doc_id])),
    }
    if word_continues:
        feature[WORD_CONTINUES] = tf.train.Feature(int64_list=tf.train.Int64List(value=word_continues))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)


@dataclasses.dataclass(frozen=True)
class Vocab:
    """The token ids the pipeline and objectives need, from the manifest.

    pair_format: "bert", "roberta" or "xlnet" when the manifest names it (a top-level
    `pair_format`, or one in the tokenizer's identity), else None
    (PipelineConfig.pair_format or "bert" decides).
    random_exclude_ids: ids MLM's random replacement never draws, from the tokenizer's kind
    (`masking.random_exclude_ids`: RoBERTa's byte-level BPE excludes <s> <pad> </s> <unk>,
    as fairseq; BERT and ALBERT draw from the whole vocab).
    eod_id: the tokenizer's end-of-document token (XLNet's <eod>), or None.
    """

    size: int
    pad_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    pair_format: str | None = None
    random_exclude_ids: tuple[int, ...] = ()
    eod_id: int | None = None


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A preprocessed directory's manifest.json, read once (`load_manifest`).

    directory: the preprocessed directory. vocab_size: tokenizer entries. tokenizer: the
    tokenizer's identity() dict (its "kind", hashes ...). vocab: the special ids.
    splits: {"train" / "eval": {"files": [names], "documents", "sentences", "tokens", ...}}.
    fields: the whole JSON object (preprocess's fingerprint, counts, timing).
    """

    directory: str
    fields: dict[str, Any]

    @property
    def vocab_size(self) -> int:
        return self.fields["vocab_size"]

    @property
    def tokenizer(self) -> dict[str, Any]:
        return self.fields.get("tokenizer", {})

    @property
    def splits(self) -> dict[str, dict[str, Any]]:
        return self.fields["splits"]

    @property
    def vocab(self) -> Vocab:
        ids = self.fields["special_ids"]
        return Vocab(
            size=self.vocab_size,
            pad_id=ids["pad"],
            cls_id=ids["cls"],
            sep_id=ids["sep"],
            mask_id=ids["mask"],
            pair_format=self.fields.get("pair_format") or self.tokenizer.get("pair_format"),
            random_exclude_ids=masking.random_exclude_ids(self.tokenizer.get("kind"), ids),
            eod_id=ids.get("eod"),
        )

    @property
    def word_segmenter(self) -> dict[str, Any] | None:
        """The identity of the segmenter whose words the records list (`word_continues`), or
        None: shards made without --word_segmenter."""
        return self.fields.get(WORD_SEGMENTER)

    def unigram_counts(self) -> np.ndarray:
        """[vocab_size] int64: how often each id occurs in the train split."""
        counts = self.fields.get(UNIGRAM_COUNTS)
        if counts is None:
            raise ShardsError(
                f"the manifest of '{self.directory}' has no {UNIGRAM_COUNTS} (written before span "
                "masking existed): run data.preprocess again with the same arguments; it adds them "
                "without tokenizing again"
            )
        return np.asarray(counts, np.int64)

    def files(self, split: str) -> list[str]:
        """Full paths of the split's shard files, in manifest order."""
        return [os.path.join(self.directory, name) for name in self.splits[split]["files"]]


def load_manifest(directory: str) -> Manifest:
    """Reads DIR/manifest.json, with a clear error when preprocessing has not (fully) run."""
    path = os.path.join(directory, MANIFEST)
    if not tf.io.gfile.exists(path):
        raise ShardsError(
            f"no {MANIFEST} in '{directory}': run `python -m data.preprocess --output={directory} ...` "
            "first (an interrupted run leaves no manifest; run it again)"
        )
    try:
        with tf.io.gfile.GFile(path) as f:
            fields = json.load(f)
    except json.JSONDecodeError as e:
        raise ShardsError(
            f"{path} is not valid JSON ({e}): re-run data.preprocess with --overwrite"
        ) from None
    if fields.get("format_version") != FORMAT_VERSION:
        raise ShardsError(
            f"{path} has format version {fields.get('format_version')}, this code reads "
            f"{FORMAT_VERSION}: re-run data.preprocess with --overwrite"
        )
    return Manifest(directory, fields)


def count_unigrams(files: Sequence[str], vocab_size: int) -> list[int]:
    """[vocab_size] counts of the token ids in these shard files (one read of them): for
    shards written before `data.preprocess` counted them as it wrote."""

    def counts(record):
        ids = tf.io.parse_single_example(record, {"token_ids": tf.io.VarLenFeature(tf.int64)})["token_ids"]
        return tf.math.bincount(ids.values, minlength=vocab_size, maxlength=vocab_size, dtype=tf.int64)

    ds = tf.data.TFRecordDataset(list(files), num_parallel_reads=tf.data.AUTOTUNE)
    ds = ds.map(counts, num_parallel_calls=tf.data.AUTOTUNE)
    total = ds.reduce(tf.zeros([vocab_size], tf.int64), lambda acc, c: acc + c)
    return [int(c) for c in total.numpy()]


UNIGRAM_COUNTS = "unigram_counts"


def write_manifest(directory: str, manifest: dict) -> None:
    """Writes the manifest atomically (temporary file, then rename); the unigram counts on
    one line, so that the file stays readable."""
    path = os.path.join(directory, MANIFEST)
    fields = dict(manifest)
    counts = fields.pop(UNIGRAM_COUNTS, None)
    text = json.dumps(fields, indent=2)
    if counts is not None:
        text = text[: text.rindex("}")].rstrip() + f',\n  "{UNIGRAM_COUNTS}": {json.dumps(counts)}\n}}'
    with tf.io.gfile.GFile(path + ".tmp", "w") as f:
        f.write(text)
    tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
