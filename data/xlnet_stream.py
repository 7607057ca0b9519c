"""XLNet's rows (PipelineConfig.format = "xlnet_stream"), made as zihangdai/xlnet
`data_utils.py` makes them (`create_tfrecords`, `_create_data`, `_split_a_and_b`), but
streaming: the functions here, which data/pipeline.py composes into batches.

The original concatenates a host's documents, each ended by <eod>, into one token stream,
cuts it into as many equal streams as the host has rows (`batchify`), and walks all of
them together in steps of reuse_len tokens: at position i, row r is

    stream_r[i : i + reuse_len]  A  <sep>  B  <sep>  <cls>          (L tokens)
    segment  0 ...               0   0     1   1     2

where A starts right after the reused part (at i + reuse_len) and ends at a sentence
boundary, and B is, with probability 1/2 (or when A's text has no sentence boundary), a
span taken from anywhere else in the stream ("not the continuation", label 0), else A's own
continuation (label 1), both trimmed from their right ends, the longer first, to
|A| + |B| = L - reuse_len - 3. The next step's row r starts at i + reuse_len: its reused
part is the text right after the reused part that row r's memory now holds (where A
began). With bi_data, half the streams are read backwards.

Streaming, we do the same with three deviations, all forced by not holding the whole data:
- each of a host's R rows is its own stream of documents (document k of pass e goes to
  stream (k - e) mod R) instead of 1/R of one concatenation: the same continuity, another
  grouping of documents;
- a "not the continuation" B is drawn from the stream's next tokens after the row (a
  lookahead window of `_LOOKAHEAD` times the length of A + B), not from anywhere in it, so
  it is often later text of the same document rather than of another (and it never starts
  before the lookahead, where the original's may start anywhere, the row's own text
  included);
- a backward stream reads each of its documents backwards (in the forward order of
  documents) instead of the whole stream from its end.
The row's targets: `data/plm_targets.py` (the budget split 43/42 between the reused part
and the rest, as the original); <sep> and <cls> never become targets.
"""

from __future__ import annotations

import math

import tensorflow as tf

from data import instances, plm_targets
from data.pipeline_config import PipelineConfig

_SALT_SPLIT = 1
_SALT_TARGETS = 2
# A "not the continuation" B comes from the stream's next _LOOKAHEAD * (|A| + |B|) tokens
# after the row's text (see the module docstring).
_LOOKAHEAD = 4


def document_tokens(doc: dict[str, tf.Tensor], eod_id: int, backward: tf.Tensor) -> dict[str, tf.Tensor]:
    """One document as the stream reads it: its tokens then <eod>, reversed when `backward`.

    doc: token_ids [T] int32, sentence_lengths [S] int32 (instances.parse_document).
    backward: [] bool. Returns ids [T + 1] int32 and sentence_start [T + 1] bool (a token
    that begins a sentence, in reading order). <eod> belongs to the document's last sentence,
    as in the original, whose sentence-id flag flips twice around it.
    """
    lengths = doc["sentence_lengths"]
    sentence = tf.repeat(tf.range(tf.size(lengths)), lengths)
    sentence = tf.concat([sentence, [tf.maximum(tf.size(lengths) - 1, 0)]], axis=0)
    ids = tf.concat([doc["token_ids"], [eod_id]], axis=0)
    ids = tf.where(backward, tf.reverse(ids, [0]), ids)
    sentence = tf.where(backward, tf.reverse(sentence, [0]), sentence)
    start = tf.concat([[True], sentence[1:] != sentence[:-1]], axis=0)
    return {"ids": ids, "sentence_start": start}


def window_chunks(config: PipelineConfig) -> int:
    """Chunks of reuse_len tokens in a row's window: the reused part, A + B, and the
    lookahead a random B is drawn from (plus the one token the original keeps spare)."""
    rest = config.max_seq_length - config.reuse_len - 3
    return math.ceil((config.reuse_len + (1 + _LOOKAHEAD) * rest + 1) / config.reuse_len)


