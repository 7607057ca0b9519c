"""MLM masking statistics over many rows: rate, cap, 80/10/10, never special tokens; n-gram
lengths and the random replacement's vocab against transcriptions of ALBERT's and fairseq's code."""

import random

import numpy as np
import pytest
import tensorflow as tf

from data import masking, shards

CLS, SEP, PAD, MASK = 2, 3, 0, 4
VOCAB = 5000
L, P = 64, 12


def _row(rng, length):
    ids = rng.integers(100, VOCAB, size=length)
    a = int(rng.integers(1, length - 2))
    tokens = [CLS, *ids[:a], SEP, *ids[a : length - 3], SEP]
    return {
        "input_ids": tf.constant(tokens + [PAD] * (L - len(tokens)), tf.int32),
        "input_mask": tf.constant([1] * len(tokens) + [0] * (L - len(tokens)), tf.int32),
    }


def _mask(row, seed, prob=0.15, cap=P, **options):
    return masking.mask_tokens(
        row,
        seed=tf.stack([tf.cast(seed, tf.int64), tf.constant(7, tf.int64)]),
        vocab_size=VOCAB,
        mask_id=MASK,
        never_mask_ids=(CLS, SEP),
        masked_lm_prob=prob,
        max_predictions_per_seq=cap,
        **options,
    )


@pytest.mark.slow
def test_masking_statistics():
    rng = np.random.default_rng(0)
    chosen = total_real = masked = kept = replaced = 0
    for seed in range(600):
        length = int(rng.integers(8, L + 1))
        row = _row(rng, length)
        out = _mask(row, seed)
        original = row["input_ids"].numpy()
        ids = out["input_ids"].numpy()
        pos = out["masked_lm_positions"].numpy()
        weights = out["masked_lm_weights"].numpy()
        n = int(weights.sum())
        # The original's count: round(15% of all real tokens incl. [CLS]/[SEP]), >= 1, capped.
        assert n == min(P, max(1, int(round(length * 0.15))))
        assert (weights[:n] == 1).all() and (weights[n:] == 0).all()
        real_pos = pos[:n]
        assert (np.diff(real_pos) > 0).all(), "sorted, distinct"
        assert (pos[n:] == 0).all() and (out["masked_lm_ids"].numpy()[n:] == 0).all()
        assert not np.isin(original[real_pos], [CLS, SEP, PAD]).any(), "never special tokens or padding"
        np.testing.assert_array_equal(out["masked_lm_ids"].numpy()[:n], original[real_pos])
        untouched = np.setdiff1d(np.arange(L), real_pos)
        np.testing.assert_array_equal(ids[untouched], original[untouched])
        chosen += n
        total_real += length
        masked += int((ids[real_pos] == MASK).sum())
        kept += int((ids[real_pos] == original[real_pos]).sum())
        replaced += int(((ids[real_pos] != MASK) & (ids[real_pos] != original[real_pos])).sum())
    assert 0.13 < chosen / total_real < 0.17
    assert abs(masked / chosen - 0.8) < 0.03
    assert abs(kept / chosen - 0.1) < 0.025
    assert abs(replaced / chosen - 0.1) < 0.025


def test_cap_is_respected_for_long_rows():
    rng = np.random.default_rng(1)
    out = _mask(_row(rng, L), seed=3, prob=0.5, cap=5)
    assert out["masked_lm_positions"].shape == (5,)
    assert out["masked_lm_weights"].numpy().sum() == 5
    assert (out["input_ids"].numpy() != _row(np.random.default_rng(1), L)["input_ids"].numpy()).sum() <= 5


def test_same_seed_same_mask_other_seed_other_mask():
    row = _row(np.random.default_rng(2), L)
    a, b, c = _mask(row, 1), _mask(row, 1), _mask(row, 2)
    np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
    assert not np.array_equal(a["masked_lm_positions"], c["masked_lm_positions"])


