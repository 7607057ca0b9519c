"""tf.data ops that turn tokenized documents into BERT sentence-pair instances.

This is google-research/bert `create_pretraining_data.py::create_instances_from_document`
rewritten as graph ops, so that it runs inside tf.data (parallel, no Python per
example) and the iterator can be checkpointed for exact resume. Every op is a small
dict -> dict function that works eagerly and inside `Dataset.map`.

The stages, in pipeline order:

1. `parse_document`: a serialized `tf.train.Example` from `data.preprocess` ->
   `{"token_ids": [T] int32, "sentence_lengths": [S] int32, "doc_id": [] int64}`.
2. `chunk_document`: BERT's greedy loop over sentences. It fills a per-document
   target length (`max_seq_length - 3`, or with probability `short_seq_prob` a random
   length in [2, max_seq_length - 3], drawn once per document as in the original),
   splits each chunk at a random sentence boundary into A and B, and decides IsNext /
   NotNext (50/50; always NotNext for a one-sentence chunk). For NotNext the sentences
   that would have been B are "put back" and start the next chunk. Output: one row per
   chunk, `a_tokens` / `b_tokens` ragged ([C, None] int32, `b_tokens` empty for NotNext).
3. `attach_random_b`: for NotNext chunks, B is taken from a random *other* document
   (two candidates come with each chunk from a separately shuffled document stream; the
   first whose `doc_id` differs is used): a random start sentence, then sentences until
   `target_seq_length - len(A)` tokens are reached or the document ends. The
   instance is marked invalid (and filtered) when both candidates are the current
   document, which happens only with tiny shuffle buffers.
4. `truncate_pair`: BERT's `truncate_seq_pair`: remove tokens from the longer side
   (B on ties), each from the front or the back with probability 1/2, until
   len(A) + len(B) <= max_seq_length - 3. Done in closed form (how many tokens each
   side loses is determined by the lengths; how many of those come off the front is
   Binomial(k, 1/2)), which is the same distribution as the original loop.
5. `format_pair`: `[CLS] A [SEP] B [SEP]`, padded to max_seq_length: input_ids,
   input_mask, segment_ids (0 for CLS, A and the first SEP; 1 for B and the last SEP),
   positions, and `sentence_label` (0 = IsNext, 1 = NotNext, as in the original code and
   in the published NSP heads).

The other formats (`PipelineConfig.format`, `sentence_objective`) reuse these stages:
RoBERTa's SENTENCE-PAIR is `chunk_document(max_chunk_sentences=2)`; ALBERT's SOP
follows stage 3 (which then only fills one-sentence chunks) with `swap_segments`;
`format_pair(pair_format="roberta")` gives
`<s> A </s></s> B </s>`. FULL-SENTENCES and DOC-SENTENCES split documents into
sentences (`split_sentences`), fill rows with `fill_step` (a `Dataset.scan` step, so its
state is part of the iterator checkpoint), format them with `format_single` and, for
DOC-SENTENCES, pack short rows together with `pack_step`; `flush_sentences` /
`flush_example` close the open row at the end of a pass.

Randomness is stateless (`tf.random.stateless_*`) with seeds derived from the run seed,
the epoch copy, the document id and the chunk index, so the stream depends only on
those and not on tf.data's parallelism.
"""

from __future__ import annotations

from typing import Mapping

import tensorflow as tf

from data import masking, pair_layout, shards

Features = Mapping[str, tf.Tensor]

# Salts keep the random streams of different decisions independent.
_SALT_TARGET = 1
_SALT_CHUNK = 2
_SALT_RANDOM_B = 3
_SALT_TRUNCATE = 4
_SALT_SWAP = 5


def derive_seed(seed: tf.Tensor, *parts) -> tf.Tensor:
    """Folds integers into a stateless seed. seed: [2] int64 -> [2] int64."""
    seed = tf.cast(seed, tf.int64)
    for part in parts:
        seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(part, tf.int64))
    return seed


