"""Synthetic tokenized-document shards for tests and benchmarks (no tokenizer needed).

Token ids encode where they came from: token = 1000 + 100 * doc_id + sentence_index,
so a test can tell which document and sentence any token of an instance belongs to.
"""

import os

import numpy as np

from data import shards

VOCAB_SIZE = 1000 + 100 * 200
SPECIAL = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}


def token(doc_id: int, sentence: int) -> int:
    return 1000 + 100 * doc_id + sentence


def doc_and_sentence(token_id: int) -> tuple[int, int]:
    return (token_id - 1000) // 100, (token_id - 1000) % 100


def make_documents(
    num_docs: int, seed: int = 0, max_sentences: int = 12, max_len: int = 30, first_id: int = 0
):
    """Returns {doc_id: [sentence token lists]} with 2..max_sentences sentences each."""
    rng = np.random.default_rng(seed)
    docs = {}
    for d in range(first_id, first_id + num_docs):
        n = int(rng.integers(2, max_sentences + 1))
        docs[d] = [[token(d, s)] * int(rng.integers(1, max_len + 1)) for s in range(n)]
    return docs


def write_shards(directory: str, docs: dict, eval_docs: dict | None = None, num_shards: int = 4) -> str:
    """Writes docs like data.preprocess does (train shards, one eval shard, manifest)."""
    import tensorflow as tf

    os.makedirs(directory, exist_ok=True)
    splits = {"train": (docs, num_shards), "eval": (eval_docs or {}, 1)}
    manifest_splits = {}
    for split, (split_docs, n) in splits.items():
        names = [shards.shard_name(split, i, n) for i in range(n)]
        writers = [tf.io.TFRecordWriter(os.path.join(directory, name)) for name in names]
        for i, (doc_id, sentences) in enumerate(sorted(split_docs.items())):
            writers[i % n].write(shards.encode_document(doc_id, sentences))
        for w in writers:
            w.close()
        manifest_splits[split] = {"files": names, "documents": len(split_docs)}
    manifest = {
        "format_version": shards.FORMAT_VERSION,
        "vocab_size": VOCAB_SIZE,
        "special_ids": SPECIAL,
        "splits": manifest_splits,
        "tokenizer": {"kind": "synthetic"},
        shards.UNIGRAM_COUNTS: np.bincount(
            [t for sentences in docs.values() for sentence in sentences for t in sentence],
            minlength=VOCAB_SIZE,
        ).tolist(),
    }
    shards.write_manifest(directory, manifest)
    return directory
