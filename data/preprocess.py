"""Corpus + tokenizer -> sharded TFRecord files of tokenized documents. Run once per corpus and vocab.

    python -m data.preprocess --corpus=demo --tokenizer=DIR --output=DIR [--num_shards=8]

Each record is one document, sentences kept (instances are made later, in tf.data,
so static vs dynamic masking, sequence length and the input format stay run options):

    token_ids         int64 list   all tokens of the document, sentences concatenated
    sentence_lengths  int64 list   tokens per sentence (all > 0)
    doc_id            int64        position of the document in the corpus (unique)

Documents go to `train-?????-of-?????.tfrecord`, or to `eval-?????-of-?????.tfrecord`
when `corpora.is_heldout` says so. Shard and order within the shard come from a seeded
hash of the document's text (`--shuffle_seed`): every shard is a random sample of the
corpus in random order, as the original shuffles all documents before making instances
(google-research/bert create_pretraining_data.py: `rng.shuffle(all_documents)`). Without
it a shard holds the corpus in order, and a pipeline reading a few shards at a time with
a bounded shuffle buffer sees one region of the corpus (one source) per batch. The tokenizer is
copied to `OUTPUT/tokenizer/` and `OUTPUT/manifest.json` (written last, so its presence
means the output is complete) records the tokenizer identity, vocab size, special ids,
counts and a fingerprint of the inputs. Re-running with the same inputs is a no-op.

Tokenization runs in `--num_workers` processes (with one, in this process); the reader
keeps at most a few batches in flight, so tokenizing needs little memory whatever the
corpus size. Documents are first written to `*.tfrecord.unsorted` files in corpus order,
each record prefixed with its order key; then each shard is read back, sorted by key and
written. Sorting holds one shard per worker in memory: about (tokenized corpus size) x
num_workers / num_shards, so a large corpus wants many shards (the pod examples use 256)
or fewer workers. The `*.unsorted` files are removed when preprocessing fails or is
interrupted. The output depends only on the inputs and options, never on --num_workers.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import multiprocessing
import os
import struct
import sys
import time
from typing import Iterator, Sequence

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

import numpy as np
import tensorflow as tf

from core import cli
from core.errors import UserError
from data import corpora, shards, tokenizers

_BATCH_DOCUMENTS = 64
_UNSORTED = ".unsorted"
# A record of an unsorted shard: big-endian (order key, doc_id), then the document record.
# Sorting records as bytes sorts by (key, doc_id): duplicate texts keep corpus order.
_KEY = struct.Struct(">QQ")


class PreprocessError(UserError):
    """A user-facing problem with the inputs of preprocessing (one line)."""


class OtherShardsError(PreprocessError):
    """--output holds complete shards made from other inputs or options."""


@dataclasses.dataclass
class SplitStats:
    documents: int = 0
    sentences: int = 0
    tokens: int = 0
    single_sentence_documents: int = 0


def _fingerprint(corpus: str, tokenizer_identity: dict, flags: dict) -> str:
    """Hash of everything the output depends on: corpus files (path, size, mtime), tokenizer, options."""
    parts = [
        f"v{shards.FORMAT_VERSION}",
        corpus,
        json.dumps(tokenizer_identity, sort_keys=True),
        json.dumps(flags, sort_keys=True),
    ]
    if corpus != "demo" and not corpus.startswith("tfds:"):
        for pattern in corpus.split(","):
            for path in sorted(tf.io.gfile.glob(pattern.strip())):
                stat = tf.io.gfile.stat(path)
                parts.append(f"{path}:{stat.length}:{stat.mtime_nsec}")
    else:
        parts.append(sys.version)  # the demo corpus comes from this Python's documentation
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


_worker_tokenizer = None


def _init_worker(tokenizer_path: str) -> None:
    global _worker_tokenizer
    _worker_tokenizer = tokenizers.load_tokenizer(tokenizer_path)


def _tokenize_batch(batch: Sequence[tuple[int, list[str]]]) -> list[tuple[int, list[list[int]], int]]:
    """Tokenizes documents in a worker. Returns (doc_id, sentences' ids, empty sentences dropped)."""
    # encode_documents, not each sentence alone: byte-level BPE gives a sentence after the
    # first its joining space ("ĠThe"), as fairseq encodes whole lines.
    encoded = _worker_tokenizer.encode_documents([sentences for _, sentences in batch])
    out = []
    for (doc_id, _), ids in zip(batch, encoded):
        kept = [s for s in ids if s]
        out.append((doc_id, kept, len(ids) - len(kept)))
    return out


def order_key(doc: corpora.Document, shuffle_seed: int) -> tuple[int, int]:
    """(shard key, order key): two 64-bit ints from the sha256 of the seed and the text.

    A pure function of the document, so shard and position do not depend on the corpus
    order, the batching or the number of workers; the shard is `shard key % num_shards`.
    """
    text = f"{shuffle_seed}\n" + "\n".join(doc.sentences)
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big"), int.from_bytes(digest[8:16], "big")


def _document_batches(
    corpus: str, eval_fraction: float, shuffle_seed: int, corpus_kwargs: dict
) -> Iterator[tuple[list[tuple[int, list[str]]], list[bool], list[str], list[tuple[int, int]]]]:
    """Batches of (doc_id, sentences) with per-document held-out flag, source and order_key."""
    batch, heldout, sources, keys = [], [], [], []
    for doc_id, doc in enumerate(corpora.iter_documents(corpus, **corpus_kwargs)):
        batch.append((doc_id, list(doc.sentences)))
        heldout.append(corpora.is_heldout(doc, eval_fraction))
        sources.append(doc.source)
        keys.append(order_key(doc, shuffle_seed))
        if len(batch) == _BATCH_DOCUMENTS:
            yield batch, heldout, sources, keys
            batch, heldout, sources, keys = [], [], [], []
    if batch:
        yield batch, heldout, sources, keys


def _sort_shard(path: str) -> str:
    """Rewrites PATH.unsorted as PATH: its documents sorted by order key, prefixes removed.

    Holds one shard in memory (the records as bytes). Returns PATH.
    """
    unsorted = path + _UNSORTED
    records = list(tf.data.TFRecordDataset(unsorted).as_numpy_iterator())
    records.sort(key=lambda record: record[: _KEY.size])
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record[_KEY.size :])
    tf.io.gfile.remove(unsorted)
    return path