def parse_document(serialized: tf.Tensor, word_tags: bool = False) -> dict[str, tf.Tensor]:
    """Parses one document record written by `data.preprocess`.

    Returns token_ids [T] int32, sentence_lengths [S] int32, doc_id [] int64. word_tags: the
    tokens that continue a segmenter's word (the record's `word_continues`) carry
    `masking.WORD_TAG` in their ids, for whole-word masking (`masking.untag_words`).
    """
    features = {
        "token_ids": tf.io.RaggedFeature(tf.int64),
        "sentence_lengths": tf.io.RaggedFeature(tf.int64),
        "doc_id": tf.io.FixedLenFeature([], tf.int64),
    }
    if word_tags:
        features[shards.WORD_CONTINUES] = tf.io.RaggedFeature(tf.int64)
    parsed = tf.io.parse_single_example(serialized, features)
    token_ids = tf.cast(parsed["token_ids"], tf.int32)
    if word_tags:
        token_ids = masking.tag_words(token_ids, parsed[shards.WORD_CONTINUES])
    return {
        "token_ids": token_ids,
        "sentence_lengths": tf.cast(parsed["sentence_lengths"], tf.int32),
        "doc_id": parsed["doc_id"],
    }


def _uniform(seed: tf.Tensor, shape) -> tf.Tensor:
    return tf.random.stateless_uniform(shape, seed=seed, dtype=tf.float32)


def _randint(u: tf.Tensor, low: tf.Tensor, high: tf.Tensor) -> tf.Tensor:
    """Maps u ~ U[0, 1) to an integer in [low, high] inclusive (like random.randint)."""
    low = tf.cast(low, tf.int32)
    span = tf.cast(high, tf.int32) - low + 1
    return low + tf.minimum(tf.cast(u * tf.cast(span, tf.float32), tf.int32), span - 1)


def chunk_document(
    doc: Features,
    *,
    seed: tf.Tensor,
    max_seq_length: int,
    short_seq_prob: float,
    random_next_prob: float = 0.5,
    max_chunk_sentences: int | None = None,
) -> dict[str, tf.Tensor]:
    """BERT's chunking loop for one document (stage 2 in the module docstring).

    Args:
      doc: token_ids [T] int32, sentence_lengths [S] int32 (all > 0), doc_id [] int64.
      seed: [2] int64 stateless seed for this document and epoch copy.
      max_seq_length: full row length including [CLS] and two [SEP].
      short_seq_prob: probability of a random shorter target length for the document.
      random_next_prob: probability of NotNext for chunks of >= 2 sentences (0 disables
        NotNext except for one-sentence chunks, which have no B of their own).
      max_chunk_sentences: also close a chunk at this many sentences. 2 gives RoBERTa's
        SENTENCE-PAIR: A and B are one natural sentence each (and a NotNext B is one
        sentence of another document, `target_b_length` 1).

    Returns:
      A dict of C rows (C = number of chunks): a_tokens [C, None] int32 ragged,
      b_tokens [C, None] int32 ragged (empty rows for NotNext), is_random_next [C] bool,
      target_b_length [C] int32, chunk_index [C] int32, doc_id [C] int64.
    """
    lengths = doc["sentence_lengths"]
    num_sentences = tf.shape(lengths)[0]
    max_num_tokens = max_seq_length - 3
    target_draws = _uniform(derive_seed(seed, _SALT_TARGET), [2])
    target_seq_length = tf.where(
        target_draws[0] < short_seq_prob,
        _randint(target_draws[1], 2, max_num_tokens),
        tf.constant(max_num_tokens, tf.int32),
    )
    # Each chunk consumes at least one sentence, so S rows of draws always suffice.
    draws = _uniform(derive_seed(seed, _SALT_CHUNK), tf.stack([num_sentences, 2]))
    ends = tf.cumsum(lengths)  # ends[i] = token offset just after sentence i

    def body(i, chunk_start, chunk_index, out):
        chunk_len = ends[i] - tf.where(chunk_start > 0, ends[chunk_start - 1], 0)
        close = tf.logical_or(i == num_sentences - 1, chunk_len >= target_seq_length)
        if max_chunk_sentences is not None:
            close = tf.logical_or(close, i + 1 - chunk_start >= max_chunk_sentences)

        def emit():
            n = i + 1 - chunk_start
            a_count = tf.where(n >= 2, _randint(draws[chunk_index, 0], 1, n - 1), 1)
            a_end = chunk_start + a_count
            is_random = tf.logical_or(n == 1, draws[chunk_index, 1] < random_next_prob)
            a_tokens = ends[a_end - 1] - tf.where(chunk_start > 0, ends[chunk_start - 1], 0)
            row = tf.stack(
                [
                    chunk_start,
                    a_end,
                    a_end,
                    tf.where(is_random, a_end, i + 1),
                    tf.cast(is_random, tf.int32),
                    target_seq_length - a_tokens if max_chunk_sentences is None else 1,
                ]
            )
            # NotNext puts the unused sentences back: the next chunk starts right after A.
            next_i = tf.where(is_random, a_end, i + 1)
            return next_i, next_i, chunk_index + 1, out.write(chunk_index, row)

        def carry_on():
            return i + 1, chunk_start, chunk_index, out

        return tf.cond(close, emit, carry_on)

    out = tf.TensorArray(tf.int32, size=0, dynamic_size=True, element_shape=[6])
    _, _, num_chunks, out = tf.while_loop(
        lambda i, *_: i < num_sentences, body, (tf.constant(0), tf.constant(0), tf.constant(0), out)
    )
    rows = tf.reshape(out.stack(), [-1, 6])
    starts = tf.concat([[0], ends], axis=0)  # starts[j] = token offset of sentence j
    token_ids = doc["token_ids"]

    def token_span(first_sentence, end_sentence):
        return tf.gather(
            token_ids, tf.ragged.range(tf.gather(starts, first_sentence), tf.gather(starts, end_sentence))
        )

    return {
        "a_tokens": token_span(rows[:, 0], rows[:, 1]),
        "b_tokens": token_span(rows[:, 2], rows[:, 3]),
        "is_random_next": tf.cast(rows[:, 4], tf.bool),
        "target_b_length": rows[:, 5],
        "chunk_index": tf.range(num_chunks),
        "doc_id": tf.fill([num_chunks], doc["doc_id"]),
    }