@pytest.mark.slow
def test_inside_tf_data_matches_eager():
    rows = [_row(np.random.default_rng(i), 40) for i in range(5)]
    eager = [_mask(r, i)["input_ids"].numpy() for i, r in enumerate(rows)]
    ds = tf.data.Dataset.from_tensor_slices({k: tf.stack([r[k] for r in rows]) for k in rows[0]})
    graph = list(ds.enumerate().map(lambda i, r: _mask(r, i)["input_ids"]).as_numpy_iterator())
    for x, y in zip(graph, eager):
        np.testing.assert_array_equal(x, y)


# ---- whole-word and n-gram masking ------------------------------------------------------

WORD_VOCAB = 400
# Ids 100..399: even ids begin a word, odd ids continue one ("##" pieces), so rows built
# from them have words of one or more pieces.
WORD_STARTS = np.arange(WORD_VOCAB) % 2 == 0


def _word_row(rng, length, continue_prob=0.5):
    ids = []
    for _ in range(length - 2):
        start = not ids or rng.random() > continue_prob
        ids.append(int(rng.integers(50, 200)) * 2 + (0 if start else 1))
    tokens = [CLS, *ids, SEP]
    return {
        "input_ids": tf.constant(tokens + [PAD] * (L - len(tokens)), tf.int32),
        "input_mask": tf.constant([1] * len(tokens) + [0] * (L - len(tokens)), tf.int32),
    }


def _word_mask(row, seed, unit, prob=0.15, cap=P, starts=WORD_STARTS, **options):
    return masking.mask_tokens(
        row,
        seed=tf.stack([tf.cast(seed, tf.int64), tf.constant(5, tf.int64)]),
        vocab_size=WORD_VOCAB,
        mask_id=MASK,
        never_mask_ids=(CLS, SEP),
        masked_lm_prob=prob,
        max_predictions_per_seq=cap,
        masking_unit=unit,
        word_starts=tf.constant(starts),
        **options,
    )


def _words(ids, real):
    """Word index of every real non-special position (-1 elsewhere), from WORD_STARTS."""
    word, out = -1, np.full(len(ids), -1)
    for i, (t, r) in enumerate(zip(ids, real)):
        if not r or t in (CLS, SEP):
            continue
        if WORD_STARTS[t] or i == 0 or out[i - 1] == -1:
            word += 1
        out[i] = word
    return out


@pytest.mark.slow
@pytest.mark.parametrize("unit", ["whole_word", "ngram"])
def test_word_units_never_split_a_word_and_respect_the_count(unit):
    rng = np.random.default_rng(5)
    chosen = total = 0
    for seed in range(80):
        length = int(rng.integers(10, L + 1))
        row = _word_row(rng, length)
        out = _word_mask(row, seed, unit)
        original = row["input_ids"].numpy()
        weights = out["masked_lm_weights"].numpy()
        n = int(weights.sum())
        pos = out["masked_lm_positions"].numpy()[:n]
        words = _words(original, row["input_mask"].numpy())
        assert n <= min(P, max(1, round(length * 0.15))), "never more than the token count"
        assert (np.diff(pos) > 0).all() and (words[pos] >= 0).all(), "sorted, never special tokens"
        for w in set(words[pos]):
            assert set(np.flatnonzero(words == w)) <= set(pos), "a word is masked whole or not at all"
        np.testing.assert_array_equal(out["masked_lm_ids"].numpy()[:n], original[pos])
        untouched = np.setdiff1d(np.arange(L), pos)
        np.testing.assert_array_equal(out["input_ids"].numpy()[untouched], original[untouched])
        chosen += n
        total += round(length * 0.15)
    # Words that would overshoot are skipped, so the count is sometimes not reached.
    assert 0.8 < chosen / total <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize(
    "probabilities, expected",
    [
        (None, np.array([1, 1 / 2, 1 / 3]) / (11 / 6)),  # ALBERT's: 0.545, 0.273, 0.182
        ((0.4, 0.3, 0.2, 0.1), np.array([0.4, 0.3, 0.2, 0.1])),  # MacBERT's
    ],
    ids=["albert", "macbert"],
)
def test_ngram_lengths_follow_their_distribution(probabilities, expected):
    # One-token words, a long row and a low rate: n-grams seldom touch, so runs of masked
    # positions are the sampled n-grams.
    starts = np.ones(WORD_VOCAB, bool)
    rng = np.random.default_rng(6)
    counts = np.zeros(len(expected) + 1)
    # Long rows: the n-gram shortened to fit the count, about the last of each row, is rare.
    length = 1024
    for seed in range(40):
        ids = [CLS, *rng.integers(100, WORD_VOCAB, size=length - 2), SEP]
        row = {"input_ids": tf.constant(ids, tf.int32), "input_mask": tf.ones([length], tf.int32)}
        out = _word_mask(
            row, seed, "ngram", prob=0.04, cap=48, starts=starts, ngram_probabilities=probabilities
        )
        n = int(out["masked_lm_weights"].numpy().sum())
        pos = out["masked_lm_positions"].numpy()[:n]
        runs = np.split(pos, np.flatnonzero(np.diff(pos) > 1) + 1)
        for run in runs:
            counts[min(len(run), len(expected))] += 1
    frequencies = counts[1:] / counts[1:].sum()
    np.testing.assert_allclose(frequencies, expected, atol=0.05)


