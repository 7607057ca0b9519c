"""The per-host tf.data pipeline: document shards -> masked BERT batches.

    for each pass (epoch) over this host's files:
      files (seeded order) --interleave--> documents --block shuffle--> chunks
      (instances.chunk_document) --zip two random other documents--> pairs
      (attach_random_b, truncate_pair, format_pair) --mask (masking.mask_tokens)--> rows
    rows of all passes --shuffle--> batch(drop_remainder) --> prefetch

That is `format="segment_pair"` with NSP (BERT). SOP zips the random-document stream too
(a one-sentence chunk takes its B from another document, as ALBERT); "none" drops it;
"sentence_pair" closes chunks at two sentences; "full_sentences" and "doc_sentences" go
documents -> sentences --scan(fill_step)--> rows [--scan(pack_step)--> packed rows] ->
mask. The scans' state is saved with the iterator. "xlnet_stream" is XLNet's
(`_xlnet_batches`, data/xlnet_stream.py): one stream of documents per row, no instance
shuffle, row r of each batch continuing row r of the one before.

Every document carries the number of the epoch it was read in. Everything that shapes a
row (file order, document order, chunking, random B, which documents share a
FULL-/DOC-SENTENCES row) uses the *copy* `epoch % dupe_factor`, and each pass is built
from scratch (no state crosses a pass), so passes e and e + dupe_factor make the same
rows (the original wrote `dupe_factor` differently-masked copies of the data). Static
masks use the copy too; dynamic masking uses the epoch itself, so every pass gets fresh
masks. All randomness is stateless and seeded, so the stream is a pure function of
(this host's files, config); the iterator is checkpointable with
`tf.train.Checkpoint(iterator=it)` for exact resume (which is why documents are shuffled
in blocks by stateless permutations: `Dataset.shuffle` inside a pass cannot be saved).

Batches are dicts of numpy-convertible tensors with the keys of docs/architecture.md:
input_ids, input_mask, segment_ids, positions [B, L] int32; masked_lm_positions,
masked_lm_ids [B, P] int32; masked_lm_weights [B, P] float32; sentence_label [B] int32
(absent with sentence_objective "none"); example_ids [B, L] int32 (packed DOC-SENTENCES
only: 1..k per packed example, 0 = padding; positions restart at 0 in each example). With
masking "in_step" the input_ids are the original tokens and maskable [B, L] int32 and
mask_id [B] int32 replace the three masked_lm_* keys. Span masking adds the span boundary
objective's sbo_left, sbo_right, sbo_offset [B, P] int32 and sbo_weights [B, P] float32
(data/masking.py mask_spans). XLNet's batches: input_ids, segment_ids, input_mask,
functional [B, L] int32, target_positions [B, P] int32, target_weights [B, P] float32,
direction [B] int32 (data/xlnet_stream.py `make_row`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os

import tensorflow as tf

from core.errors import ConfigError
from data import (
    instances,
    masking,
    pair_layout,
    shards,
    similar_words,
    tokenizers,
    word_segmentation,
    xlnet_stream,
)
from data.pipeline_config import WORD_UNITS, PipelineConfig
from data.shards import Vocab
from data.similar_words import SimilarWords

_SALT_DOC = 11
_SALT_MASK = 12
_SALT_PAIR = 13
_SALT_FILES = 14
_SALT_BLOCKS = 15
_SALT_XLNET = 16

# Files each host reads at once (fewer if it has fewer). Shards are in random order
# (data.preprocess), so this is for read throughput more than mixing; each open file
# costs one read buffer.
_CYCLE_LENGTH = 16


def resolve_pair_format(config: PipelineConfig, vocab: Vocab) -> str:
    """The pair layout: the config's if set, else the tokenizer's, else BERT's."""
    if config.pair_format and vocab.pair_format and config.pair_format != vocab.pair_format:
        raise ConfigError(
            f"PipelineConfig.pair_format={config.pair_format!r} but the shards' tokenizer uses "
            f"{vocab.pair_format!r}: unset PipelineConfig.pair_format or preprocess with a matching tokenizer"
        )
    return config.pair_format or vocab.pair_format or "bert"