def attach_random_b(chunk: Features, candidates: Features, *, seed: tf.Tensor) -> dict[str, tf.Tensor]:
    """Fills B of a NotNext chunk from a random other document (stage 3).

    Args:
      chunk: one row of `chunk_document` (a_tokens [A], b_tokens [B], is_random_next,
        target_b_length, chunk_index, doc_id).
      candidates: two documents, token_ids [2, None] ragged int32, sentence_lengths
        [2, None] ragged int32, doc_id [2] int64.
      seed: [2] int64 seed of this chunk.

    Returns:
      The chunk with b_tokens filled for NotNext, `b_doc_id` [] int64 (the document B
      came from) and `valid` [] bool (False only if no other document was available).
    """
    ids = candidates["doc_id"]
    use_second = tf.equal(ids[0], chunk["doc_id"])
    pick = tf.cast(use_second, tf.int32)
    token_ids = candidates["token_ids"][pick]
    lengths = candidates["sentence_lengths"][pick]
    other_doc = tf.not_equal(ids[pick], chunk["doc_id"])

    num_sentences = tf.shape(lengths)[0]
    start = _randint(_uniform(derive_seed(seed, _SALT_RANDOM_B), [1])[0], 0, num_sentences - 1)
    # Take sentences from `start` until at least target_b_length tokens (or the end).
    taken = tf.cumsum(lengths[start:])
    count = tf.minimum(
        tf.reduce_sum(tf.cast(taken < chunk["target_b_length"], tf.int32)) + 1, num_sentences - start
    )
    offsets = tf.concat([[0], tf.cumsum(lengths)], axis=0)
    random_b = token_ids[offsets[start] : offsets[start + count]]

    is_random = chunk["is_random_next"]
    out = dict(chunk)
    out["b_tokens"] = tf.cond(is_random, lambda: random_b, lambda: chunk["b_tokens"])
    out["b_doc_id"] = tf.where(is_random, ids[pick], chunk["doc_id"])
    out["valid"] = tf.logical_or(tf.logical_not(is_random), other_doc)
    return out


def truncate_pair(pair: Features, *, seed: tf.Tensor, max_num_tokens: int) -> dict[str, tf.Tensor]:
    """BERT's truncate_seq_pair in closed form (stage 4).

    pair: a_tokens [A] int32, b_tokens [B] int32. Returns the pair with both
    truncated so that len(A) + len(B) <= max_num_tokens.
    """
    a, b = pair["a_tokens"], pair["b_tokens"]
    len_a, len_b = tf.size(a), tf.size(b)
    excess = tf.maximum(len_a + len_b - max_num_tokens, 0)
    # The original always trims the longer side (B on ties). Until the two are equal
    # only the longer loses tokens; after that they alternate, B first.
    gap = tf.abs(len_a - len_b)
    from_longer = tf.minimum(excess, gap)
    rest = excess - from_longer
    a_loses = tf.where(len_a > len_b, from_longer, 0) + rest // 2
    b_loses = tf.where(len_a > len_b, 0, from_longer) + (rest + 1) // 2
    coins = _uniform(derive_seed(seed, _SALT_TRUNCATE), tf.stack([2, tf.maximum(len_a, len_b)])) < 0.5
    a_front = tf.reduce_sum(tf.cast(coins[0, :a_loses], tf.int32))
    b_front = tf.reduce_sum(tf.cast(coins[1, :b_loses], tf.int32))
    out = dict(pair)
    out["a_tokens"] = a[a_front : len_a - (a_loses - a_front)]
    out["b_tokens"] = b[b_front : len_b - (b_loses - b_front)]
    return out


