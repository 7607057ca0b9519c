"""The per-host tf.data pipeline: document shards -> masked BERT batches.

    shards --(this host's files)--> documents --shuffle--> chunks (instances.chunk_document)
      --zip two random other documents--> pairs (attach_random_b, truncate_pair, format_pair)
      --mask (masking.mask_tokens)--> shuffle --> batch(drop_remainder) --> prefetch

Every document carries the number of the epoch it was read in: instance layout and
static masks use the *copy* `epoch % dupe_factor` (the original wrote `dupe_factor`
differently-masked copies of the data); dynamic masking uses the epoch itself, so every
pass gets fresh masks. All randomness is stateless and seeded, so the stream is a pure
function of (this host's files, config); the iterator is checkpointable with
`tf.train.Checkpoint(iterator=it)` for exact resume.

Batches are dicts of numpy-convertible tensors with the keys of DESIGN.md:
input_ids, input_mask, segment_ids, positions [B, L] int32; masked_lm_positions,
masked_lm_ids [B, P] int32; masked_lm_weights [B, P] float32; sentence_label [B] int32.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import gin
import tensorflow as tf

from data import instances, masking, shards

_SALT_DOC = 11
_SALT_MASK = 12
_SALT_PAIR = 13


@gin.configurable
@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """What instances and masks look like; the recipe part of the data (gin: PipelineConfig)."""

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    next_sentence_prob: float = 0.5  # probability of a NotNext pair (BERT: 0.5)
    masking: str = "static"  # "static" (dupe_factor seeded copies) or "dynamic" (fresh each pass)
    dupe_factor: int = 10
    document_shuffle_buffer: int = 1000
    instance_shuffle_buffer: int = 10000
    seed: int = 12345

    def __post_init__(self):
        if self.masking not in ("static", "dynamic"):
            raise ValueError(f"PipelineConfig.masking must be 'static' or 'dynamic', got {self.masking!r}")
        if self.max_seq_length < 8:
            raise ValueError(f"PipelineConfig.max_seq_length={self.max_seq_length} is too short (>= 8)")
        if self.dupe_factor < 1:
            raise ValueError(f"PipelineConfig.dupe_factor must be >= 1, got {self.dupe_factor}")


@dataclasses.dataclass(frozen=True)
class Vocab:
    """The token ids the pipeline needs, read from the shards' manifest."""

    size: int
    pad_id: int
    cls_id: int
    sep_id: int
    mask_id: int

    @classmethod
    def from_manifest(cls, manifest: dict) -> "Vocab":
        ids = manifest["special_ids"]
        return cls(
            size=manifest["vocab_size"],
            pad_id=ids["pad"],
            cls_id=ids["cls"],
            sep_id=ids["sep"],
            mask_id=ids["mask"],
        )


def host_files(data_dir: str, split: str, process_index: int, process_count: int) -> tuple[list[str], bool]:
    """This host's shard files, and whether documents must be sharded instead of files.

    Each host reads files[process_index::process_count]. With fewer files than hosts every
    host reads all files and keeps every process_count-th document (slower, but no host
    starves and no document is read twice).
    """
    manifest = shards.load_manifest(data_dir)
    files = [os.path.join(data_dir, f) for f in manifest["splits"][split]["files"]]
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


def _documents(
    files: list[str],
    *,
    seed: int,
    shuffle_buffer: int,
    shuffle_files: bool,
    first_epoch: int,
    shard_documents: bool,
    process_index: int,
    process_count: int,
) -> tf.data.Dataset:
    """Endless stream of parsed documents, each tagged with its epoch ([] int64).

    Shuffles stay at the top level of the dataset graph (a shuffle inside a per-epoch
    `flat_map` cannot be checkpointed); the file order of each epoch is a stateless
    permutation seeded by (seed, epoch), identical on every host.
    """
    names = tf.constant(files)

    def epoch_files(epoch):
        order = names
        if shuffle_files and len(files) > 1:
            order = tf.random.experimental.stateless_shuffle(
                names, seed=instances.derive_seed([seed, 0], epoch)
            )
        return tf.data.Dataset.from_tensor_slices(order).map(lambda name: (name, epoch))

    def records(name, epoch):
        return tf.data.TFRecordDataset(name).map(lambda record: (record, epoch))

    ds = tf.data.Dataset.range(first_epoch, 2**62).flat_map(epoch_files)
    ds = ds.interleave(
        records, cycle_length=min(4, len(files)), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )
    if shard_documents:
        ds = ds.shard(process_count, process_index)

    def parse(record, epoch):
        return dict(instances.parse_document(record), epoch=epoch)

    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if shuffle_buffer > 1:
        ds = ds.shuffle(shuffle_buffer, seed=seed)
    return ds


