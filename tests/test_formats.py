"""RoBERTa's four input formats, ALBERT's SOP, RoBERTa's pair layout and DOC-SENTENCES packing.

Ops are checked eagerly with exact layouts (tests/synthetic.py ids encode document and
sentence), then end to end through `data.pipeline` including exact iterator resume.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from data import instances, pair_layout, pipeline, shards, synthetic
from models.encoder import Encoder, EncoderConfig
from tests import jitted

CLS, SEP, PAD = synthetic.SPECIAL["cls"], synthetic.SPECIAL["sep"], synthetic.SPECIAL["pad"]
L = 40


def _doc(doc_id, sentences, epoch=0):
    return {
        "token_ids": tf.constant([t for s in sentences for t in s], tf.int32),
        "sentence_lengths": tf.constant([len(s) for s in sentences], tf.int32),
        "doc_id": tf.constant(doc_id, tf.int64),
        "epoch": tf.constant(epoch, tf.int64),
    }


def _sentences(doc_id, lengths):
    return [[synthetic.token(doc_id, s)] * n for s, n in enumerate(lengths)]


def test_roberta_pair_layout():
    out = instances.format_pair(
        {
            "a_tokens": tf.constant([10, 11], tf.int32),
            "b_tokens": tf.constant([20], tf.int32),
            "is_random_next": tf.constant(False),
        },
        max_seq_length=10,
        cls_id=CLS,
        sep_id=SEP,
        pad_id=PAD,
        pair_format="roberta",
    )
    np.testing.assert_array_equal(out["input_ids"], [CLS, 10, 11, SEP, SEP, 20, SEP, PAD, PAD, PAD])
    np.testing.assert_array_equal(out["input_mask"], [1] * 7 + [0] * 3)
    np.testing.assert_array_equal(out["segment_ids"], [0] * 10)
    assert pair_layout.get("roberta").num_specials() == 4 and pair_layout.get("bert").num_specials() == 3


def test_sentence_pair_chunks_are_single_consecutive_sentences():
    sentences = _sentences(5, [3, 4, 2, 5, 1, 6, 2])
    out = instances.chunk_document(
        _doc(5, sentences),
        seed=tf.constant([1, 2], tf.int64),
        max_seq_length=64,
        short_seq_prob=0.0,
        random_next_prob=0.5,
        max_chunk_sentences=2,
    )
    a_rows, b_rows = out["a_tokens"].to_list(), out["b_tokens"].to_list()
    nexts = out["is_random_next"].numpy()
    assert nexts.any() and not nexts.all()
    expected_start = 0
    for a, b, random_next, target in zip(a_rows, b_rows, nexts, out["target_b_length"].numpy()):
        assert a == sentences[expected_start], "A is exactly one whole sentence, in order"
        if random_next:
            assert b == [] and target == 1  # a NotNext B will be one sentence of another document
            expected_start += 1  # the sentence that would have been B is put back
        else:
            assert b == sentences[expected_start + 1]
            expected_start += 2
    assert expected_start == len(sentences)


def test_sop_swaps_consecutive_segments_half_the_time():
    a, b = [synthetic.token(3, 0)] * 2, [synthetic.token(3, 1)] * 3
    pair = {
        "a_tokens": tf.constant(a, tf.int32),
        "b_tokens": tf.constant(b, tf.int32),
        "is_random_next": tf.constant(False),
    }
    labels = []
    for seed in range(200):
        out = instances.swap_segments(pair, seed=tf.constant([seed, 0], tf.int64))
        swapped = bool(out["is_random_next"])
        got = (out["a_tokens"].numpy().tolist(), out["b_tokens"].numpy().tolist())
        assert got == ((b, a) if swapped else (a, b))
        assert bool(out["valid"])
        labels.append(swapped)
    assert 0.4 < np.mean(labels) < 0.6
    lone = dict(pair, b_tokens=tf.constant([], tf.int32), is_random_next=tf.constant(True))
    assert not bool(instances.swap_segments(lone, seed=tf.constant([0, 0], tf.int64))["valid"])


def _albert_random_b(other, start, target_b_length):
    """google-research/albert create_instances_from_document's random-document branch:
    from sentence `start` of the other document, whole sentences until target_b_length."""
    tokens_b = []
    for sentence in other[start:]:
        tokens_b.extend(sentence)
        if len(tokens_b) >= target_b_length:
            break
    return tokens_b


@pytest.mark.slow
def test_sop_one_sentence_chunk_takes_b_from_another_document_with_label_1():
    # ALBERT (create_instances_from_document, random_next_sentence=False): a chunk of one
    # sentence has no B of its own, so B comes from a random other document and
    # is_random_next = True, i.e. sentence_order_label 1; it is never swapped.
    lone = _sentences(5, [4])
    other = _sentences(9, [3, 2, 6, 1, 5])
    candidates = {
        "token_ids": tf.ragged.constant(
            [[t for s in lone for t in s], [t for s in other for t in s]], tf.int32
        ),
        "sentence_lengths": tf.ragged.constant([[4], [3, 2, 6, 1, 5]], tf.int32),
        "doc_id": tf.constant([5, 9], tf.int64),
    }
    starts = set()
    for seed in range(40):
        seed = tf.constant([seed, 3], tf.int64)
        chunk = {
            k: v[0]
            for k, v in instances.chunk_document(
                _doc(5, lone), seed=seed, max_seq_length=20, short_seq_prob=0.0, random_next_prob=0.0
            ).items()
        }
        assert bool(chunk["is_random_next"]) and int(chunk["target_b_length"]) == 17 - 4
        pair = instances.swap_segments(instances.attach_random_b(chunk, candidates, seed=seed), seed=seed)
        assert bool(pair["valid"]) and bool(pair["is_random_next"]), "label 1, never dropped"
        assert pair["a_tokens"].numpy().tolist() == lone[0], "A stays the chunk's sentence: no swap"
        b = pair["b_tokens"].numpy().tolist()
        start = synthetic.doc_and_sentence(b[0])
        assert start[0] == 9, "B from the other document"
        assert b == _albert_random_b(other, start[1], 17 - 4)
        starts.add(start[1])
    assert len(starts) >= 3, "B starts at a random sentence of the other document"


def _fill(docs, cross_documents, max_tokens):
    """Runs fill_step over the sentences of `docs` inside tf.data; returns emitted rows."""
    slices = [
        tf.data.Dataset.from_tensor_slices(instances.split_sentences(_doc(d, s))) for d, s in docs.items()
    ]
    ds = slices[0]
    for more in slices[1:]:
        ds = ds.concatenate(more)
    step = lambda state, sentence: instances.fill_step(  # noqa: E731
        state, sentence, max_tokens=max_tokens, cross_documents=cross_documents, sep_id=SEP
    )
    ds = ds.scan(instances.fill_initial_state(max_tokens), step)
    return [row for emit, row in ds.as_numpy_iterator() if emit]


DOCS = {7: _sentences(7, [3, 4, 2]), 8: _sentences(8, [5, 1]), 9: _sentences(9, [6, 6])}


def test_full_sentences_fill_rows_across_documents_with_a_separator():
    rows = _fill(DOCS, cross_documents=True, max_tokens=10)
    t = synthetic.token
    # 3 + 4 + 2 = 9 tokens; doc 8 needs SEP + 5 -> 15 > 10: a new row of 5, + 1 (same document)
    # = 6; doc 9 needs SEP + 6 -> 13 > 10: a new row of 6; the second 6 starts a row still open.
    assert [r["tokens"].tolist() for r in rows] == [
        [t(7, 0)] * 3 + [t(7, 1)] * 4 + [t(7, 2)] * 2,
        [t(8, 0)] * 5 + [t(8, 1)],
        [t(9, 0)] * 6,
    ]
    assert [(r["doc_id"], r["sentence_index"]) for r in rows] == [(7, 0), (8, 0), (9, 0)]
    crossing = _fill({7: _sentences(7, [2]), 8: _sentences(8, [3]), 9: _sentences(9, [9])}, True, 10)
    assert crossing[0]["tokens"].tolist() == [t(7, 0)] * 2 + [SEP] + [t(8, 0)] * 3


def test_doc_sentences_never_cross_a_document():
    t = synthetic.token
    rows = _fill({7: _sentences(7, [2]), 8: _sentences(8, [3, 2]), 9: _sentences(9, [9])}, False, 10)
    assert [r["tokens"].tolist() for r in rows] == [[t(7, 0)] * 2, [t(8, 0)] * 3 + [t(8, 1)] * 2]
    long_sentence = _fill({7: _sentences(7, [14, 1]), 8: _sentences(8, [1])}, False, 10)
    assert long_sentence[0]["tokens"].tolist() == [t(7, 0)] * 10, "an overlong sentence is cut"


def _pack(examples, length):
    ds = tf.data.Dataset.from_tensor_slices(
        {
            "tokens": tf.ragged.constant(examples, tf.int32),
            "doc_id": tf.range(len(examples), dtype=tf.int64),
            "sentence_index": tf.zeros(len(examples), tf.int32),
            "epoch": tf.zeros(len(examples), tf.int64),
        }
    )

    def single(row):
        out = instances.format_single(row, max_seq_length=length, cls_id=CLS, sep_id=SEP, pad_id=PAD)
        return dict(out, doc_id=row["doc_id"], sentence_index=row["sentence_index"], epoch=row["epoch"])

    step = lambda state, ex: instances.pack_step(state, ex, max_seq_length=length, pad_id=PAD)  # noqa: E731
    ds = ds.map(single).scan(instances.pack_initial_state(length), step)
    return [row for emit, row in ds.as_numpy_iterator() if emit]


def test_packing_layout_positions_restart_and_example_ids():
    # The last example only closes the second row (a row is emitted when the next does not fit).
    rows = _pack([[10, 11], [20, 21, 22], [30] * 7, [40], [50] * 10], length=12)
    first, second = rows
    np.testing.assert_array_equal(first["input_ids"], [CLS, 10, 11, SEP, CLS, 20, 21, 22, SEP, PAD, PAD, PAD])
    np.testing.assert_array_equal(first["example_ids"], [1, 1, 1, 1, 2, 2, 2, 2, 2, 0, 0, 0])
    np.testing.assert_array_equal(first["positions"], [0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 0, 0])
    np.testing.assert_array_equal(first["input_mask"], [1] * 9 + [0] * 3)
    assert first["doc_id"] == 0
    # [30]*7 (9 tokens) does not fit next to [40] (3): 9 + 3 = 12 fits exactly.
    np.testing.assert_array_equal(second["input_ids"], [CLS] + [30] * 7 + [SEP, CLS, 40, SEP])
    np.testing.assert_array_equal(second["example_ids"], [1] * 9 + [2] * 3)
    np.testing.assert_array_equal(second["positions"], list(range(9)) + [0, 1, 2])
    assert second["doc_id"] == 2


@pytest.mark.slow(30)
def test_packed_examples_do_not_attend_to_each_other():
    rows = _pack([[10, 11, 12], [20, 21], [30] * 10], length=12)
    row = rows[0]
    config = EncoderConfig(
        vocab_size=64,
        hidden_size=16,
        num_layers=2,
        num_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
    )
    encoder = Encoder(config)
    ids = row["input_ids"][None]
    batch = dict(
        input_ids=ids,
        input_mask=row["input_mask"][None],
        segment_ids=row["segment_ids"][None],
        positions=row["positions"][None],
        example_ids=row["example_ids"][None],
    )
    params = jitted.init(encoder, jax.random.key(0), **batch, deterministic=True)
    packed = jitted.apply(encoder, params, **batch, deterministic=True).sequence_output[0]
    for k in (1, 2):
        span = np.flatnonzero(row["example_ids"] == k)
        alone = {
            "input_ids": jnp.asarray(ids[:, span]),
            "input_mask": jnp.ones((1, len(span)), jnp.int32),
            "segment_ids": jnp.zeros((1, len(span)), jnp.int32),
        }
        separate = jitted.apply(encoder, params, **alone, deterministic=True).sequence_output[0]
        np.testing.assert_allclose(packed[span], separate, atol=1e-5)
    # The check can fail: without example_ids the first example sees the second.
    mixed = jitted.apply(
        encoder, params, **{**batch, "example_ids": None}, deterministic=True
    ).sequence_output[0]
    first = row["example_ids"] == 1
    assert not np.allclose(mixed[first], packed[first], atol=1e-3)


# ---- end to end through data.pipeline ----------------------------------------------------


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return synthetic.write_shards(
        str(tmp_path_factory.mktemp("shards")), synthetic.make_documents(80, seed=4, max_len=12), num_shards=2
    )


def _config(**overrides):
    base = dict(max_seq_length=L, document_shuffle_buffer=10, instance_shuffle_buffer=20, dupe_factor=2)
    return pipeline.PipelineConfig(**{**base, **overrides})


def _take(ds, n):
    it = iter(ds)
    return [{k: v.numpy() for k, v in next(it).items()} for _ in range(n)]


def _unmasked(batch):
    ids = batch["input_ids"].copy()
    for r in range(len(ids)):
        w = batch["masked_lm_weights"][r] > 0
        ids[r, batch["masked_lm_positions"][r][w]] = batch["masked_lm_ids"][r][w]
    return ids


def _contiguous(tokens):
    """True if the synthetic tokens are whole consecutive sentences of one document, in order."""
    keys = [synthetic.doc_and_sentence(int(t)) for t in tokens]
    runs = [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
    return len({d for d, _ in runs}) == 1 and all(b[1] == a[1] + 1 for a, b in zip(runs, runs[1:]))


def test_full_sentences_rows_in_the_pipeline(data_dir):
    batches = _take(
        pipeline.make_dataset(
            data_dir, "train", _config(format="full_sentences", sentence_objective="none"), 8
        ),
        4,
    )
    crossed = 0
    for batch in batches:
        assert "sentence_label" not in batch and "example_ids" not in batch
        assert (batch["segment_ids"] == 0).all()
        for ids, mask in zip(_unmasked(batch), batch["input_mask"]):
            real = ids[mask.astype(bool)]
            assert real[0] == CLS and real[-1] == SEP and CLS not in real[1:]
            body = real[1:-1]
            parts = np.split(body, np.flatnonzero(body == SEP))
            parts = [p[p != SEP] for p in parts]
            assert all(_contiguous(p) for p in parts), "each document part is contiguous text"
            crossed += len(parts) > 1
            assert len(real) > L - 12, "rows are filled up to a sentence of the limit"
    assert crossed > 0, "rows do cross documents"


@pytest.mark.slow
def test_doc_sentences_rows_in_the_pipeline(data_dir):
    config = _config(format="doc_sentences", sentence_objective="none")
    packed_rows = 0
    for batch in _take(pipeline.make_dataset(data_dir, "train", config, 8), 4):
        assert "sentence_label" not in batch
        for ids, ex, pos, mask in zip(
            _unmasked(batch), batch["example_ids"], batch["positions"], batch["input_mask"]
        ):
            np.testing.assert_array_equal(ex > 0, mask.astype(bool))
            for k in range(1, ex.max() + 1):
                span = ex == k
                np.testing.assert_array_equal(pos[span], np.arange(span.sum()))
                example = ids[span]
                assert example[0] == CLS and example[-1] == SEP
                assert SEP not in example[1:-1], "no document separator: never crosses a document"
                assert _contiguous(example[1:-1])
            packed_rows += ex.max() > 1
    assert packed_rows > 0


@pytest.mark.slow
def test_sop_and_sentence_pair_rows_in_the_pipeline(data_dir):
    sop = _take(pipeline.make_dataset(data_dir, "train", _config(sentence_objective="sop"), 16), 6)
    labels, from_other_document = [], 0
    for batch in sop:
        for ids, seg, mask, label in zip(
            _unmasked(batch), batch["segment_ids"], batch["input_mask"], batch["sentence_label"]
        ):
            real = mask.astype(bool)
            a, b = ids[real & (seg == 0)][1:-1], ids[real & (seg == 1)][:-1]
            ka, kb = synthetic.doc_and_sentence(a[-1]), synthetic.doc_and_sentence(b[0])
            if ka[0] != kb[0]:
                # ALBERT: a one-sentence chunk keeps its sentence as A, takes B from another
                # document, label 1.
                assert label == 1 and len({synthetic.doc_and_sentence(t) for t in a}) == 1
                assert len({synthetic.doc_and_sentence(t)[0] for t in b}) == 1
                from_other_document += 1
                labels.append(label)
                continue
            # In order: B continues right after A; swapped (label 1): A continues after B.
            first, second = (b, a) if label else (a, b)
            assert synthetic.doc_and_sentence(second[0])[1] > synthetic.doc_and_sentence(first[-1])[1]
            # Truncation may cut sentences from either end; the order stays the document's.
            keys = [synthetic.doc_and_sentence(t) for t in np.concatenate([first, second])]
            assert len({d for d, _ in keys}) == 1 and all(np.diff([s for _, s in keys]) >= 0)
            labels.append(label)
    assert 0.35 < np.mean(labels) < 0.7
    assert 0 < from_other_document < 0.3 * len(labels), "one-sentence chunks are kept, and rare"
    pairs = _take(
        pipeline.make_dataset(data_dir, "train", _config(format="sentence_pair", pair_format="roberta"), 16),
        2,
    )
    for batch in pairs:
        assert (batch["segment_ids"] == 0).all()
        for ids, mask, label in zip(_unmasked(batch), batch["input_mask"], batch["sentence_label"]):
            real = ids[mask.astype(bool)]
            seps = np.flatnonzero(real == SEP)
            assert real[0] == CLS and len(seps) == 3 and seps[1] == seps[0] + 1 and seps[2] == len(real) - 1
            a, b = real[1 : seps[0]], real[seps[1] + 1 : -1]
            assert len({synthetic.doc_and_sentence(t) for t in a}) == 1, "A is one sentence"
            assert len({synthetic.doc_and_sentence(t) for t in b}) == 1, "B is one sentence"
            same_doc = synthetic.doc_and_sentence(a[0])[0] == synthetic.doc_and_sentence(b[0])[0]
            assert same_doc != bool(label)


def test_manifest_pair_format_is_used_and_conflicts_are_errors():
    def vocab(fields):
        return shards.Manifest(
            "shards", {"vocab_size": 10, "special_ids": dict(synthetic.SPECIAL), **fields}
        ).vocab

    roberta = vocab({"tokenizer": {"pair_format": "roberta"}})
    assert pipeline.resolve_pair_format(_config(), roberta) == "roberta"
    with pytest.raises(ValueError, match="pair_format"):
        pipeline.resolve_pair_format(_config(pair_format="bert"), roberta)
    top_level = vocab({"pair_format": "roberta", "tokenizer": {}})
    assert pipeline.resolve_pair_format(_config(), top_level) == "roberta"
    assert pipeline.resolve_pair_format(_config(), vocab({})) == "bert"


def test_config_errors():
    with pytest.raises(ValueError, match="sentence_objective = 'none'"):
        _config(format="doc_sentences")
    with pytest.raises(ValueError, match="format must be one of"):
        _config(format="paragraphs")
    with pytest.raises(ValueError, match="masking_unit"):
        _config(masking_unit="spans")


@pytest.mark.parametrize(
    "overrides",
    [
        dict(format="full_sentences", sentence_objective="none"),
        dict(format="doc_sentences", sentence_objective="none", masking="dynamic"),
        dict(sentence_objective="sop", pair_format="roberta"),
    ],
)
@pytest.mark.slow
@pytest.mark.extended(keep=["overrides0"])
def test_iterator_checkpoint_resumes_exactly(overrides, data_dir, tmp_path):
    config = _config(**overrides)
    it = iter(pipeline.make_dataset(data_dir, "train", config, 8))
    for _ in range(5):
        next(it)
    path = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "it"))
    expected = [next(it) for _ in range(30)]  # crosses epoch boundaries (80 short documents)
    restored = iter(pipeline.make_dataset(data_dir, "train", config, 8))
    tf.train.Checkpoint(iterator=restored).read(path).assert_consumed()
    for want in expected:
        got = next(restored)
        for key in want:
            np.testing.assert_array_equal(got[key].numpy(), want[key].numpy())