def window_initial_state(config: PipelineConfig) -> dict[str, tf.Tensor]:
    """The window scan's state: the last k chunks (`window_chunks`) and how many chunks have
    come (the window's index in the stream follows from it)."""
    shape = [window_chunks(config), config.reuse_len]
    return {
        "ids": tf.zeros(shape, tf.int32),
        "sentence_start": tf.zeros(shape, tf.bool),
        "chunks": tf.constant(0, tf.int64),
    }


def window_step(state, chunk):
    """Scan step over a stream's chunks (ids, sentence_start [reuse_len]): -> (new state,
    (full, window)). window: ids and sentence_start [k * reuse_len] from the oldest chunk,
    and index [] int64, the window's place in the stream (0, 1, ...): row r at step t reads
    window t of stream r, which starts reuse_len tokens after window t - 1."""
    new = {key: tf.concat([state[key][1:], chunk[key][None]], axis=0) for key in ("ids", "sentence_start")}
    new["chunks"] = state["chunks"] + 1
    k = tf.cast(tf.shape(state["ids"])[0], tf.int64)
    window = {key: tf.reshape(new[key], [-1]) for key in ("ids", "sentence_start")}
    window["index"] = new["chunks"] - k
    return new, (new["chunks"] >= k, window)


def _first(flags: tf.Tensor, default: tf.Tensor) -> tf.Tensor:
    """Index of the first True in [n] bool `flags`, else `default`."""
    return tf.where(tf.reduce_any(flags), tf.argmax(flags, output_type=tf.int32), default)


def _randint(seed: tf.Tensor, low: tf.Tensor, high: tf.Tensor) -> tf.Tensor:
    """A uniform integer in [low, high] (as Python's random.randint)."""
    return tf.random.stateless_uniform([], seed, minval=low, maxval=high + 1, dtype=tf.int32)


