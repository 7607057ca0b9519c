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

Tokenization runs in `--num_workers` processes (with one, in this process), each of whose
tokenizer libraries may start its share of the cores in threads (cores / workers, at least
one); the reader keeps at most a few batches in flight, so tokenizing needs little memory whatever the
corpus size. Documents are first written to `*.tfrecord.unsorted` files in corpus order,
each record prefixed with its order key; then each shard is read back, sorted by key and
written, exact duplicates of a document dropped (every copy of a text has its key, so they
meet in one shard; `--keep_duplicates` keeps them; the manifest counts them). Sorting
holds one shard per worker in memory: about (tokenized corpus size) x num_workers /
num_shards, so a large corpus wants many shards (the pod examples use 256) or fewer
workers. A worker that dies (the out-of-memory killer's SIGKILL) stops
preprocessing with one error line that names the work it lost. The shard files are
removed when preprocessing fails or is interrupted, and the manifest is not written. The
output depends only on the inputs and options, never on --num_workers.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import json
import multiprocessing
import os
import signal
import struct
import sys
import time
from concurrent import futures
from concurrent.futures.process import BrokenProcessPool
from typing import Iterator, NamedTuple, Sequence

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

import numpy as np
import tensorflow as tf

from core import cli
from core.errors import Interrupted, UserError
from data import corpora, record_corpora, shards, tokenizers, word_segmentation

BATCH_DOCUMENTS = 64  # per tokenizing task (bench.preprocess tokenizes alone in the same batches)
_UNSORTED = ".unsorted"
# A record of an unsorted shard: big-endian (order key, doc_id), then the document record.
# Sorting records as bytes sorts by (key, doc_id): duplicate texts keep corpus order.
_KEY = struct.Struct(">QQ")


class PreprocessError(UserError):
    """A user-facing problem with the inputs of preprocessing (one line)."""


class OtherShardsError(PreprocessError):
    """--output holds complete shards made from other inputs or options."""


class WorkerDiedError(PreprocessError):
    """A tokenizing or sorting process died: killed, most likely by the out-of-memory killer."""


@dataclasses.dataclass
class SplitStats:
    documents: int = 0
    sentences: int = 0
    tokens: int = 0
    single_sentence_documents: int = 0


class DocumentBatch(NamedTuple):
    """Up to `BATCH_DOCUMENTS` consecutive documents of the corpus, as the reader sends them
    to the tokenizer: `documents` [(doc_id, sentences)], and per document whether it is
    held out, its source (for messages) and its `order_key`."""

    documents: list[tuple[int, list[str]]]
    heldout: list[bool]
    sources: list[str]
    keys: list[tuple[int, int]]


class Tokenized(NamedTuple):
    """One tokenized document: each sentence's ids (empty sentences dropped, and counted) and
    its record (shards.encode_document's; b"" without tokens), made where it was tokenized so
    that the reader process only writes it (serialising costs as much per document as
    reading it)."""

    doc_id: int
    sentences: list[list[int]]
    dropped: int
    record: bytes

    @classmethod
    def of(cls, doc_id: int, sentences: list[list[int]], dropped: int, word_continues: Sequence[int] = ()):
        """The document with its record; word_continues: with a word segmenter, the positions
        of the tokens that continue a word (data/word_segmentation.py)."""
        record = shards.encode_document(doc_id, sentences, word_continues) if sentences else b""
        return cls(doc_id, sentences, dropped, record)


class ShardWriter:
    """The shards of both splits while the corpus is written, and the counts the manifest keeps.

    Documents go to `*.unsorted` files beside the final shards (`paths`), each record
    prefixed by its order key (`_KEY`); `_sort_shard` turns each into its shard once the
    writer is closed. The counts: `stats` per split, `per_shard` (documents in each shard
    of each split), `first_single` (source of the first one-sentence document, for the
    warning), `dropped_sentences` / `dropped_documents` (no tokens) and `unigrams`
    ([vocab_size] int64 tokens per id of the train split: span masking's random tokens).
    """

    def __init__(
        self, output: str, num_shards: dict[str, int], vocab_size: int, drop_duplicates: bool = True
    ):
        self.drop_duplicates = drop_duplicates
        self.duplicates = 0
        self.num_shards = dict(num_shards)
        self.paths = {
            split: [os.path.join(output, shards.shard_name(split, i, n)) for i in range(n)]
            for split, n in num_shards.items()
        }
        self.stats = {split: SplitStats() for split in num_shards}
        self.per_shard = {split: [0] * n for split, n in num_shards.items()}
        self.first_single: str | None = None
        self.dropped_sentences = 0
        self.dropped_documents = 0
        self.unigrams = np.zeros(vocab_size, np.int64)
        self._writers = {
            split: [tf.io.TFRecordWriter(path + _UNSORTED) for path in paths]
            for split, paths in self.paths.items()
        }

    @property
    def all_paths(self) -> list[str]:
        """Every final shard path, train then eval."""
        return [path for paths in self.paths.values() for path in paths]

    def write(self, batch: DocumentBatch, tokenized: Sequence[Tokenized]) -> None:
        """Writes and counts one batch's documents (a document without tokens is only counted)."""
        train_ids = []
        for (doc_id, sentences, dropped, record), is_eval, source, key in zip(
            tokenized, batch.heldout, batch.sources, batch.keys
        ):
            self.dropped_sentences += dropped
            if not sentences:
                self.dropped_documents += 1
                continue
            split = "eval" if is_eval else "train"
            self._count(split, sentences, source)
            self._write_document(split, doc_id, record, key)
            if split == "train":
                train_ids.extend(itertools.chain.from_iterable(sentences))
        # One bincount per batch of documents: a [vocab] array per document would cost more.
        self.unigrams += np.bincount(np.asarray(train_ids, np.int64), minlength=len(self.unigrams))

    def _count(self, split: str, sentences: list[list[int]], source: str) -> None:
        stats = self.stats[split]
        stats.documents += 1
        stats.sentences += len(sentences)
        stats.tokens += sum(len(sentence) for sentence in sentences)
        if len(sentences) == 1:
            stats.single_sentence_documents += 1
            self.first_single = self.first_single or source

    def _write_document(self, split: str, doc_id: int, record: bytes, key: tuple[int, int]) -> None:
        shard_key, order = key
        shard = shard_key % self.num_shards[split]
        self.per_shard[split][shard] += 1
        self._writers[split][shard].write(_KEY.pack(order, doc_id) + record)

    def forget(self, path: str, dropped: Duplicates) -> None:
        """Takes the duplicates a shard's sort dropped out of the counts."""
        split = next(split for split, paths in self.paths.items() if path in paths)
        stats = self.stats[split]
        stats.documents -= dropped.documents
        stats.sentences -= dropped.sentences
        stats.tokens -= dropped.tokens
        stats.single_sentence_documents -= dropped.single_sentence_documents
        self.per_shard[split][self.paths[split].index(path)] -= dropped.documents
        if split == "train":
            self.unigrams -= dropped.token_counts
        self.duplicates += dropped.documents

    def close(self) -> None:
        for writers in self._writers.values():
            for writer in writers:
                writer.close()

    def remove_unsorted(self) -> None:
        """Deletes the `*.unsorted` files that are left (after a failure: no half-written copy
        of the corpus stays behind)."""
        for path in self.all_paths:
            if tf.io.gfile.exists(path + _UNSORTED):
                tf.io.gfile.remove(path + _UNSORTED)

    def remove_shards(self) -> None:
        """Deletes the shards written so far (after a failure that comes once they are: a shard
        left empty, too few documents, Ctrl-C)."""
        self.remove_unsorted()
        for path in self.all_paths:
            if tf.io.gfile.exists(path):
                tf.io.gfile.remove(path)

    def manifest_counts(self) -> dict:
        """The manifest's fields from the counts: splits (files and SplitStats), the dropped
        sentences and documents, the unigram counts."""
        return {
            "splits": {
                split: dict(
                    files=[shards.shard_name(split, i, n) for i in range(n)],
                    **dataclasses.asdict(self.stats[split]),
                )
                for split, n in self.num_shards.items()
            },
            "dropped_empty_sentences": self.dropped_sentences,
            "dropped_empty_documents": self.dropped_documents,
            "dropped_duplicate_documents": self.duplicates,
            shards.UNIGRAM_COUNTS: self.unigrams.tolist(),
        }


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
_worker_segmenter = None
_worker_barrier = None


def _init_worker(
    tokenizer_path: str, word_segmenter: str | None = None, threads: int | None = None, barrier=None
) -> None:
    """Loads the tokenizer (and segmenter) of a tokenizing process; `threads` caps its
    tokenizer libraries' threads (a worker's share of the cores: data/tokenizers/threads.py);
    `barrier`: every worker's, for `_all_started`."""
    global _worker_tokenizer, _worker_segmenter, _worker_barrier
    _worker_barrier = barrier
    if threads is not None:
        tokenizers.limit_threads(threads)
    _worker_tokenizer = tokenizers.load_tokenizer(tokenizer_path)
    _worker_segmenter = None if word_segmenter is None else word_segmentation.segmenter(word_segmenter)


def _all_started() -> None:
    """A worker's first task: wait until every worker runs one. A worker waiting here takes
    no other, so when all these tasks are done every worker has started."""
    _worker_barrier.wait(timeout=600)


def _tokenize_batch(documents: Sequence[tuple[int, list[str]]]) -> list[Tokenized]:
    """Tokenizes documents in a worker (and finds their words, with a segmenter)."""
    if _worker_segmenter is not None:
        return _tokenize_segmented(documents)
    # encode_documents, not each sentence alone: byte-level BPE gives a sentence after the
    # first its joining space ("ĠThe"), as fairseq encodes whole lines.
    encoded = _worker_tokenizer.encode_documents([sentences for _, sentences in documents])
    out = []
    for (doc_id, _), ids in zip(documents, encoded):
        kept = [s for s in ids if s]
        out.append(Tokenized.of(doc_id, kept, len(ids) - len(kept)))
    return out


def _tokenize_segmented(documents: Sequence[tuple[int, list[str]]]) -> list[Tokenized]:
    """`_tokenize_batch` with the segmenter's words: each sentence's tokens and their character
    offsets (WordPiece: a sentence alone gives the pieces it gives in the document), then the
    tokens that continue a word, as positions in the document's kept tokens."""
    encoded = iter(
        _worker_tokenizer.encode_batch_offsets([t for _, sentences in documents for t in sentences])
    )
    out = []
    for doc_id, sentences in documents:
        kept, continues, dropped, first = [], [], 0, 0
        for text in sentences:
            ids, offsets = next(encoded)
            if not ids:
                dropped += 1
                continue
            inner = word_segmentation.inner_characters(text, _worker_segmenter.words(text))
            continues += [first + i for i in word_segmentation.continuing_tokens(text, offsets, inner)]
            kept.append(ids)
            first += len(ids)
        out.append(Tokenized.of(doc_id, kept, dropped, continues))
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
) -> Iterator[DocumentBatch]:
    """The corpus in batches of `BATCH_DOCUMENTS` documents, in corpus order."""
    batch = DocumentBatch([], [], [], [])
    for doc_id, doc in enumerate(corpora.iter_documents(corpus, **corpus_kwargs)):
        batch.documents.append((doc_id, list(doc.sentences)))
        batch.heldout.append(corpora.is_heldout(doc, eval_fraction))
        batch.sources.append(doc.source)
        batch.keys.append(order_key(doc, shuffle_seed))
        if len(batch.documents) == BATCH_DOCUMENTS:
            yield batch
            batch = DocumentBatch([], [], [], [])
    if batch.documents:
        yield batch