def host_files(
    data_dir: str, split: str, process_index: int, process_count: int, rows: int = 1
) -> tuple[list[str], bool]:
    """This host's shard files, and whether documents must be sharded instead of files.

    Each host reads files[process_index::process_count]. With fewer files than hosts every
    host reads all files and keeps every process_count-th document (slower, but no host
    starves and no document is read twice). Fewer documents than hosts is an error: a host
    with none would wait for its first row forever (passes of nothing). XLNet's `rows`
    streams per host share fewer documents than rows by turns, which a warning says.
    """
    manifest = shards.load_manifest(data_dir)
    documents = manifest.splits.get(split, {}).get("documents", 0)
    if documents < process_count:
        raise shards.ShardsError(
            f"the {split} split of '{data_dir}' has {documents} document(s) for {process_count} host(s): "
            f"every host needs at least one (preprocess more {split} documents, e.g. larger --eval_fraction)"
        )
    if documents < process_count * rows:
        logging.warning(
            "the %s split has %d documents for %d row streams on each of %d host(s): each stream reads a "
            "document only every few passes (preprocess more %s documents, e.g. larger --eval_fraction)",
            split,
            documents,
            rows,
            process_count,
            split,
        )
    files = manifest.files(split)
    if len(files) >= process_count:
        if len(files) % process_count:
            logging.warning(
                "%d %s files for %d hosts: hosts read %d or %d files, so the data mixture is "
                "uneven; preprocess with --num_shards a multiple of %d",
                len(files),
                split,
                process_count,
                len(files) // process_count,
                len(files) // process_count + 1,
                process_count,
            )
        return files[process_index::process_count], False
    logging.warning(
        "%d %s files for %d hosts: sharding by document instead of by file; "
        "preprocess with --num_shards >= %d for faster input",
        len(files),
        split,
        process_count,
        process_count,
    )
    return files, True


def _block_shuffle(records: tf.data.Dataset, block: int, seed: tf.Tensor) -> tf.data.Dataset:
    """Shuffles a finite stream within consecutive blocks of `block` elements.

    A stateless permutation per block (seeded by `seed` and the block's index), so it is
    a pure function of the input and can be checkpointed inside a per-pass `flat_map`
    (`Dataset.shuffle` there holds a seed generator that iterator saving rejects).
    records: a dataset of [] tf.string. seed: [2] int64.
    """

    def permute(index, batch):
        order = tf.random.experimental.stateless_shuffle(
            tf.range(tf.size(batch)), seed=instances.derive_seed(seed, index)
        )
        return tf.gather(batch, order)

    return records.batch(block).enumerate().map(permute).unbatch()