def _is_valid(row, valid):
    del row
    return valid


def _drop_valid(row, valid):
    del valid
    return row


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
) -> tf.data.Dataset:
    """Endless stream of masked rows (unbatched) from these files; see the module docstring."""
    docs = _documents(
        files,
        seed=config.seed,
        shuffle_buffer=config.document_shuffle_buffer if shuffle else 1,
        shuffle_files=shuffle,
        first_epoch=first_epoch,
        shard_documents=shard_documents,
        process_index=process_index,
        process_count=process_count,
    )
    # B of NotNext pairs comes from a second, differently shuffled stream of documents.
    random_docs = _documents(
        files,
        seed=config.seed + 1,
        shuffle_buffer=max(config.document_shuffle_buffer, 2),
        shuffle_files=True,
        first_epoch=first_epoch,
        shard_documents=shard_documents,
        process_index=process_index,
        process_count=process_count,
    )
    random_docs = random_docs.map(lambda d: {k: d[k] for k in ("token_ids", "sentence_lengths", "doc_id")})
    base = tf.constant([config.seed, 0], tf.int64)

    def copy_of(epoch):
        return epoch % config.dupe_factor

    def chunks(doc):
        seed = instances.derive_seed(base, _SALT_DOC, copy_of(doc["epoch"]), doc["doc_id"])
        rows = instances.chunk_document(
            doc,
            seed=seed,
            max_seq_length=config.max_seq_length,
            short_seq_prob=config.short_seq_prob,
            random_next_prob=config.next_sentence_prob,
        )
        rows["epoch"] = tf.fill(tf.shape(rows["chunk_index"]), doc["epoch"])
        return tf.data.Dataset.from_tensor_slices(rows)

    def pair(chunk, candidates):
        epoch = chunk["epoch"]
        seed = instances.derive_seed(base, _SALT_PAIR, copy_of(epoch), chunk["doc_id"], chunk["chunk_index"])
        pair = instances.attach_random_b(chunk, candidates, seed=seed)
        pair = instances.truncate_pair(pair, seed=seed, max_num_tokens=config.max_seq_length - 3)
        row = instances.format_pair(
            pair,
            max_seq_length=config.max_seq_length,
            cls_id=vocab.cls_id,
            sep_id=vocab.sep_id,
            pad_id=vocab.pad_id,
        )
        mask_epoch = copy_of(epoch) if config.masking == "static" else epoch
        mask_seed = instances.derive_seed(base, _SALT_MASK, mask_epoch, chunk["doc_id"], chunk["chunk_index"])
        row = masking.mask_tokens(
            row,
            seed=mask_seed,
            vocab_size=vocab.size,
            mask_id=vocab.mask_id,
            never_mask_ids=(vocab.cls_id, vocab.sep_id),
            masked_lm_prob=config.masked_lm_prob,
            max_predictions_per_seq=config.max_predictions_per_seq,
        )
        return row, pair["valid"]

    ds = tf.data.Dataset.zip(docs.flat_map(chunks), random_docs.ragged_batch(2))
    ds = ds.map(pair, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.filter(_is_valid).map(_drop_valid)
    if shuffle and config.instance_shuffle_buffer > 1:
        ds = ds.shuffle(config.instance_shuffle_buffer, seed=config.seed + 2)
    return ds


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
    vocab = Vocab.from_manifest(manifest)
    files, shard_documents = host_files(data_dir, split, process_index, process_count)
    options = tf.data.Options()
    options.deterministic = True
    ds = instance_stream(
        files,
        config,
        vocab,
        shuffle=shuffle,
        first_epoch=first_epoch,
        shard_documents=shard_documents,
        process_index=process_index,
        process_count=process_count,
    )
    return ds.batch(batch_size, drop_remainder=True).prefetch(2).with_options(options)
