"""BERT instance creation: chunking, random B, truncation and the [CLS] A [SEP] B [SEP] format.

Every op is checked eagerly and inside tf.data (docs/architecture.md "Style").
"""

import functools

import numpy as np
import pytest
import tensorflow as tf

from data import instances, shards, synthetic

MAX_LEN = 32


def _doc(doc_id, sentences):
    return {
        "token_ids": tf.constant([t for s in sentences for t in s], tf.int32),
        "sentence_lengths": tf.constant([len(s) for s in sentences], tf.int32),
        "doc_id": tf.constant(doc_id, tf.int64),
    }


@functools.cache
def _traced_chunker(short_seq_prob, random_next_prob, max_len):
    """chunk_document as one traced graph: the statistics tests chunk hundreds of
    documents, which eagerly costs seconds (the other tests run it eagerly)."""

    def chunk(doc, seed):
        return instances.chunk_document(
            doc,
            seed=seed,
            max_seq_length=max_len,
            short_seq_prob=short_seq_prob,
            random_next_prob=random_next_prob,
        )

    return tf.function(chunk, reduce_retracing=True)


def _chunks(doc_id, sentences, seed, short_seq_prob=0.0, random_next_prob=0.5, max_len=MAX_LEN, traced=False):
    if traced:
        chunk = _traced_chunker(short_seq_prob, random_next_prob, max_len)
    else:
        chunk = functools.partial(
            instances.chunk_document,
            max_seq_length=max_len,
            short_seq_prob=short_seq_prob,
            random_next_prob=random_next_prob,
        )
    out = chunk(_doc(doc_id, sentences), seed=tf.constant([seed, 0], tf.int64))
    return [
        {k: (v[i].numpy() if isinstance(v, tf.RaggedTensor) else v.numpy()[i]) for k, v in out.items()}
        for i in range(int(tf.shape(out["chunk_index"])[0]))
    ]


def _sentences_of(tokens):
    """Ordered distinct (doc, sentence) pairs that the tokens come from."""
    seen = []
    for t in tokens:
        key = synthetic.doc_and_sentence(int(t))
        if not seen or seen[-1] != key:
            seen.append(key)
    return seen


@pytest.mark.slow
def test_chunks_cover_every_sentence_once_and_b_follows_a():
    docs = synthetic.make_documents(40, seed=3)
    for doc_id, sentences in docs.items():
        used = []
        for row in _chunks(doc_id, sentences, seed=doc_id):
            a = _sentences_of(row["a_tokens"])
            assert a, "A is never empty"
            used += a
            if row["is_random_next"]:
                assert len(row["b_tokens"]) == 0
            else:
                b = _sentences_of(row["b_tokens"])
                assert b and b[0][1] == a[-1][1] + 1, "IsNext B starts right after A"
                used += b
        # NotNext puts B's sentences back, so every sentence is used exactly once, in order.
        assert used == [(doc_id, s) for s in range(len(sentences))]


@pytest.mark.slow
def test_chunk_lengths_follow_target_and_short_seq_prob():
    docs = synthetic.make_documents(300, seed=4, max_sentences=20, max_len=10)
    short_docs = 0
    for doc_id, sentences in docs.items():
        rows = _chunks(doc_id, sentences, seed=doc_id, short_seq_prob=0.1, traced=True)
        lengths = [len(r["a_tokens"]) + len(r["b_tokens"]) for r in rows]
        # The target is drawn once per document; every chunk but the last reaches it.
        targets = {r["target_b_length"] + len(r["a_tokens"]) for r in rows}
        assert len(targets) == 1
        target = targets.pop()
        assert 2 <= target <= MAX_LEN - 3
        short_docs += target < MAX_LEN - 3
        for r, n in zip(rows[:-1], lengths[:-1]):
            if not r["is_random_next"]:
                assert n >= target
    assert 0.05 < short_docs / len(docs) < 0.16