def format_pair(
    pair: Features, *, max_seq_length: int, cls_id: int, sep_id: int, pad_id: int, pair_format: str = "bert"
) -> dict[str, tf.Tensor]:
    """The pair as one padded row (stage 5), in the layout `pair_format` names
    (data/pair_layout.py): "bert" `[CLS] A [SEP] B [SEP]` with segment ids 0 then 1, or
    "roberta" `<s> A </s></s> B </s>` with segment ids all 0 (cls_id / sep_id are <s> / </s>).

    pair: a_tokens [A] int32, b_tokens [B] int32 (A + B <= max_seq_length - the layout's
    num_specials()), is_random_next [] bool. Returns input_ids, input_mask, segment_ids,
    positions (all [max_seq_length] int32) and sentence_label [] int32 (1 = NotNext, or
    swapped for SOP).
    """
    layout = pair_layout.get(pair_format)
    tokens, segment = layout.tensors(pair["a_tokens"], pair["b_tokens"], cls_id=cls_id, sep_id=sep_id)
    result = _pad_row(tokens, segment, max_seq_length, pad_id)
    result["sentence_label"] = tf.cast(pair["is_random_next"], tf.int32)
    return result


def _pad_row(tokens: tf.Tensor, segment: tf.Tensor, max_seq_length: int, pad_id: int) -> dict[str, tf.Tensor]:
    n = tf.size(tokens)
    pad = max_seq_length - n
    result = {
        "input_ids": tf.pad(tokens, [[0, pad]], constant_values=pad_id),
        "input_mask": tf.pad(tf.ones([n], tf.int32), [[0, pad]]),
        "segment_ids": tf.pad(segment, [[0, pad]]),
        "positions": tf.range(max_seq_length, dtype=tf.int32),
    }
    for key in ("input_ids", "input_mask", "segment_ids"):
        result[key] = tf.ensure_shape(result[key], [max_seq_length])
    return result


def swap_segments(pair: Features, *, seed: tf.Tensor) -> dict[str, tf.Tensor]:
    """ALBERT's sentence-order prediction on a chunk from `chunk_document(random_next_prob=0)`.

    As google-research/albert create_pretraining_data.py `create_instances_from_document`
    (default random_next_sentence=False): a chunk with its own B swaps A and B with
    probability 1/2, and the label is `is_random_next`, 1 = swapped, 0 = in order (its
    swap branch sets is_random_next = True). A one-sentence chunk has no B of its own: it
    arrives with `is_random_next` True and B from another document (`attach_random_b`),
    is never swapped and keeps label 1, as ALBERT's random-document branch, which comes
    before the swap branch.

    pair: a_tokens [A], b_tokens [B] int32, is_random_next [] bool, optional valid [] bool.
    Returns the pair with a_tokens / b_tokens possibly swapped, is_random_next, and
    valid [] bool (False when B is empty: a one-sentence chunk that got no random B).
    """
    from_other_document = pair["is_random_next"]
    draw = _uniform(derive_seed(seed, _SALT_SWAP), [1])[0] < 0.5
    swap = tf.logical_and(draw, tf.logical_not(from_other_document))
    out = dict(pair)
    out["a_tokens"] = tf.cond(swap, lambda: pair["b_tokens"], lambda: pair["a_tokens"])
    out["b_tokens"] = tf.cond(swap, lambda: pair["a_tokens"], lambda: pair["b_tokens"])
    out["is_random_next"] = tf.logical_or(swap, from_other_document)
    out["valid"] = tf.logical_and(pair.get("valid", tf.constant(True)), tf.size(pair["b_tokens"]) > 0)
    return out