def test_macberts_replacement_is_a_random_token_or_the_same_never_mask():
    rng = np.random.default_rng(3)
    kept = changed = 0
    for seed in range(60):
        out = _mask(_row(rng, 64), seed, replacement="random")
        n = int(out["masked_lm_weights"].numpy().sum())
        now = out["input_ids"].numpy()[out["masked_lm_positions"].numpy()[:n]]
        assert MASK not in now
        same = int((now == out["masked_lm_ids"].numpy()[:n]).sum())
        kept, changed = kept + same, changed + n - same
    # 10% kept, 90% a random id (which is the original 1 time in VOCAB).
    assert 0.06 < kept / (kept + changed) < 0.15


def test_word_units_need_a_word_start_table():
    with pytest.raises(ValueError, match="word_starts"):
        _mask(_row(np.random.default_rng(0), 20), 0, masking_unit="whole_word")


@pytest.mark.slow
def test_word_units_inside_tf_data_match_eager():
    rows = [_word_row(np.random.default_rng(i), 30) for i in range(4)]
    eager = [_word_mask(r, i, "ngram")["input_ids"].numpy() for i, r in enumerate(rows)]
    ds = tf.data.Dataset.from_tensor_slices({k: tf.stack([r[k] for r in rows]) for k in rows[0]})
    graph = ds.enumerate().map(lambda i, r: _word_mask(r, i, "ngram")["input_ids"])
    for x, y in zip(graph.as_numpy_iterator(), eager):
        np.testing.assert_array_equal(x, y)


def _albert_masked_positions(tokens, is_start_piece, max_predictions_per_seq, masked_lm_prob, rng, np_rng):
    """google-research/albert create_pretraining_data.py `create_masked_lm_predictions`, its
    choice of positions transcribed (defaults: do_whole_word_mask, ngram=3,
    favor_shorter_ngram, no permutation; the 80/10/10 replacement left out). `rng` is its
    random.Random (shuffle), `np_rng` stands for its global np.random (the n draw)."""
    cand_indexes = []
    for i, token in enumerate(tokens):
        if token == CLS or token == SEP:
            continue
        if len(cand_indexes) >= 1 and not is_start_piece(token):
            cand_indexes[-1].append(i)
        else:
            cand_indexes.append([i])
    num_to_predict = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))
    ngrams = np.arange(1, 3 + 1, dtype=np.int64)
    pvals = 1.0 / np.arange(1, 3 + 1)
    pvals /= pvals.sum(keepdims=True)
    ngram_indexes = []
    for idx in range(len(cand_indexes)):
        ngram_indexes.append([cand_indexes[idx : idx + n] for n in ngrams])
    rng.shuffle(ngram_indexes)
    masked_lms, covered_indexes = [], set()
    for cand_index_set in ngram_indexes:
        if len(masked_lms) >= num_to_predict:
            break
        if not cand_index_set:
            continue
        n = np_rng.choice(
            ngrams[: len(cand_index_set)],
            p=pvals[: len(cand_index_set)] / pvals[: len(cand_index_set)].sum(keepdims=True),
        )
        index_set = sum(cand_index_set[n - 1], [])
        n -= 1
        while len(masked_lms) + len(index_set) > num_to_predict:
            if n == 0:
                break
            index_set = sum(cand_index_set[n - 1], [])
            n -= 1
        if len(masked_lms) + len(index_set) > num_to_predict:
            continue
        if any(index in covered_indexes for index in index_set):
            continue
        for index in index_set:
            covered_indexes.add(index)
            masked_lms.append(index)
    return tuple(sorted(masked_lms))