def test_one_sentence_chunks_are_always_random_next():
    rows = _chunks(5, [[synthetic.token(5, 0)] * 40], seed=1)
    assert len(rows) == 1 and rows[0]["is_random_next"]


@pytest.mark.slow
def test_nsp_balance():
    docs = synthetic.make_documents(100, seed=5, max_sentences=99, max_len=6)
    labels = []
    for doc_id, sentences in docs.items():
        for row in _chunks(doc_id, sentences, seed=doc_id, traced=True):
            first = _sentences_of(row["a_tokens"])[0][1]
            # Far from the document's end a chunk closes by reaching the target (29 tokens) with
            # >= 2 sentences, so its label is a free 50/50 draw. Near the end, chunks close at the
            # document's end and one-sentence chunks are forced NotNext (as in the original).
            if sum(len(s) for s in sentences[first:]) >= 2 * MAX_LEN:
                labels.append(row["is_random_next"])
    assert len(labels) > 500
    assert 0.45 < np.mean(labels) < 0.55, np.mean(labels)


@pytest.mark.slow
def test_random_next_prob_zero_gives_is_next_for_multi_sentence_chunks():
    docs = synthetic.make_documents(30, seed=6, max_sentences=30, max_len=6)
    for doc_id, sentences in docs.items():
        for row in _chunks(doc_id, sentences, seed=doc_id, random_next_prob=0.0):
            assert not row["is_random_next"] or len(_sentences_of(row["a_tokens"])) == 1


def _candidates(docs, ids):
    return {
        "token_ids": tf.ragged.constant([[t for s in docs[i] for t in s] for i in ids], tf.int32),
        "sentence_lengths": tf.ragged.constant([[len(s) for s in docs[i]] for i in ids], tf.int32),
        "doc_id": tf.constant(ids, tf.int64),
    }


def _chunk_row(a, b, is_random, target_b, doc_id=0):
    return {
        "a_tokens": tf.constant(a, tf.int32),
        "b_tokens": tf.constant(b, tf.int32),
        "is_random_next": tf.constant(is_random),
        "target_b_length": tf.constant(target_b, tf.int32),
        "chunk_index": tf.constant(0, tf.int32),
        "doc_id": tf.constant(doc_id, tf.int64),
    }


def test_random_b_comes_from_another_document_and_fills_target():
    docs = synthetic.make_documents(5, seed=6, max_len=5)
    a = [synthetic.token(0, 0)] * 3
    for seed in range(20):
        for ids in ([1, 2], [0, 3]):  # the second pair starts with the chunk's own document
            out = instances.attach_random_b(
                _chunk_row(a, [], True, 8), _candidates(docs, ids), seed=tf.constant([seed, 1], tf.int64)
            )
            b = out["b_tokens"].numpy()
            expected_doc = ids[1] if ids[0] == 0 else ids[0]
            assert bool(out["valid"]) and int(out["b_doc_id"]) == expected_doc
            src = _sentences_of(b)
            assert {d for d, _ in src} == {expected_doc}
            sentences = [s for _, s in src]
            assert sentences == list(range(sentences[0], sentences[-1] + 1)), "contiguous sentences"
            # Stops at the first sentence that reaches the target, or at the document's end.
            reached = len(b) >= 8
            at_end = sentences[-1] == len(docs[expected_doc]) - 1
            assert reached or at_end
            if len(src) > 1:
                assert len(b) - len(docs[expected_doc][sentences[-1]]) < 8


def test_random_b_invalid_when_no_other_document():
    docs = synthetic.make_documents(2, seed=7)
    out = instances.attach_random_b(
        _chunk_row([synthetic.token(0, 0)], [], True, 5, doc_id=0),
        _candidates(docs, [0, 0]),
        seed=tf.constant([1, 1], tf.int64),
    )
    assert not bool(out["valid"])


def test_is_next_keeps_its_own_b():
    docs = synthetic.make_documents(3, seed=8)
    out = instances.attach_random_b(
        _chunk_row([7, 7], [8, 8, 8], False, 5), _candidates(docs, [1, 2]), seed=tf.constant([1, 1], tf.int64)
    )
    assert out["b_tokens"].numpy().tolist() == [8, 8, 8] and bool(out["valid"])