def split_sentences(doc: Features) -> dict[str, tf.Tensor]:
    """A document as S rows of one sentence each, for FULL-/DOC-SENTENCES.

    doc: token_ids [T], sentence_lengths [S] int32, doc_id [] int64, epoch [] int64.
    Returns tokens [S, None] ragged int32, doc_id [S] int64, sentence_index [S] int32,
    epoch [S] int64.
    """
    lengths = doc["sentence_lengths"]
    num = tf.shape(lengths)[0]
    return {
        "tokens": tf.RaggedTensor.from_row_lengths(doc["token_ids"], lengths),
        "doc_id": tf.fill([num], doc["doc_id"]),
        "sentence_index": tf.range(num),
        "epoch": tf.fill([num], doc["epoch"]),
    }


def flush_sentences() -> dict[str, tf.Tensor]:
    """One empty sentence (real ones never are), on which `fill_step` emits its open row.

    In the form of `split_sentences` output (S = 1, so `Dataset.from_tensor_slices` gives
    elements of the same spec); doc_id -1 is no document's.
    """
    return {
        "tokens": tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.int32), tf.constant([0], tf.int32)),
        "doc_id": tf.constant([-1], tf.int64),
        "sentence_index": tf.constant([0]),
        "epoch": tf.constant([-1], tf.int64),
    }


def fill_initial_state(max_tokens: int) -> dict[str, tf.Tensor]:
    """The empty state of `fill_step` (a fixed-size buffer, so tf.data's scan keeps one shape)."""
    return {
        "tokens": tf.zeros([max_tokens], tf.int32),
        "length": tf.constant(0),
        "last_doc": tf.constant(-1, tf.int64),
        "first_doc": tf.constant(-1, tf.int64),
        "first_sentence": tf.constant(0),
        "epoch": tf.constant(0, tf.int64),
    }


def fill_step(
    state: Features, sentence: Features, *, max_tokens: int, cross_documents: bool, sep_id: int
) -> tuple[dict[str, tf.Tensor], tuple[tf.Tensor, dict[str, tf.Tensor]]]:
    """One step of RoBERTa's FULL-/DOC-SENTENCES filling, for `tf.data.Dataset.scan`.

    Contiguous sentences are appended to a buffer of at most `max_tokens`; a sentence
    that does not fit closes the row (emitted) and starts the next one. cross_documents
    True (FULL-SENTENCES): a new document continues the row after one extra `sep_id`
    separator; False (DOC-SENTENCES): a new document always closes the row. A sentence
    longer than max_tokens is cut to max_tokens (fairseq's blocks would keep it whole
    and drop it by length; rare with natural sentences). An empty sentence
    (`flush_sentences`, the end of a pass) closes the open row and leaves the state empty.

    state: `fill_initial_state`. sentence: a row of `split_sentences` or `flush_sentences()`.
    Returns (new state, (emit [] bool, row)): row has tokens [N] int32 (N <= max_tokens),
    doc_id [] int64 and sentence_index [] int32 of its first sentence, epoch [] int64.
    """
    sent = sentence["tokens"][:max_tokens]
    flush = tf.equal(tf.size(sent), 0)
    length = state["length"]
    new_doc = tf.logical_and(length > 0, tf.not_equal(state["last_doc"], sentence["doc_id"]))
    if cross_documents:
        piece = tf.concat([tf.fill([tf.cast(new_doc, tf.int32)], sep_id), sent], 0)
    else:
        piece = sent
    close = tf.logical_and(length > 0, tf.logical_or(length + tf.size(piece) > max_tokens, flush))
    if not cross_documents:
        close = tf.logical_or(close, new_doc)
    row = {
        "tokens": state["tokens"][:length],
        "doc_id": state["first_doc"],
        "sentence_index": state["first_sentence"],
        "epoch": state["epoch"],
    }
    keep = tf.where(close, 0, length)
    appended = tf.cond(close, lambda: sent, lambda: piece)  # a new row never starts with a separator
    buffer = tf.concat([state["tokens"][:keep], appended, tf.zeros([max_tokens], tf.int32)], 0)[:max_tokens]
    starts_row = tf.logical_or(close, length == 0)
    new_state = {
        "tokens": tf.ensure_shape(buffer, [max_tokens]),
        "length": keep + tf.size(appended),
        "last_doc": sentence["doc_id"],
        "first_doc": tf.where(starts_row, sentence["doc_id"], state["first_doc"]),
        "first_sentence": tf.where(starts_row, sentence["sentence_index"], state["first_sentence"]),
        "epoch": tf.where(starts_row, sentence["epoch"], state["epoch"]),
    }
    return new_state, (close, row)