def truncated_lengths(a: tf.Tensor, b: tf.Tensor, total: int) -> tuple[tf.Tensor, tf.Tensor]:
    """The lengths that `_split_a_and_b`'s last loop leaves (while a + b > total, drop a token
    of the longer side, B on ties), in closed form: one side alone when that suffices, else
    both near half, A the longer by one on an odd total."""
    excess = a + b - total
    balanced = ((total + 1) // 2, total // 2)
    a_only = (a > b) & (excess <= a - b)
    b_only = (a <= b) & (excess <= b - a + 1)
    new_a = tf.where(excess <= 0, a, tf.where(a_only, a - excess, tf.where(b_only, a, balanced[0])))
    new_b = tf.where(excess <= 0, b, tf.where(b_only, b - excess, tf.where(a_only, b, balanced[1])))
    return new_a, new_b


def split_a_and_b(
    window: dict[str, tf.Tensor], seed: tf.Tensor, reuse_len: int, total: int
) -> dict[str, tf.Tensor]:
    """`_split_a_and_b` on a window (ids, sentence_start [W]), A starting at reuse_len:
    the [begin, end) of A and B (|A| + |B| = total) and continuation [] bool (the label).

    A ends at one of the sentence boundaries less than `total` tokens in (a cut point), or,
    with none, at the first boundary at least `total` in (end_idx); B is then, with
    probability 1/2 or when there is no cut point, a span of max(1, total - |A|) tokens drawn
    from the lookahead after the row's text and widened to whole sentences (on the left only
    as far as the lookahead's start), else A's own text from the cut to end_idx.
    """
    start = window["sentence_start"]
    size = tf.size(start)
    positions = tf.range(size)
    begin = reuse_len
    boundary = start & (positions > begin)
    end_idx = _first(boundary & (positions - begin >= total), size)
    cuts = tf.cast(tf.where(boundary & (positions < end_idx))[:, 0], tf.int32)
    seeds = [instances.derive_seed(seed, part) for part in range(3)]
    # With no cut point, A runs to end_idx (the one entry after the cuts).
    a_end = tf.gather(
        tf.concat([cuts, [end_idx]], 0), _randint(seeds[0], 0, tf.maximum(tf.size(cuts) - 1, 0))
    )
    random_b = (tf.size(cuts) == 0) | (tf.random.stateless_uniform([], seeds[1]) < 0.5)
    # Not the continuation: from the lookahead, widened left and right to sentence edges, but
    # not back into the row's own text (A, cut to `total` tokens at most, ends before
    # `lookahead`): from a window, widening could reach A's sentence and repeat it as B.
    b_len = tf.maximum(1, total - (a_end - begin))
    lookahead = begin + total
    drawn = _randint(seeds[2], lookahead, size - 1 - b_len)
    far_begin = size - 1 - _first(tf.reverse(start & (positions <= drawn), [0]), size - 1)
    far_begin = tf.maximum(far_begin, lookahead)
    far_end = tf.minimum(_first(start & (positions >= drawn + b_len), size - 1), size - 1)
    b_begin = tf.where(random_b, far_begin, a_end)
    b_end = tf.where(random_b, far_end, end_idx)
    a, b = truncated_lengths(a_end - begin, b_end - b_begin, total)
    return {
        "a_begin": tf.constant(begin, tf.int32),
        "a_end": begin + a,
        "b_begin": b_begin,
        "b_end": b_begin + b,
        "continuation": ~random_b,
    }


def make_row(
    window: dict[str, tf.Tensor],
    seed: tf.Tensor,
    backward: tf.Tensor,
    *,
    config: PipelineConfig,
    sep_id: int,
    cls_id: int,
    word_starts: tf.Tensor,
) -> dict[str, tf.Tensor]:
    """One row of an XLNet batch from its stream's window (`window_step`).

    seed: [2] int64. backward: [] bool, the stream reads backwards. word_starts: [vocab] bool
    (XLNet's start-piece rule). Returns input_ids, segment_ids, input_mask, functional [L]
    int32 (functional: 1 at <sep> and <cls>); target_positions [P] int32, target_weights [P]
    float32 (P = max_predictions_per_seq; the targets in position order, then padding);
    direction [] int32 (+1, or -1 backwards); continuation [] bool (B continues A: not a
    model input, for the statistics).
    """
    length, reuse = config.max_seq_length, config.reuse_len
    total = length - reuse - 3
    split = split_a_and_b(window, instances.derive_seed(seed, _SALT_SPLIT), reuse, total)
    ids = window["ids"]
    a = ids[split["a_begin"] : split["a_end"]]
    b = ids[split["b_begin"] : split["b_end"]]
    row = tf.concat([ids[:reuse], a, [sep_id], b, [sep_id, cls_id]], axis=0)
    row = tf.ensure_shape(row, [length])
    first = reuse + tf.size(a) + 1  # the reused part, A and its <sep>
    segment_ids = tf.concat(
        [tf.zeros([first], tf.int32), tf.ones([length - 1 - first], tf.int32), [2]], axis=0
    )
    positions = tf.range(length)
    functional = (positions == first - 1) | (positions >= length - 2)
    is_start = tf.gather(word_starts, row)
    budgets = plm_targets.row_budget(config.max_predictions_per_seq)
    options = dict(
        reverse=backward,
        max_gram=config.plm_max_gram,
        mask_alpha=config.plm_mask_alpha,
        mask_beta=config.plm_mask_beta,
    )
    targets_seed = instances.derive_seed(seed, _SALT_TARGETS)
    chosen = tf.concat(
        [
            plm_targets.sample_targets(
                is_start[:reuse], instances.derive_seed(targets_seed, 0), budgets[0], **options
            ),
            plm_targets.sample_targets(
                is_start[reuse:], instances.derive_seed(targets_seed, 1), budgets[1], **options
            ),
        ],
        axis=0,
    )
    target_positions = tf.cast(tf.where(chosen & ~functional)[:, 0], tf.int32)
    count = tf.size(target_positions)
    pad = config.max_predictions_per_seq - count
    return {
        "input_ids": row,
        "segment_ids": tf.ensure_shape(segment_ids, [length]),
        "input_mask": tf.ones([length], tf.int32),
        "functional": tf.cast(functional, tf.int32),
        "target_positions": tf.ensure_shape(
            tf.pad(target_positions, [[0, pad]]), [config.max_predictions_per_seq]
        ),
        "target_weights": tf.ensure_shape(
            tf.concat([tf.ones([count]), tf.zeros([pad])], axis=0), [config.max_predictions_per_seq]
        ),
        "direction": tf.where(backward, -1, 1),
        "continuation": split["continuation"],
    }