@dataclasses.dataclass
class Duplicates:
    """What sorting one shard dropped as exact duplicates of a document kept before them:
    their counts, and `token_counts` [vocab_size] int64 (for the train split's unigrams)."""

    documents: int = 0
    sentences: int = 0
    tokens: int = 0
    single_sentence_documents: int = 0
    token_counts: np.ndarray | None = None


def _sort_shard(path: str, drop_duplicates: bool = True, vocab_size: int = 0) -> tuple[str, Duplicates]:
    """Rewrites PATH.unsorted as PATH: its documents sorted by order key, prefixes removed,
    and (unless told otherwise) each exact duplicate of a document dropped.

    The order key is a hash of the document's text, so every copy of a text lands in the
    same shard, next to the others once sorted (by key, then corpus order: the first copy is
    kept); a copy is a duplicate when its tokens are the first's too (a shared 64-bit key
    alone could be two texts). So exact deduplication costs no memory beyond the sort's.
    Holds one shard in memory (the records as bytes). Returns (PATH, what was dropped).
    """
    unsorted = path + _UNSORTED
    # In batches: one iterator step per record costs more than the rest of the sort.
    records = [
        r for batch in tf.data.TFRecordDataset(unsorted).batch(4096).as_numpy_iterator() for r in batch
    ]
    records.sort(key=lambda record: record[: _KEY.size])
    dropped = Duplicates(token_counts=np.zeros(vocab_size, np.int64))
    kept_key, kept_body = None, None
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            key, body = record[:8], record[_KEY.size :]
            # Only a record with the kept one's key can repeat it: parse just those two.
            if drop_duplicates and key == kept_key:
                tokens = _tokens(body)
                if all(np.array_equal(a, b) for a, b in zip(tokens, _tokens(kept_body))):
                    dropped.documents += 1
                    dropped.sentences += len(tokens[1])
                    dropped.tokens += len(tokens[0])
                    dropped.single_sentence_documents += len(tokens[1]) == 1
                    dropped.token_counts += np.bincount(tokens[0], minlength=vocab_size)
                    continue
            kept_key, kept_body = key, body
            writer.write(body)
    tf.io.gfile.remove(unsorted)
    return path, dropped