def _pass_documents(
    files: list[str],
    epoch: tf.Tensor,
    order_seed: tf.Tensor,
    *,
    block: int,
    shuffle_files: bool,
    shard_documents: bool,
    process_index: int,
    process_count: int,
    stream: tuple[int, tf.Tensor] | None = None,
    word_tags: bool = False,
) -> tf.data.Dataset:
    """One pass over the files: parsed documents, each tagged with `epoch` ([] int64).

    The file order and the block shuffle are stateless permutations seeded by
    `order_seed` ([2] int64), identical on every host, so the pass is a pure function
    of (files, order_seed) and the same seed gives the same documents in the same order.
    stream: (streams, index): only every streams-th document of the host's, from document
    (index + epoch) % streams (before the block shuffle, which then buffers `block` of this
    stream's documents): the streams read disjoint documents in each pass, and turn by
    turn every document when there are fewer documents than streams.
    word_tags: the segmenter's words ride on the ids (`instances.parse_document`).
    """
    names = tf.constant(files)
    if shuffle_files and len(files) > 1:
        names = tf.random.experimental.stateless_shuffle(
            names, seed=instances.derive_seed(order_seed, _SALT_FILES)
        )
    ds = tf.data.Dataset.from_tensor_slices(names).interleave(
        tf.data.TFRecordDataset,
        cycle_length=min(_CYCLE_LENGTH, len(files)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    if shard_documents:  # before any shuffle: every host sees the same record order
        ds = ds.shard(process_count, process_index)
    if stream is not None:  # XLNet's row streams: one in every `streams` documents each
        streams, index = stream
        ds = ds.shard(streams, (index + epoch) % streams)
    if block > 1:
        ds = _block_shuffle(ds, block, instances.derive_seed(order_seed, _SALT_BLOCKS))

    def parse(record):
        return dict(instances.parse_document(record, word_tags), epoch=epoch)

    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _flagged_rows(ds: tf.data.Dataset) -> tf.data.Dataset:
    """Elements (flag [] bool, row) -> the rows whose flag is True: what the scan steps
    emit, or the pairs that found a random B (`valid`)."""
    return ds.filter(lambda flag, row: flag).map(lambda flag, row: row)


def instance_stream(
    files: list[str],
    config: PipelineConfig,
    vocab: Vocab,
    *,
    shuffle: bool = True,
    first_epoch: int = 0,
    shard_documents: bool = False,
    process_index: int = 0,
    process_count: int = 1,
    word_starts=None,
    unigram_counts=None,
    word_tags: bool = False,
    similar_words: SimilarWords | None = None,
) -> tf.data.Dataset:
    """Endless stream of masked rows (unbatched) from these files; see the module docstring.

    Rows are made one pass at a time (`flat_map` over the epochs from `first_epoch`,
    `_Passes.rows`), each pass from its copy's document order and with fresh scan states,
    then shuffled across passes by the instance buffer.
    word_starts: [vocab_size] bool (the tokenizer's `word_start_mask()`), needed for
    masking_unit "whole_word" / "ngram" / "span".
    unigram_counts: [vocab_size] int64 training-token counts (the manifest's), needed for "span".
    word_tags: the records' segmenter words join the masking's words (`word_tags`).
    similar_words: MacBERT's table, for replacement "similar".
    """
    if config.masking_unit != "token" and word_starts is None:
        raise ValueError(f"masking_unit={config.masking_unit!r} needs word_starts [vocab_size] bool")
    if config.masking_unit == "span" and unigram_counts is None:
        raise ValueError("masking_unit='span' needs unigram_counts [vocab_size] int64")
    passes = _Passes(
        functools.partial(
            _pass_documents,
            files,
            shard_documents=shard_documents,
            process_index=process_index,
            process_count=process_count,
            word_tags=word_tags,
        ),
        config,
        vocab,
        shuffle=shuffle,
        word_tags=word_tags,
        similar_words=similar_words,
        word_starts=None if word_starts is None else tf.constant(word_starts, tf.bool),
        unigram_counts=None if unigram_counts is None else tf.constant(unigram_counts, tf.int64),
    )
    ds = tf.data.Dataset.range(first_epoch, 2**62).flat_map(passes.rows)
    if shuffle and config.instance_shuffle_buffer > 1:
        ds = ds.shuffle(config.instance_shuffle_buffer, seed=config.seed + 2)
    return ds


class _Passes:
    """The rows of each pass (epoch) of `instance_stream`, built from scratch per pass.

    Everything that shapes a row is seeded by the pass's copy (`copy_of`: epoch %
    dupe_factor) and `base` (the run seed), so passes e and e + dupe_factor make the same
    rows; masks are seeded by the copy (static) or the epoch (dynamic).

    pass_documents: `_pass_documents` with this host's files and sharding bound.
    word_starts: [vocab_size] bool, unigram_counts: [vocab_size] int64 tensors, or None
    (`instance_stream` checks that the masking unit has what it needs). word_tags: the
    documents' ids carry the segmenter's words, which come off before masking.
    """

    def __init__(
        self,
        pass_documents,
        config: PipelineConfig,
        vocab: Vocab,
        *,
        shuffle: bool,
        word_starts,
        unigram_counts,
        word_tags: bool = False,
        similar_words: SimilarWords | None = None,
    ):
        self.pass_documents = pass_documents
        self.word_tags = word_tags
        self.similar_words = similar_words
        self.config = config
        self.vocab = vocab
        self.shuffle = shuffle
        self.word_starts = word_starts
        self.unigram_counts = unigram_counts
        self.base = tf.constant([config.seed, 0], tf.int64)
        self.random_base = tf.constant([config.seed + 1, 0], tf.int64)
        self.pair_format = resolve_pair_format(config, vocab)

    def copy_of(self, epoch: tf.Tensor) -> tf.Tensor:
        return epoch % self.config.dupe_factor

    def rows(self, epoch: tf.Tensor) -> tf.data.Dataset:
        """The masked rows of pass `epoch` ([] int64), in the config's format."""
        if self.config.format in ("segment_pair", "sentence_pair"):
            random_docs = None if self.config.sentence_objective == "none" else self.random_documents(epoch)
            return _pair_rows(self.documents(epoch), random_docs, self)
        return _filled_rows(self.documents(epoch), self)

    def documents(self, epoch: tf.Tensor) -> tf.data.Dataset:
        """The pass's documents, ordered by the copy, not the epoch: pass e + dupe_factor reads
        what pass e read."""
        order_seed = instances.derive_seed(self.base, self.copy_of(epoch))
        block = self.config.document_shuffle_buffer if self.shuffle else 1
        return self.pass_documents(epoch, order_seed, block=block, shuffle_files=self.shuffle)

    def random_documents(self, epoch: tf.Tensor) -> tf.data.Dataset:
        """Documents for random B's, endless within the pass (a pass has more chunks than
        document pairs): round r re-reads this host's files in another order, seeded by
        (copy, r)."""
        return tf.data.Dataset.range(2**62).flat_map(lambda r: self._random_round(epoch, r))

    def _random_round(self, epoch: tf.Tensor, r: tf.Tensor) -> tf.data.Dataset:
        order_seed = instances.derive_seed(self.random_base, self.copy_of(epoch), r)
        block = max(self.config.document_shuffle_buffer, 2)
        return self.pass_documents(epoch, order_seed, block=block, shuffle_files=True)

    def mask(self, row, epoch: tf.Tensor, doc_id: tf.Tensor, index: tf.Tensor) -> dict[str, tf.Tensor]:
        """The formatted row masked as the config says (or marked maskable, "in_step"), seeded
        by the copy (static) or the epoch (dynamic), the document and the row's index in it."""
        config, vocab = self.config, self.vocab
        if self.word_tags:
            row = masking.untag_words(row)
        if config.masking == "in_step":
            return masking.mark_maskable(
                row, mask_id=vocab.mask_id, never_mask_ids=(vocab.cls_id, vocab.sep_id)
            )
        mask_epoch = self.copy_of(epoch) if config.masking == "static" else epoch
        mask_seed = instances.derive_seed(self.base, _SALT_MASK, mask_epoch, doc_id, index)
        if config.masking_unit == "span":
            return masking.mask_spans(
                row,
                seed=mask_seed,
                mask_id=vocab.mask_id,
                never_mask_ids=(vocab.cls_id, vocab.sep_id),
                masked_lm_prob=config.masked_lm_prob,
                max_predictions_per_seq=config.max_predictions_per_seq,
                word_starts=self.word_starts,
                unigram_counts=self.unigram_counts,
                geometric_p=config.span_geometric_p,
                max_span_words=config.span_max_words,
                max_pair_targets=config.sbo_max_targets,
            )
        return masking.mask_tokens(
            row,
            seed=mask_seed,
            vocab_size=vocab.size,
            mask_id=vocab.mask_id,
            never_mask_ids=(vocab.cls_id, vocab.sep_id),
            masked_lm_prob=config.masked_lm_prob,
            max_predictions_per_seq=config.max_predictions_per_seq,
            masking_unit=config.masking_unit,
            word_starts=self.word_starts,
            random_exclude_ids=vocab.random_exclude_ids,
            ngram_probabilities=config.ngram_probabilities,
            replacement=config.replacement,
            similar_words=self.similar_words,
        )


def _pair_rows(
    docs: tf.data.Dataset, random_docs: tf.data.Dataset | None, passes: _Passes
) -> tf.data.Dataset:
    """One pass of SEGMENT-PAIR / SENTENCE-PAIR rows with NSP, SOP or no sentence label.

    docs: this pass's documents. random_docs: an endless stream of documents for random
    B's, zipped two per chunk (NSP, and SOP's one-sentence chunks), so a chunk's random
    B depends only on the pass's copy and the chunk's position in it; None for "none".
    """
    config, vocab, pair_format = passes.config, passes.vocab, passes.pair_format
    objective = config.sentence_objective
    max_num_tokens = config.max_seq_length - pair_layout.get(pair_format).num_specials()

    def chunks(doc):
        seed = instances.derive_seed(passes.base, _SALT_DOC, passes.copy_of(doc["epoch"]), doc["doc_id"])
        rows = instances.chunk_document(
            doc,
            seed=seed,
            # The budget for A + B; chunk_document subtracts BERT's 3 specials itself.
            max_seq_length=max_num_tokens + 3,
            short_seq_prob=config.short_seq_prob,
            random_next_prob=config.next_sentence_prob if objective == "nsp" else 0.0,
            max_chunk_sentences=2 if config.format == "sentence_pair" else None,
        )
        rows["epoch"] = tf.fill(tf.shape(rows["chunk_index"]), doc["epoch"])
        return tf.data.Dataset.from_tensor_slices(rows)

    def pair(chunk, candidates=None):
        epoch = chunk["epoch"]
        seed = instances.derive_seed(
            passes.base, _SALT_PAIR, passes.copy_of(epoch), chunk["doc_id"], chunk["chunk_index"]
        )
        if objective == "nsp":
            pair = instances.attach_random_b(chunk, candidates, seed=seed)
        elif objective == "sop":
            # ALBERT: only a one-sentence chunk (is_random_next) gets another document's B;
            # the others keep their own B, swapped with probability 1/2.
            pair = instances.attach_random_b(chunk, candidates, seed=seed)
            pair = instances.swap_segments(pair, seed=seed)
        else:  # a one-sentence chunk keeps an empty B: `[CLS] A [SEP] [SEP]`
            pair = dict(chunk, valid=tf.constant(True))
        pair = instances.truncate_pair(pair, seed=seed, max_num_tokens=max_num_tokens)
        row = instances.format_pair(
            pair,
            max_seq_length=config.max_seq_length,
            cls_id=vocab.cls_id,
            sep_id=vocab.sep_id,
            pad_id=vocab.pad_id,
            pair_format=pair_format,
        )
        if objective == "none":
            del row["sentence_label"]
        return pair["valid"], passes.mask(row, epoch, chunk["doc_id"], chunk["chunk_index"])

    ds = docs.flat_map(chunks)
    if objective != "none":
        # A random B comes from a second, differently ordered stream of documents.
        random_docs = random_docs.map(
            lambda d: {k: d[k] for k in ("token_ids", "sentence_lengths", "doc_id")}
        )
        ds = tf.data.Dataset.zip(ds, random_docs.ragged_batch(2))
    ds = ds.map(pair, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return _flagged_rows(ds)


def _filled_rows(docs: tf.data.Dataset, passes: _Passes) -> tf.data.Dataset:
    """One pass of FULL-SENTENCES / DOC-SENTENCES rows (no sentence label); DOC-SENTENCES packed.

    The scans start empty and a flush element after the pass's last sentence (and last
    example) emits the open row, so no row spans two passes and a pass's rows depend only
    on its documents.
    """
    config, vocab = passes.config, passes.vocab
    length = config.max_seq_length
    cross = config.format == "full_sentences"
    ds = docs.flat_map(lambda doc: tf.data.Dataset.from_tensor_slices(instances.split_sentences(doc)))
    ds = ds.concatenate(tf.data.Dataset.from_tensor_slices(instances.flush_sentences()))
    fill = functools.partial(
        instances.fill_step, max_tokens=length - 2, cross_documents=cross, sep_id=vocab.sep_id
    )
    ds = _flagged_rows(ds.scan(instances.fill_initial_state(length - 2), fill))

    def single(row):
        out = instances.format_single(
            row, max_seq_length=length, cls_id=vocab.cls_id, sep_id=vocab.sep_id, pad_id=vocab.pad_id
        )
        return dict(out, doc_id=row["doc_id"], sentence_index=row["sentence_index"], epoch=row["epoch"])

    ds = ds.map(single, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if config.packed:
        ds = ds.concatenate(tf.data.Dataset.from_tensors(instances.flush_example(length)))
        pack = functools.partial(instances.pack_step, max_seq_length=length, pad_id=vocab.pad_id)
        ds = _flagged_rows(ds.scan(instances.pack_initial_state(length), pack))

    def finish(row):
        key = (row.pop("epoch"), row.pop("doc_id"), row.pop("sentence_index"))
        return passes.mask(row, *key)

    return ds.map(finish, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _xlnet_batches(
    files: list[str],
    config: PipelineConfig,
    vocab: Vocab,
    rows: int,
    *,
    shuffle: bool,
    first_epoch: int,
    shard_documents: bool,
    process_index: int,
    process_count: int,
    word_starts,
) -> tf.data.Dataset:
    """XLNet's batches (format "xlnet_stream", data/xlnet_stream.py): row r of every batch
    continues row r of the batch before, from stream r of this host's documents.

    Each stream reads its own documents (every rows-th of each pass, shuffled in blocks of
    document_shuffle_buffer / rows), ends each with <eod> (backwards in the odd streams with
    bi_data), and cuts the tokens into chunks of reuse_len, which a scan gathers into the
    window of each row; the streams are interleaved one window each, in row order, and
    batched. All scan states are saved with the iterator (exact resume). The rows are
    seeded by (seed, host, stream, window), so no two rows of a run draw alike.

    The cost to watch at scale: each stream reads every record of the host's files and keeps
    its own (records are parsed only by their stream), so a pass is read R times, with R
    times the open file readers; at the paper's 64 rows per host (8192 rows on 128 hosts)
    that is cheap next to the step, on a few hosts with many rows each it may not be (a
    single reader that routes documents to the streams would remove it).
    """
    if vocab.eod_id is None:
        raise ConfigError(
            "PipelineConfig.format='xlnet_stream' ends documents with <eod>, which the shards' "
            "tokenizer lacks: preprocess with XLNet's tokenizer (python -m data.tokenizers train "
            "--kind=xlnet_spm, or XLNet's spiece.model)"
        )
    if config.bi_data and rows % 2:
        raise ConfigError(
            f"PipelineConfig.bi_data reads every second row backwards: give each host an even "
            f"number of rows (this host has {rows})"
        )
    streams_config = dataclasses.replace(
        config, document_shuffle_buffer=max(1, config.document_shuffle_buffer // rows)
    )
    base = tf.constant([config.seed, 0], tf.int64)

    def backward(r):
        return tf.logical_and(config.bi_data, r % 2 == 1)

    def stream(r):
        passes = _Passes(
            functools.partial(
                _pass_documents,
                files,
                shard_documents=shard_documents,
                process_index=process_index,
                process_count=process_count,
                stream=(rows, r),
            ),
            streams_config,
            vocab,
            shuffle=shuffle,
            word_starts=None,
            unigram_counts=None,
        )
        docs = tf.data.Dataset.range(first_epoch, 2**62).flat_map(passes.documents)
        tokens = docs.map(lambda doc: xlnet_stream.document_tokens(doc, vocab.eod_id, backward(r))).unbatch()
        chunks = tokens.batch(config.reuse_len, drop_remainder=True)
        windows = _flagged_rows(
            chunks.scan(xlnet_stream.window_initial_state(config), xlnet_stream.window_step)
        )
        return windows.map(lambda window: dict(window, stream=r))

    def row(window):
        r = window.pop("stream")
        seed = instances.derive_seed(base, _SALT_XLNET, process_index, r, window["index"])
        out = xlnet_stream.make_row(
            window,
            seed,
            backward(r),
            config=config,
            sep_id=vocab.sep_id,
            cls_id=vocab.cls_id,
            word_starts=word_starts,
        )
        del out["continuation"]
        return out

    ds = tf.data.Dataset.range(rows).interleave(stream, cycle_length=rows, block_length=1)
    ds = ds.map(row, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.batch(rows, drop_remainder=True)


@functools.lru_cache(maxsize=8)
def _shards_tokenizer(data_dir: str, fingerprint: str | None):
    """The shards' tokenizer (DATA_DIR/tokenizer), read once per shards (`fingerprint`: the
    manifest's; rewritten shards are read again): every evaluation builds its dataset anew."""
    del fingerprint  # the cache key only
    return tokenizers.load_tokenizer(os.path.join(data_dir, shards.TOKENIZER_DIR))


def load_word_starts(data_dir: str, fingerprint: str | None = None):
    """[vocab_size] bool word-start table of the shards' tokenizer (DATA_DIR/tokenizer); read
    once per `fingerprint` (the manifest's) when given."""
    if fingerprint is None:
        tokenizer = tokenizers.load_tokenizer(os.path.join(data_dir, shards.TOKENIZER_DIR))
    else:
        tokenizer = _shards_tokenizer(data_dir, fingerprint)
    if not hasattr(tokenizer, "word_start_mask"):
        raise ValueError(
            f"the tokenizer in {data_dir}/{shards.TOKENIZER_DIR} has no word_start_mask(): "
            "use PipelineConfig.masking_unit = 'token' or a tokenizer backend that marks word starts"
        )
    return tokenizer.word_start_mask()


@functools.lru_cache(maxsize=8)
def _similar_words(path: str, data_dir: str, fingerprint: str | None) -> SimilarWords:
    """MacBERT's table for the shards' tokenizer, read once (not at every evaluation)."""
    return similar_words.load(path, _shards_tokenizer(data_dir, fingerprint))


# A Chinese corpus: more of the tokens than this are single CJK characters.
_CJK_SHARE = 0.3


def _word_tags(manifest: shards.Manifest, config: PipelineConfig) -> bool:
    """Whether the masking's words take the shards' segmenter words (a masking unit of words,
    and shards preprocessed with --word_segmenter). Shards without them: a one-line error
    when the config requires them, and a warning when the text is Chinese (each character
    would be its own word)."""
    by_words = config.masking_unit in WORD_UNITS
    if manifest.word_segmenter is not None:
        return by_words
    if config.require_word_segmenter:
        raise ConfigError(
            f"PipelineConfig.require_word_segmenter: the shards in {manifest.directory} have no segmenter's "
            "words: preprocess them with --word_segmenter=jieba (Chinese whole-word masking)"
        )
    if by_words and shards.UNIGRAM_COUNTS in manifest.fields:
        _warn_character_masking(manifest.directory, manifest.fields.get("fingerprint"), config.masking_unit)
    return False


@functools.lru_cache(maxsize=8)
def _warn_character_masking(data_dir: str, fingerprint: str | None, unit: str) -> None:
    """`_word_tags`'s warning, once per shards and unit (not at every evaluation)."""
    manifest = shards.load_manifest(data_dir)
    tokenizer = _shards_tokenizer(data_dir, fingerprint)
    vocab = [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
    share = word_segmentation.cjk_token_share(vocab, manifest.unigram_counts())
    if share > _CJK_SHARE:
        logging.warning(
            "masking_unit=%r on shards whose tokens are %.0f%% single CJK characters, made without a "
            "word segmenter: every character is its own word, so this is character masking. For Chinese "
            "whole-word masking preprocess with --word_segmenter=jieba",
            unit,
            100 * share,
        )


# AutoGraph off for everything built here (the maps, scans and flat_maps of every stage
# capture this): the row functions branch only on Python values, so converting their source
# changes nothing but costs about 1.5 s of every dataset build on 2 cores (same rows, by the
# pinned-output tests).
@tf.autograph.experimental.do_not_convert
def make_dataset(
    data_dir: str,
    split: str,
    config: PipelineConfig,
    batch_size: int,
    *,
    process_index: int = 0,
    process_count: int = 1,
    shuffle: bool = True,
    first_epoch: int = 0,
) -> tf.data.Dataset:
    """Endless dataset of per-host batches of `batch_size` rows (fixed shapes).

    Args:
      data_dir: output directory of `data.preprocess` (manifest.json + shards).
      split: "train" or "eval".
      config: instance and masking options.
      batch_size: rows per batch on this host (global batch / process count).
      process_index, process_count: this host's place among the hosts reading the data.
      shuffle: False gives a fixed order (eval): documents and instances unshuffled.
      first_epoch: number of the first epoch (eval uses a fixed epoch, so fixed masks).
    """
    manifest = shards.load_manifest(data_dir)
    vocab = manifest.vocab
    xlnet = config.format == "xlnet_stream"
    fingerprint = manifest.fields.get("fingerprint")
    word_starts = None
    if config.masking_unit != "token" or xlnet:
        word_starts = load_word_starts(data_dir, fingerprint)
    word_tags = _word_tags(manifest, config)
    similar = None
    if config.similar_words is not None:
        similar = _similar_words(config.similar_words, data_dir, fingerprint)
    unigram_counts = manifest.unigram_counts() if config.masking_unit == "span" else None
    files, shard_documents = host_files(
        data_dir, split, process_index, process_count, rows=batch_size if xlnet else 1
    )
    options = tf.data.Options()
    options.deterministic = True
    if xlnet:
        ds = _xlnet_batches(
            files,
            config,
            vocab,
            batch_size,
            shuffle=shuffle,
            first_epoch=first_epoch,
            shard_documents=shard_documents,
            process_index=process_index,
            process_count=process_count,
            word_starts=tf.constant(word_starts, tf.bool),
        )
        return ds.prefetch(2).with_options(options)
    ds = instance_stream(
        files,
        config,
        vocab,
        shuffle=shuffle,
        first_epoch=first_epoch,
        shard_documents=shard_documents,
        process_index=process_index,
        process_count=process_count,
        word_starts=word_starts,
        unigram_counts=unigram_counts,
        word_tags=word_tags,
        similar_words=similar,
    )
    return ds.batch(batch_size, drop_remainder=True).prefetch(2).with_options(options)