def format_single(
    row: Features, *, max_seq_length: int, cls_id: int, sep_id: int, pad_id: int
) -> dict[str, tf.Tensor]:
    """`[CLS] X [SEP]` (RoBERTa: `<s> X </s>`) padded to max_seq_length, segment_ids all 0.

    row: tokens [N] int32, N <= max_seq_length - 2. Returns input_ids, input_mask,
    segment_ids, positions, all [max_seq_length] int32.
    """
    tokens = tf.concat([[cls_id], row["tokens"], [sep_id]], axis=0)
    return _pad_row(tokens, tf.zeros_like(tokens), max_seq_length, pad_id)


def flush_example(max_seq_length: int) -> dict[str, tf.Tensor]:
    """An example with no tokens (real ones have at least [CLS] [SEP]): `pack_step` emits
    its open row on it. Same keys and shapes as `format_single` output plus doc_id,
    sentence_index, epoch."""
    zeros = tf.zeros([max_seq_length], tf.int32)
    return {
        "input_ids": zeros,
        "input_mask": zeros,
        "segment_ids": zeros,
        "positions": tf.range(max_seq_length, dtype=tf.int32),
        "doc_id": tf.constant(-1, tf.int64),
        "sentence_index": tf.constant(0),
        "epoch": tf.constant(-1, tf.int64),
    }


def pack_initial_state(max_seq_length: int) -> dict[str, tf.Tensor]:
    """The empty state of `pack_step`."""
    zeros = tf.zeros([max_seq_length], tf.int32)
    return {
        "input_ids": zeros,
        "example_ids": zeros,
        "positions": zeros,
        "length": tf.constant(0),
        "count": tf.constant(0),
        "first_doc": tf.constant(-1, tf.int64),
        "first_sentence": tf.constant(0),
        "epoch": tf.constant(0, tf.int64),
    }


def pack_step(
    state: Features, example: Features, *, max_seq_length: int, pad_id: int
) -> tuple[dict[str, tf.Tensor], tuple[tf.Tensor, dict[str, tf.Tensor]]]:
    """One step of packing DOC-SENTENCES examples into full rows, for `tf.data.Dataset.scan`.

    RoBERTa keeps tokens per batch constant by growing the batch when DOC-SENTENCES rows
    are short; with fixed batch shapes we instead pack consecutive examples greedily
    into one row while they fit. `example_ids` (1..k, 0 = padding) lets the encoder keep
    attention within an example, and `positions` restart at 0 for each example.

    state: `pack_initial_state`. example: `format_single` output plus doc_id,
    sentence_index, epoch, or `flush_example` (closes the open row, leaves the state
    empty). Returns (new state, (emit [] bool, row)): row has input_ids,
    input_mask, segment_ids, positions, example_ids [max_seq_length] int32 and doc_id,
    sentence_index, epoch of its first example.
    """
    n = tf.reduce_sum(example["input_mask"])
    length = state["length"]
    close = tf.logical_and(length > 0, tf.logical_or(length + n > max_seq_length, tf.equal(n, 0)))
    valid = tf.range(max_seq_length) < length
    row = {
        "input_ids": tf.where(valid, state["input_ids"], pad_id),
        "input_mask": tf.cast(valid, tf.int32),
        "segment_ids": tf.zeros([max_seq_length], tf.int32),
        "positions": state["positions"],
        "example_ids": state["example_ids"],
        "doc_id": state["first_doc"],
        "sentence_index": state["first_sentence"],
        "epoch": state["epoch"],
    }
    start = tf.where(close, 0, length)
    count = tf.where(start == 0, 1, state["count"] + 1)  # a row's first example is 1
    index = tf.range(max_seq_length)
    inside = (index >= start) & (index < start + n)
    shifted = tf.roll(example["input_ids"], start, axis=0)  # n <= max_seq_length - start
    keep_old = index < start
    new_state = {
        "input_ids": tf.where(inside, shifted, tf.where(keep_old, state["input_ids"], 0)),
        "example_ids": tf.where(inside, count, tf.where(keep_old, state["example_ids"], 0)),
        "positions": tf.where(inside, index - start, tf.where(keep_old, state["positions"], 0)),
        "length": start + n,
        "count": count,
        "first_doc": tf.where(start == 0, example["doc_id"], state["first_doc"]),
        "first_sentence": tf.where(start == 0, example["sentence_index"], state["first_sentence"]),
        "epoch": tf.where(start == 0, example["epoch"], state["epoch"]),
    }
    return new_state, (close, row)