def _tokens(document_record: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(token_ids, sentence_lengths) of a document record (shards.encode_document's)."""
    features = tf.train.Example.FromString(document_record).features.feature
    return (
        np.asarray(features["token_ids"].int64_list.value, np.int64),
        np.asarray(features["sentence_lengths"].int64_list.value, np.int64),
    )


def _tokenize_and_sort_here(
    batches: Iterator[DocumentBatch], writer: ShardWriter, tokenizer_path: str, word_segmenter: str | None
) -> None:
    """`--num_workers=1`: tokenizes and sorts in this process (a worker would only add its start-up)."""
    _init_worker(tokenizer_path, word_segmenter)
    for batch in batches:
        writer.write(batch, _tokenize_batch(batch.documents))
    writer.close()
    for path in writer.all_paths:
        writer.forget(*_sort_shard(path, writer.drop_duplicates, len(writer.unigrams)))


class _Workers:
    """`num_workers` spawned processes that tokenize the batches and sort the shards.

    A ProcessPoolExecutor, not a multiprocessing.Pool: when the out-of-memory killer
    SIGKILLs a worker, a Pool starts another and waits forever for the lost result, while
    the executor fails every pending task (BrokenProcessPool), which becomes one
    `WorkerDiedError` line naming the work that was lost.
    """

    def __init__(self, num_workers: int, tokenizer_path: str, word_segmenter: str | None = None):
        self.num_workers = num_workers
        context = multiprocessing.get_context("spawn")
        self._pool = futures.ProcessPoolExecutor(
            num_workers,
            mp_context=context,
            initializer=_init_worker,
            # Each worker's libraries get its share of the cores, not a thread per core each.
            initargs=(
                tokenizer_path,
                word_segmenter,
                max(1, (os.cpu_count() or 1) // num_workers),
                context.Barrier(num_workers),
            ),
        )
        # Ctrl-C reaches every process of the terminal's group: the workers (which inherit a
        # blocked SIGINT through exec, and keep it blocked) leave it to this process, which
        # stops them and says so in one line, instead of a traceback from each of them. Here
        # it is blocked, not ignored, until they have started (a worker stopped half-way
        # through its start prints a traceback of its own): one that comes meanwhile is
        # delivered then.
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
        try:
            # Not a trivial task per worker: the first worker up could run them all while another
            # is still starting, and a Ctrl-C then would stop it half-way (a traceback of its own).
            started = [self._pool.submit(_all_started) for _ in range(num_workers)]
            for future in started:
                future.result()
        except BrokenProcessPool:
            raise self._died("starting (loading the tokenizer)") from None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def __enter__(self) -> _Workers:
        return self

    def __exit__(self, exc_type, *_) -> None:
        # After a failure the queued tasks are dropped; those already started run to their end
        # (the executor cannot stop them), before the caller removes the unsorted files.
        self._pool.shutdown(wait=True, cancel_futures=exc_type is not None)

    def tokenize(self, batches: Iterator[DocumentBatch], writer: ShardWriter) -> None:
        """Tokenizes the batches into `writer` in corpus order, at most 2 per worker in flight
        (bounded memory, whatever the corpus size)."""
        in_flight = collections.deque()
        try:
            for batch in batches:
                in_flight.append((batch, self._pool.submit(_tokenize_batch, batch.documents)))
                if len(in_flight) >= 2 * self.num_workers:  # wait for the oldest batch
                    self._write_oldest(in_flight, writer)
            while in_flight:
                self._write_oldest(in_flight, writer)
        except BrokenProcessPool:
            oldest = in_flight[0][0].documents if in_flight else None
            lost = f"documents {oldest[0][0]}-{oldest[-1][0]}" if oldest else "the corpus"
            raise self._died(f"tokenizing {lost}") from None

    @staticmethod
    def _write_oldest(in_flight: collections.deque, writer: ShardWriter) -> None:
        batch, tokenized = in_flight[0]
        writer.write(batch, tokenized.result())
        in_flight.popleft()  # only once written: a dead worker's batch stays the oldest

    def sort(self, writer: ShardWriter) -> None:
        """Sorts every shard of `writer` (dropping duplicates unless told otherwise), one per
        worker at a time (one shard in memory per worker)."""
        sorting = "the shards"
        try:
            started = [
                (path, self._pool.submit(_sort_shard, path, writer.drop_duplicates, len(writer.unigrams)))
                for path in writer.all_paths
            ]
            for path, done in started:
                sorting = os.path.basename(path)
                writer.forget(*done.result())
        except BrokenProcessPool:
            raise self._died(f"sorting {sorting} (each worker holds one shard in memory)") from None

    def _died(self, work: str) -> WorkerDiedError:
        return WorkerDiedError(
            f"a preprocessing worker process died while {work}, most likely killed by the "
            f"out-of-memory killer: use fewer --num_workers (now {self.num_workers}) or more memory"
        )


def _write_shards(
    batches: Iterator[DocumentBatch],
    writer: ShardWriter,
    num_workers: int,
    tokenizer_path: str,
    word_segmenter: str | None = None,
) -> None:
    """Tokenizes the batches into the writer's unsorted files, closes them and sorts every shard."""
    try:
        if num_workers == 1:
            _tokenize_and_sort_here(batches, writer, tokenizer_path, word_segmenter)
        else:
            with _Workers(num_workers, tokenizer_path, word_segmenter) as workers:
                workers.tokenize(batches, writer)
                writer.close()
                workers.sort(writer)
    except BaseException:
        # A bad input line, Ctrl-C, a dead worker or a failed sort: leave no unsorted copy of the corpus.
        writer.close()
        writer.remove_unsorted()
        raise


def _existing_output(output: str, fingerprint: str, overwrite: bool, log) -> shards.Manifest | None:
    """The manifest of `output` when it already holds these inputs' shards (adding the unigram
    counts that shards from before span masking lack), else None: preprocessing must run.

    Shards of other inputs are an OtherShardsError without `overwrite`; with it, their
    manifest is removed first, so that they no longer count as complete.
    """
    manifest_path = os.path.join(output, shards.MANIFEST)
    if not tf.io.gfile.exists(manifest_path):
        return None
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
    for split in existing.splits:  # another shard count's files would stay beside the new ones
        for path in existing.files(split):
            if tf.io.gfile.exists(path):
                tf.io.gfile.remove(path)
    return None


def _check_counts(
    writer: ShardWriter, corpus: str, eval_fraction: float, max_single_sentence_fraction: float, log
) -> None:
    """PreprocessError when the shards would not train: fewer than 2 train documents, an empty
    shard, no held-out documents, or mostly one-sentence documents (a warning when some)."""
    stats = writer.stats
    total = stats["train"].documents + stats["eval"].documents
    if stats["train"].documents < 2:
        raise PreprocessError(
            f"corpus '{corpus}' gives {stats['train'].documents} training document(s) after tokenization: "
            "the NSP objective needs at least 2 documents (blank line between documents in text files)"
        )
    for split, documents in writer.per_shard.items():
        # Shards are filled by hash, not in turn: with few documents per shard one can stay
        # empty, and a host whose files are all empty would wait forever for data.
        if stats[split].documents and 0 in documents:
            raise PreprocessError(
                f"{split} shard {documents.index(0)} of {writer.num_shards[split]} got none of the "
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
        message = (
            f"{single} of {total} documents have a single sentence (first: {writer.first_single}); "
            "their instances are always NotNext"
        )
        if single / total > max_single_sentence_fraction:
            raise PreprocessError(
                f"{message}. More than {max_single_sentence_fraction:.0%} is almost certainly a formatting "
                "error: BERT text format is one sentence per line, a blank line only between documents "
                "(raise --max_single_sentence_fraction if this is intended)"
            )
        log(f"warning: {message}")


def _manifest_fields(
    fingerprint: str,
    corpus: str,
    tokenizer: tokenizers.Tokenizer,
    writer: ShardWriter,
    seconds: float,
    word_segmenter: dict | None,
) -> dict:
    """manifest.json's fields (shards.Manifest reads them)."""
    return {
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
            **({} if tokenizer.eod_id is None else {"eod": tokenizer.eod_id}),
        },
        **({} if word_segmenter is None else {shards.WORD_SEGMENTER: word_segmenter}),
        **writer.manifest_counts(),
        "seconds": seconds,
    }


def _segmenter_identity(name: str, tokenizer: tokenizers.Tokenizer) -> dict:
    """The identity of the segmenter called `name`, once the tokenizer is known to take one: a
    WordPiece tokenizer, whose pieces of CJK text are single characters with their offsets."""
    identity = tokenizer.identity()
    kind = identity.get("follows", identity["kind"])
    if kind != "wordpiece":
        raise PreprocessError(
            f"--word_segmenter finds Chinese words for BERT's WordPiece tokenizer (a token per character), "
            f"and this tokenizer is {kind!r}: use a WordPiece vocabulary (python -m data.tokenizers "
            "train --kind=wordpiece), or leave --word_segmenter out"
        )
    return word_segmentation.segmenter(name).identity()


def _check_options(
    num_shards: int, num_eval_shards: int, eval_fraction: float, num_workers: int | None
) -> None:
    """Refuses counts that cannot make shards, before anything is read or written."""
    for flag, value in (("--num_shards", num_shards), ("--num_eval_shards", num_eval_shards)):
        if value < 1:
            raise PreprocessError(f"{flag}={value}: write at least 1 (a shard file per host or more)")
    if num_workers is not None and num_workers < 1:
        raise PreprocessError(
            f"--num_workers={num_workers}: write at least 1, or leave it out for one per core"
        )
    if not 0 <= eval_fraction < 1:
        raise PreprocessError(f"--eval_fraction={eval_fraction}: write a fraction in [0, 1), e.g. 0.02")


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
    keep_duplicates: bool = False,
    word_segmenter: str | None = None,
    corpus_kwargs: dict | None = None,
    log=print,
) -> shards.Manifest:
    """Writes the shards and the manifest; returns the manifest. See the module docstring.

    word_segmenter: a name of data/word_segmentation.py's SEGMENTERS ("jieba"): each record
    also lists the tokens that continue a segmented Chinese word (whole-word masking's
    words); WordPiece tokenizers only."""
    _check_options(num_shards, num_eval_shards, eval_fraction, num_workers)
    corpus_kwargs = corpus_kwargs or {}
    tokenizer = tokenizers.load_tokenizer(tokenizer_path)
    segmenter_identity = None
    if word_segmenter is not None:
        segmenter_identity = _segmenter_identity(word_segmenter, tokenizer)
    options = dict(
        num_shards=num_shards,
        num_eval_shards=num_eval_shards,
        eval_fraction=eval_fraction,
        order=f"sha256-sorted:{shuffle_seed}",  # shards written in corpus order need --overwrite
        **{k: str(v) for k, v in corpus_kwargs.items()},
        # Only when set: shards written before deduplication existed stay up to date.
        **({"keep_duplicates": "True"} if keep_duplicates else {}),
    )
    splitter = corpora.splitter_of(
        corpus, corpus_kwargs.get("sentences", "split"), corpus_kwargs.get("language", "en")
    )
    if splitter is not None:  # shards of another splitter (or version) are never taken as these
        options["splitter"] = splitter
    if segmenter_identity is not None:  # the same for the word segmenter
        options["word_segmenter"] = json.dumps(segmenter_identity, sort_keys=True)
    fingerprint = _fingerprint(corpus, tokenizer.identity(), options)
    existing = _existing_output(output, fingerprint, overwrite, log)
    if existing is not None:
        return existing
    tf.io.gfile.makedirs(output)

    start = time.time()
    writer = ShardWriter(
        output, {"train": num_shards, "eval": num_eval_shards}, tokenizer.vocab_size, not keep_duplicates
    )
    try:
        batches = _document_batches(corpus, eval_fraction, shuffle_seed, corpus_kwargs)
        workers = num_workers or max(1, min(os.cpu_count() or 1, 8))
        _write_shards(batches, writer, workers, tokenizer_path, word_segmenter)
        _check_counts(writer, corpus, eval_fraction, max_single_sentence_fraction, log)
        tokenizer.save(os.path.join(output, shards.TOKENIZER_DIR))
        seconds = round(time.time() - start, 1)
        manifest = _manifest_fields(fingerprint, corpus, tokenizer, writer, seconds, segmenter_identity)
        shards.write_manifest(output, manifest)
    except BaseException as e:
        # No manifest: what was written is no output. Leave none of it beside a later run's.
        writer.remove_shards()
        if isinstance(e, KeyboardInterrupt):
            raise Interrupted(
                f"interrupted (Ctrl-C): nothing was kept in {output} (no shards, no manifest); run the same "
                "command to start again"
            ) from None
        raise
    train, held_out = writer.stats["train"], writer.stats["eval"]
    log(
        f"wrote {output}: {train.documents} train / {held_out.documents} eval documents, "
        f"{train.tokens + held_out.tokens} tokens, {num_shards}+{num_eval_shards} shards "
        f"in {manifest['seconds']} s (dropped {writer.duplicates} duplicate documents and "
        f"{writer.dropped_sentences} sentences with no tokens)"
    )
    return shards.Manifest(output, manifest)


def build_parser():
    parser = cli.parser(__doc__, "data.preprocess")
    parser.add_argument(
        "--corpus",
        required=True,
        help="'demo', 'tfds:NAME[:SPLIT]', or globs of text, JSONL (.jsonl[.gz|.zst]) or Parquet files "
        "(comma-separated)",
    )
    parser.add_argument(
        "--tokenizer", required=True, help="tokenizer directory (data.tokenizers train, or published files)"
    )
    parser.add_argument("--output", required=True, help="directory for the shards and manifest.json")
    parser.add_argument(
        "--num_shards", type=cli.positive_int, default=8, help="training shard files (>= the hosts)"
    )
    parser.add_argument("--num_eval_shards", type=cli.positive_int, default=1, help="held-out shard files")
    parser.add_argument(
        "--eval_fraction", type=float, default=0.02, help="fraction of documents held out (by a hash)"
    )
    parser.add_argument(
        "--num_workers",
        type=cli.positive_int,
        default=None,
        help="tokenizing processes (default: the cores, at most 8)",
    )
    parser.add_argument(
        "--max_single_sentence_fraction",
        type=float,
        default=0.5,
        help="more one-sentence documents than this is an error (a text file not one sentence per line)",
    )
    parser.add_argument(
        "--max_line_chars",
        type=cli.positive_int,
        default=100_000,
        help="a longer line in a text corpus is an error",
    )
    parser.add_argument(
        "--shuffle_seed",
        type=int,
        default=0,
        help="seed of the document order: shard and position come from a hash of the seed and the text",
    )
    parser.add_argument("--tfds_data_dir", default=None, help="TFDS data_dir for --corpus=tfds:NAME")
    record_corpora.add_flags(parser)
    parser.add_argument(
        "--keep_duplicates",
        action="store_true",
        help="keep documents whose text repeats an earlier one (dropped by default; counted in the manifest)",
    )
    parser.add_argument(
        "--word_segmenter",
        choices=sorted(word_segmentation.SEGMENTERS),
        default=None,
        help="find Chinese words for whole-word masking (Chinese-BERT-wwm); WordPiece tokenizers only",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace shards made from other inputs in --output"
    )
    return parser


def _run(args) -> None:
    corpus_kwargs = {"max_line_chars": args.max_line_chars, **record_corpora.corpus_kwargs(args)}
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
        keep_duplicates=args.keep_duplicates,
        word_segmenter=args.word_segmenter,
        max_single_sentence_fraction=args.max_single_sentence_fraction,
        shuffle_seed=args.shuffle_seed,
        corpus_kwargs=corpus_kwargs,
    )


main = cli.entry(build_parser, _run)


if __name__ == "__main__":
    sys.exit(main())