def _reference_truncate(len_a, len_b, max_num_tokens):
    """google-research/bert truncate_seq_pair, counting tokens removed from each side."""
    a, b = len_a, len_b
    while a + b > max_num_tokens:
        if a > b:
            a -= 1
        else:
            b -= 1
    return a, b


@pytest.mark.parametrize("len_a,len_b", [(3, 4), (40, 3), (3, 40), (20, 20), (25, 19), (1, 60), (29, 0)])
def test_truncate_matches_reference_lengths_and_keeps_contiguous_spans(len_a, len_b):
    a, b = np.arange(len_a) + 100, np.arange(len_b) + 500
    fronts = []
    for seed in range(30):
        out = instances.truncate_pair(
            {"a_tokens": tf.constant(a, tf.int32), "b_tokens": tf.constant(b, tf.int32)},
            seed=tf.constant([seed, 2], tf.int64),
            max_num_tokens=MAX_LEN - 3,
        )
        new_a, new_b = out["a_tokens"].numpy(), out["b_tokens"].numpy()
        assert (len(new_a), len(new_b)) == _reference_truncate(len_a, len_b, MAX_LEN - 3)
        for old, new in ((a, new_a), (b, new_b)):
            if len(new):
                start = int(new[0] - old[0])
                assert (new == old[start : start + len(new)]).all()
                fronts.append(start)
    if len_a + len_b > MAX_LEN + 5:  # enough trimming to see both ends used
        assert 0 < np.mean([f > 0 for f in fronts])


def test_format_pair_layout():
    out = instances.format_pair(
        {
            "a_tokens": tf.constant([10, 11], tf.int32),
            "b_tokens": tf.constant([20, 21, 22], tf.int32),
            "is_random_next": tf.constant(True),
        },
        max_seq_length=12,
        cls_id=2,
        sep_id=3,
        pad_id=0,
    )
    assert out["input_ids"].numpy().tolist() == [2, 10, 11, 3, 20, 21, 22, 3, 0, 0, 0, 0]
    assert out["segment_ids"].numpy().tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0]
    assert out["input_mask"].numpy().tolist() == [1] * 8 + [0] * 4
    assert out["positions"].numpy().tolist() == list(range(12))
    assert int(out["sentence_label"]) == 1  # 1 = NotNext, as the original and the published heads


@pytest.mark.slow
def test_ops_inside_tf_data_match_eager():
    docs = synthetic.make_documents(6, seed=9)
    seed = tf.constant([3, 4], tf.int64)

    def pipeline(doc):
        rows = instances.chunk_document(doc, seed=seed, max_seq_length=MAX_LEN, short_seq_prob=0.1)
        return tf.data.Dataset.from_tensor_slices(rows)

    def finish(chunk):
        pair = instances.truncate_pair(chunk, seed=seed, max_num_tokens=MAX_LEN - 3)
        return instances.format_pair(pair, max_seq_length=MAX_LEN, cls_id=2, sep_id=3, pad_id=0)

    records = [instances.parse_document(tf.constant(shards.encode_document(d, s))) for d, s in docs.items()]
    eager = []
    for doc in records:
        rows = instances.chunk_document(doc, seed=seed, max_seq_length=MAX_LEN, short_seq_prob=0.1)
        for i in range(int(tf.shape(rows["chunk_index"])[0])):
            eager.append(finish({k: v[i] for k, v in rows.items()})["input_ids"].numpy())
    ds = tf.data.Dataset.from_tensor_slices([shards.encode_document(d, s) for d, s in docs.items()])
    graph = [
        r["input_ids"]
        for r in ds.map(instances.parse_document).flat_map(pipeline).map(finish).as_numpy_iterator()
    ]
    assert len(graph) == len(eager) > len(docs)
    for x, y in zip(graph, eager):
        np.testing.assert_array_equal(x, y)