@pytest.mark.slow
@pytest.mark.extended
def test_ngram_near_the_end_of_the_row_is_drawn_as_albert_does():
    # Words: a 3-piece word, then two 1-piece words; 3 predictions. ALBERT draws n from all of
    # 1..3 (p ~ 1/n) and then cuts the n-gram at the last word, so from the second-to-last word
    # it takes 2 words with p = 5/11 (not 1/3, as when n is drawn among the lengths that fit).
    # Only then is "last word alone" the outcome: the last word masked first, then the 2-gram
    # from the word before overlaps it and is skipped. Exactly: P(pos 5 alone) = 5/33,
    # P(pos 4, 5) = 17/33, P(pos 1-3) = 1/3; with n drawn among the lengths that fit, 1/9.
    tokens = [CLS, 200, 201, 203, 202, 204, SEP]  # even ids start a word
    rng, np_rng = random.Random(0), np.random.default_rng(0)
    reference = [
        _albert_masked_positions(tokens, WORD_STARTS.__getitem__, 3, 1.0, rng, np_rng) for _ in range(30000)
    ]

    n = 6000
    row = {"input_ids": tf.constant(tokens, tf.int32), "input_mask": tf.ones([len(tokens)], tf.int32)}
    ds = tf.data.Dataset.range(n).map(lambda i: _word_mask(row, i, "ngram", prob=1.0, cap=3))
    ours = []
    for out in ds.as_numpy_iterator():
        w = out["masked_lm_weights"] > 0
        ours.append(tuple(out["masked_lm_positions"][w].tolist()))
    outcomes = [(1, 2, 3), (4, 5), (5,)]
    expected = [reference.count(o) / len(reference) for o in outcomes]
    observed = [ours.count(o) / n for o in outcomes]
    assert sum(observed) == 1.0, set(ours) - set(outcomes)
    np.testing.assert_allclose(expected, [1 / 3, 17 / 33, 5 / 33], atol=0.01)  # the transcription
    np.testing.assert_allclose(observed, expected, atol=0.02)


# ---- the random replacement's vocab ------------------------------------------------------

# A trained byte-level BPE vocab's layout: <s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4, then text.
BPE_IDS = {"cls": 0, "pad": 1, "sep": 2, "unk": 3, "mask": 4}
BPE_VOCAB = 12


def _fairseq_replacement_p(vocab_size, nspecial=4):
    """fairseq/data/mask_tokens_dataset.py: `weights = np.ones(len(self.vocab))`,
    `weights[: self.vocab.nspecial] = 0`, normalised; a dictionary's nspecial symbols are
    <s> <pad> </s> <unk> (fairseq/data/dictionary.py), <mask> is added after them."""
    weights = np.ones(vocab_size)
    weights[:nspecial] = 0
    return weights / weights.sum()