def _tokenize_and_sort(batches, all_paths, num_workers, tokenizer_path, write, close_writers) -> None:
    """Tokenizes the corpus batches into the `*.unsorted` writers (`write`), closes them and
    sorts every shard."""
    if num_workers == 1:  # one worker: this process (a worker process would only add its start-up)
        _init_worker(tokenizer_path)
        for batch, heldout, sources, keys in batches:
            write(_tokenize_batch(batch), heldout, sources, keys)
        close_writers()
        for path in all_paths:
            _sort_shard(path)
        return
    with multiprocessing.get_context("spawn").Pool(
        num_workers, initializer=_init_worker, initargs=(tokenizer_path,)
    ) as pool:
        in_flight = collections.deque()
        for batch, heldout, sources, keys in batches:
            in_flight.append((pool.apply_async(_tokenize_batch, (batch,)), heldout, sources, keys))
            if len(in_flight) >= 2 * num_workers:  # bounded memory: wait for the oldest batch
                result, *meta = in_flight.popleft()
                write(result.get(), *meta)
        while in_flight:
            result, *meta = in_flight.popleft()
            write(result.get(), *meta)
        close_writers()
        pool.map(_sort_shard, all_paths, chunksize=1)  # one shard in memory per worker


def preprocess(
    corpus: str,
    tokenizer_path: str,
    output: str,
    *,
    num_shards: int = 8,
    num_eval_shards: int = 1,
    eval_fraction: float = 0.02,
    num_workers: int | None = None,
    max_single_sentence_fraction: float = 0.5,
    shuffle_seed: int = 0,
    overwrite: bool = False,
    corpus_kwargs: dict | None = None,
    log=print,
) -> shards.Manifest:
    """Writes the shards and the manifest; returns the manifest. See the module docstring."""
    corpus_kwargs = corpus_kwargs or {}
    tokenizer = tokenizers.load_tokenizer(tokenizer_path)
    options = dict(
        num_shards=num_shards,
        num_eval_shards=num_eval_shards,
        eval_fraction=eval_fraction,
        order=f"sha256-sorted:{shuffle_seed}",  # shards written in corpus order need --overwrite
        **{k: str(v) for k, v in corpus_kwargs.items()},
    )
    fingerprint = _fingerprint(corpus, tokenizer.identity(), options)
    manifest_path = os.path.join(output, shards.MANIFEST)
    if tf.io.gfile.exists(manifest_path):
        existing = shards.load_manifest(output)
        if existing.fields.get("fingerprint") == fingerprint:
            documents = existing.splits["train"]["documents"]
            if shards.UNIGRAM_COUNTS not in existing.fields:  # shards from before span masking
                fields = dict(existing.fields)
                fields[shards.UNIGRAM_COUNTS] = shards.count_unigrams(
                    existing.files("train"), existing.vocab_size
                )
                shards.write_manifest(output, fields)
                log(f"{output}: added the train split's unigram counts to the manifest")
                return shards.Manifest(output, fields)
            log(f"{output} is up to date ({documents} train documents); nothing to do")
            return existing
        if not overwrite:
            raise OtherShardsError(
                f"'{output}' already holds shards of another corpus, tokenizer or options: "
                "pass --overwrite to replace them, or choose another --output"
            )
        tf.io.gfile.remove(manifest_path)
    tf.io.gfile.makedirs(output)

    start = time.time()
    counts = {"train": num_shards, "eval": num_eval_shards}
    paths = {
        split: [os.path.join(output, shards.shard_name(split, i, n)) for i in range(n)]
        for split, n in counts.items()
    }
    writers = {split: [tf.io.TFRecordWriter(path + _UNSORTED) for path in paths[split]] for split in counts}
    stats = {split: SplitStats() for split in counts}
    per_shard = {split: [0] * n for split, n in counts.items()}
    first_single = None
    dropped_sentences = 0
    dropped_documents = 0
    unigrams = np.zeros(tokenizer.vocab_size, np.int64)  # train tokens per id, for span masking
    num_workers = num_workers or max(1, min(os.cpu_count() or 1, 8))

    def write(results, heldout, sources, keys):
        nonlocal first_single, dropped_sentences, dropped_documents, unigrams
        train_ids = []
        for (doc_id, sentences, dropped), is_eval, source, (shard_key, order) in zip(
            results, heldout, sources, keys
        ):
            dropped_sentences += dropped
            if not sentences:
                dropped_documents += 1
                continue
            split = "eval" if is_eval else "train"
            s = stats[split]
            s.documents += 1
            s.sentences += len(sentences)
            s.tokens += sum(len(x) for x in sentences)
            if len(sentences) == 1:
                s.single_sentence_documents += 1
                first_single = first_single or source
            prefix = _KEY.pack(order, doc_id)
            shard = shard_key % counts[split]
            per_shard[split][shard] += 1
            writers[split][shard].write(prefix + shards.encode_document(doc_id, sentences))
            if split == "train":
                train_ids.extend(t for sentence in sentences for t in sentence)
        # One bincount per batch of documents: a [vocab] array per document would cost more.
        unigrams += np.bincount(np.asarray(train_ids, np.int64), minlength=tokenizer.vocab_size)

    def close_writers():
        for split_writers in writers.values():
            for w in split_writers:
                w.close()

    batches = _document_batches(corpus, eval_fraction, shuffle_seed, corpus_kwargs)
    all_paths = [path for split in counts for path in paths[split]]
    try:
        _tokenize_and_sort(batches, all_paths, num_workers, tokenizer_path, write, close_writers)
    except BaseException:
        # A bad input line, Ctrl-C or a failed sort: leave no unsorted copy of the corpus.
        close_writers()
        for path in all_paths:
            if tf.io.gfile.exists(path + _UNSORTED):
                tf.io.gfile.remove(path + _UNSORTED)
        raise

    total = stats["train"].documents + stats["eval"].documents
    if stats["train"].documents < 2:
        raise PreprocessError(
            f"corpus '{corpus}' gives {stats['train'].documents} training document(s) after tokenization: "
            "the NSP objective needs at least 2 documents (blank line between documents in text files)"
        )
    for split, documents in per_shard.items():
        # Shards are filled by hash, not in turn: with few documents per shard one can stay
        # empty, and a host whose files are all empty would wait forever for data.
        if stats[split].documents and 0 in documents:
            raise PreprocessError(
                f"{split} shard {documents.index(0)} of {counts[split]} got none of the "
                f"{stats[split].documents} {split} documents (shards are filled by a hash): "
                f"use fewer shards (--num_shards / --num_eval_shards)"
            )
    if eval_fraction > 0 and stats["eval"].documents == 0:
        raise PreprocessError(
            f"no held-out documents among {total}: "
            f"raise --eval_fraction (now {eval_fraction}) or add documents"
        )
    single = stats["train"].single_sentence_documents + stats["eval"].single_sentence_documents
    if single:
        fraction = single / total
        message = (
            f"{single} of {total} documents have a single sentence (first: {first_single}); "
            "their instances are always NotNext"
        )
        if fraction > max_single_sentence_fraction:
            raise PreprocessError(
                f"{message}. More than {max_single_sentence_fraction:.0%} is almost certainly a formatting "
                "error: BERT text format is one sentence per line, a blank line only between documents "
                "(raise --max_single_sentence_fraction if this is intended)"
            )
        log(f"warning: {message}")

    tokenizer.save(os.path.join(output, shards.TOKENIZER_DIR))
    manifest = {
        "format_version": shards.FORMAT_VERSION,
        "fingerprint": fingerprint,
        "corpus": corpus,
        "tokenizer": tokenizer.identity(),
        "vocab_size": tokenizer.vocab_size,
        "special_ids": {
            "pad": tokenizer.pad_id,
            "unk": tokenizer.unk_id,
            "cls": tokenizer.cls_id,
            "sep": tokenizer.sep_id,
            "mask": tokenizer.mask_id,
        },
        "splits": {
            split: dict(
                files=[shards.shard_name(split, i, n) for i in range(n)], **dataclasses.asdict(stats[split])
            )
            for split, n in counts.items()
        },
        "dropped_empty_sentences": dropped_sentences,
        "dropped_empty_documents": dropped_documents,
        shards.UNIGRAM_COUNTS: unigrams.tolist(),
        "seconds": round(time.time() - start, 1),
    }
    shards.write_manifest(output, manifest)
    written = shards.Manifest(output, manifest)
    log(
        f"wrote {output}: {stats['train'].documents} train / {stats['eval'].documents} eval documents, "
        f"{stats['train'].tokens + stats['eval'].tokens} tokens, {num_shards}+{num_eval_shards} shards "
        f"in {manifest['seconds']} s (dropped {dropped_sentences} sentences with no tokens)"
    )
    return written