def test_random_replacement_skips_fairseqs_specials_for_bpe():
    exclude = masking.random_exclude_ids("bpe", BPE_IDS)
    assert exclude == (0, 1, 2, 3)
    # BERT and ALBERT draw from the whole vocab (`rng.randint(0, len(vocab_words) - 1)`).
    for kind in ("wordpiece", "sentencepiece", None):
        assert masking.random_exclude_ids(kind, BPE_IDS) == ()
    original, length = 9, 64
    tokens = [BPE_IDS["cls"], *[original] * (length - 2), BPE_IDS["sep"]]
    row = {"input_ids": tf.constant(tokens, tf.int32), "input_mask": tf.ones([length], tf.int32)}

    def mask(i):
        return masking.mask_tokens(
            row,
            seed=tf.stack([i, tf.constant(3, tf.int64)]),
            vocab_size=BPE_VOCAB,
            mask_id=BPE_IDS["mask"],
            never_mask_ids=(BPE_IDS["cls"], BPE_IDS["sep"]),
            masked_lm_prob=0.5,
            max_predictions_per_seq=32,
            random_exclude_ids=exclude,
        )

    counts = np.zeros(BPE_VOCAB)
    for out in tf.data.Dataset.range(600).map(mask).as_numpy_iterator():
        np.add.at(counts, out["input_ids"][out["masked_lm_positions"]], 1)  # 32 predictions a row
    assert counts[list(exclude)].sum() == 0, counts
    # fairseq: 80% <mask>, 10% unchanged, 10% drawn with p = weights (<mask> and the
    # original id included).
    p = _fairseq_replacement_p(BPE_VOCAB)
    expected = 0.1 * p
    expected[BPE_IDS["mask"]] += 0.8
    expected[original] += 0.1
    np.testing.assert_allclose(counts / counts.sum(), expected, atol=0.01)
    # The draws alone (ids other than <mask> and the original): uniform over the rest.
    drawn = np.delete(counts, [BPE_IDS["mask"], original])
    reference = np.delete(p, [BPE_IDS["mask"], original])
    np.testing.assert_allclose(drawn / drawn.sum(), reference / reference.sum(), atol=0.035)


def test_the_shards_tokenizer_kind_picks_the_excluded_ids():
    # Published RoBERTa ids (<mask> last) and BERT ids, as preprocess writes the manifest.
    roberta = {"pad": 1, "unk": 3, "cls": 0, "sep": 2, "mask": 50264}
    bert = {"pad": 0, "unk": 100, "cls": 101, "sep": 102, "mask": 103}
    for kind, ids, expected in [("bpe", roberta, (0, 1, 2, 3)), ("wordpiece", bert, ())]:
        fields = {"vocab_size": 50265, "special_ids": ids, "tokenizer": {"kind": kind}}
        assert shards.Manifest("unused", fields).vocab.random_exclude_ids == expected
    assert shards.Manifest("unused", {"vocab_size": 9, "special_ids": bert}).vocab.random_exclude_ids == ()


@pytest.mark.slow
def test_pipeline_masks_bpe_shards_without_drawing_specials(tmp_path):
    """End to end: shards made with a byte-level BPE tokenizer (the manifest says so) get
    fairseq's draw in the RoBERTa recipe's format; nothing to bind in the recipe."""
    from data import pipeline

    rng = np.random.default_rng(0)
    path = tmp_path / shards.shard_name("train", 0, 1)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for doc_id in range(20):
            sentences = [rng.integers(5, BPE_VOCAB, size=int(rng.integers(5, 20))).tolist() for _ in range(6)]
            writer.write(shards.encode_document(doc_id, sentences))
    manifest = {
        "format_version": shards.FORMAT_VERSION,
        "vocab_size": BPE_VOCAB,
        "tokenizer": {"kind": "bpe", "pair_format": "roberta"},
        "special_ids": BPE_IDS,
        "splits": {"train": {"files": [path.name], "documents": 20}},
    }
    shards.write_manifest(str(tmp_path), manifest)
    config = pipeline.PipelineConfig(
        format="full_sentences",
        sentence_objective="none",
        max_seq_length=64,
        masked_lm_prob=0.5,
        max_predictions_per_seq=32,
        masking="dynamic",
        document_shuffle_buffer=4,
        instance_shuffle_buffer=1,
    )
    counts = np.zeros(BPE_VOCAB)
    for batch in pipeline.make_dataset(str(tmp_path), "train", config, 8).take(20).as_numpy_iterator():
        chosen = np.take_along_axis(batch["input_ids"], batch["masked_lm_positions"], 1)
        np.add.at(counts, chosen[batch["masked_lm_weights"] > 0], 1)
    assert counts[[0, 1, 2, 3]].sum() == 0 and counts.sum() > 4000, counts
    assert (counts[5:] > 0).all()  # the 10% random ids (and unchanged ones) still occur