def build_parser():
    parser = cli.parser(__doc__, "data.preprocess")
    parser.add_argument(
        "--corpus", required=True, help="'demo', 'tfds:NAME[:SPLIT]', or text file globs (comma-separated)"
    )
    parser.add_argument(
        "--tokenizer", required=True, help="tokenizer directory (data.tokenizers train, or published files)"
    )
    parser.add_argument("--output", required=True, help="directory for the shards and manifest.json")
    parser.add_argument("--num_shards", type=int, default=8, help="training shard files (>= the hosts)")
    parser.add_argument("--num_eval_shards", type=int, default=1, help="held-out shard files")
    parser.add_argument(
        "--eval_fraction", type=float, default=0.02, help="fraction of documents held out (by a hash)"
    )
    parser.add_argument(
        "--num_workers", type=int, default=None, help="tokenizing processes (default: the cores, at most 8)"
    )
    parser.add_argument(
        "--max_single_sentence_fraction",
        type=float,
        default=0.5,
        help="more one-sentence documents than this is an error (a text file not one sentence per line)",
    )
    parser.add_argument(
        "--max_line_chars", type=int, default=100_000, help="a longer line in a text corpus is an error"
    )
    parser.add_argument(
        "--shuffle_seed",
        type=int,
        default=0,
        help="seed of the document order: shard and position come from a hash of the seed and the text",
    )
    parser.add_argument("--tfds_data_dir", default=None, help="TFDS data_dir for --corpus=tfds:NAME")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace shards made from other inputs in --output"
    )
    return parser


def _run(args) -> None:
    corpus_kwargs = {"max_line_chars": args.max_line_chars}
    if args.corpus.startswith("tfds:") and args.tfds_data_dir:
        corpus_kwargs["tfds_data_dir"] = args.tfds_data_dir
    preprocess(
        args.corpus,
        args.tokenizer,
        args.output,
        num_shards=args.num_shards,
        num_eval_shards=args.num_eval_shards,
        eval_fraction=args.eval_fraction,
        num_workers=args.num_workers,
        overwrite=args.overwrite,
        max_single_sentence_fraction=args.max_single_sentence_fraction,
        shuffle_seed=args.shuffle_seed,
        corpus_kwargs=corpus_kwargs,
    )


main = cli.entry(build_parser, _run)


if __name__ == "__main__":
    sys.exit(main())
