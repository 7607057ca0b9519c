"""XLNet's row streams (PipelineConfig.format "xlnet_stream": data/xlnet_stream.py and
data/pipeline.py `_xlnet_batches`) on real text (conftest's `xlnet_shards`), against the
original's rules and a transcription of its `_split_a_and_b` (tests/xlnet_reference.py); and
a pretraining run on them that resumes exactly, memories included."""

import dataclasses
import random
import shutil

import numpy as np
import pytest
import tensorflow as tf

from core.errors import ConfigError
from data import instances, pipeline, shards, xlnet_stream
from data.pipeline_config import PipelineConfig
from models.encoder import EncoderConfig
from models.xlnet_options import XLNetOptions
from pretrain.objectives.permutation_lm import PermutationLM
from tests import tiny, xlnet_reference
from tests.test_carry import _carry_of

# Each test here reads hundreds of batches or trains: over the suite's 1.5 s rule.
pytestmark = pytest.mark.slow

L, REUSE, ROWS = 32, 16, 4
TOTAL = L - REUSE - 3  # |A| + |B|
CONFIG = PipelineConfig(
    format="xlnet_stream",
    sentence_objective="none",
    max_seq_length=L,
    reuse_len=REUSE,
    bi_data=True,
    max_predictions_per_seq=6,
    document_shuffle_buffer=8,
)


def _batches(data_dir, n, config=CONFIG, rows=ROWS, **kwargs):
    ds = pipeline.make_dataset(data_dir, "train", config, rows, **kwargs)
    return [{k: v.numpy() for k, v in b.items()} for b in ds.take(n)]


def _documents(data_dir):
    """Every train document's token ids, as a tuple."""
    files = shards.load_manifest(data_dir).files("train")
    records = tf.data.TFRecordDataset(files).map(instances.parse_document)
    return {tuple(doc["token_ids"].numpy()) for doc in records}


def _stream_documents(batches, row, eod):
    """The whole documents that row `row`'s reused parts, read one after another, hold (each
    between two <eod>s, or before the first: streams start at a document's start), in reading
    order."""
    text = np.concatenate([b["input_ids"][row, :REUSE] for b in batches])
    cuts = np.flatnonzero(text == eod)
    starts = np.concatenate([[0], cuts[:-1] + 1])
    return [tuple(text[s:e]) for s, e in zip(starts, cuts) if e > s]


@pytest.fixture(scope="module")
def stream(xlnet_shards):
    return _batches(xlnet_shards, 250)


def test_rows_continue_their_streams_of_whole_documents(stream, xlnet_shards):
    """Row r's reused part at step t + 1 follows its reused part at step t: read one after
    another, they are whole documents ended by <eod> (read backwards in the odd rows), each
    document in one stream only."""
    eod = shards.load_manifest(xlnet_shards).vocab.eod_id
    documents = _documents(xlnet_shards)
    seen = []
    for row in range(ROWS):
        found = _stream_documents(stream, row, eod)
        backward = row % 2 == 1
        assert found
        for doc in found:
            assert (doc[::-1] if backward else doc) in documents
        seen += [doc[::-1] if backward else doc for doc in found]
    assert len(seen) >= 2 * ROWS and len(seen) == len(set(seen))  # disjoint streams


def test_rows_are_reused_part_a_sep_b_sep_cls_with_their_targets(stream, xlnet_shards):
    vocab = shards.load_manifest(xlnet_shards).vocab
    budget = CONFIG.max_predictions_per_seq
    for t, batch in enumerate(stream[:-1]):
        np.testing.assert_array_equal(batch["direction"], [1, -1, 1, -1])
        for r in range(ROWS):
            ids, segments = batch["input_ids"][r], batch["segment_ids"][r]
            first = int((segments == 0).sum())  # the reused part, A and its <sep>
            assert first > REUSE and (segments[first:-1] == 1).all() and segments[-1] == 2
            assert ids[first - 1] == ids[-2] == vocab.sep_id and ids[-1] == vocab.cls_id
            np.testing.assert_array_equal(np.flatnonzero(batch["functional"][r]), [first - 1, L - 2, L - 1])
            # A starts where the next row's reused part starts: right after this one.
            a = ids[REUSE : first - 1]
            np.testing.assert_array_equal(a[:REUSE], stream[t + 1]["input_ids"][r, : len(a[:REUSE])])
            weights, positions = batch["target_weights"][r], batch["target_positions"][r]
            count = int(weights.sum())
            assert (
                budget - 3 <= count <= budget
                and (weights[:count] == 1).all()
                and (weights[count:] == 0).all()
            )
            chosen = positions[:count]
            assert (np.diff(chosen) > 0).all() and not batch["functional"][r][chosen].any()
            # The budget is split 3 / 3 between the reused part and the rest (<sep>/<cls> hits dropped).
            assert (chosen < REUSE).sum() == 3


def test_a_and_b_as_the_originals_split_draws_them(xlnet_shards):
    """On the same 300 windows of real text: |A| + |B| = L - reuse - 3 always; where A's text
    has a sentence boundary, B continues A about half of the time, and A's mean length is
    the transcription of `_split_a_and_b`'s (run on the window, the original's stream being
    out of reach)."""
    config = dataclasses.replace(CONFIG, bi_data=False)
    windows = _windows(xlnet_shards, config, 300)
    split = tf.function(lambda w, s: xlnet_stream.split_a_and_b(w, s, REUSE, TOTAL))
    ours, theirs = {"continuation": [], "a": []}, {"continuation": [], "a": []}
    rng = random.Random(0)
    for index, window in enumerate(windows):
        out = {k: int(v) for k, v in split(window, tf.constant([index, 1], tf.int64)).items()}
        assert (out["a_end"] - out["a_begin"]) + (out["b_end"] - out["b_begin"]) == TOTAL
        assert out["a_begin"] == REUSE and out["a_end"] > REUSE and out["b_end"] > out["b_begin"]
        if not out["continuation"]:  # from the lookahead, never the row's own text
            assert out["b_begin"] >= REUSE + TOTAL
        start = window["sentence_start"].numpy()
        if not start[REUSE + 1 : REUSE + TOTAL].any():  # no cut point: B never continues A
            assert not out["continuation"]
            continue
        ours["continuation"].append(out["continuation"])
        ours["a"].append(out["a_end"] - out["a_begin"])
        sent_ids = np.cumsum(start) % 2  # the original's flag flips at every sentence
        a, b, label, _ = xlnet_reference.split_a_and_b(window["ids"].numpy(), sent_ids, REUSE, TOTAL, rng)
        assert len(a) + len(b) == TOTAL
        theirs["continuation"].append(label)
        theirs["a"].append(len(a))
    # A's mean length within 10%; the continuation rate (each side's own coin flips, about 100
    # of each) within 4 standard errors of the difference of two such rates.
    assert abs(np.mean(ours["a"]) - np.mean(theirs["a"])) < 0.1 * np.mean(theirs["a"])
    p, n = np.mean(theirs["continuation"]), len(theirs["continuation"])
    assert abs(np.mean(ours["continuation"]) - p) < 4 * np.sqrt(p * (1 - p) * 2 / n), "continuation"
    assert len(ours["a"]) > 60 and 0.35 < np.mean(ours["continuation"]) < 0.65


def _windows(data_dir, config, n):
    files = shards.load_manifest(data_dir).files("train")
    eod = shards.load_manifest(data_dir).vocab.eod_id
    docs = tf.data.TFRecordDataset(files).map(instances.parse_document)
    tokens = docs.map(lambda d: xlnet_stream.document_tokens(d, eod, tf.constant(False))).unbatch()
    chunks = tokens.batch(config.reuse_len, drop_remainder=True)
    state = xlnet_stream.window_initial_state(config)
    windows = chunks.scan(state, xlnet_stream.window_step).filter(_full).map(_window)
    return list(windows.take(n))


def _full(full, window):
    return full


def _window(full, window):
    return window


def test_truncation_in_closed_form_equals_the_originals_loop():
    sizes = np.arange(0, 30)
    a, b = (m.ravel() for m in np.meshgrid(sizes, sizes))
    new_a, new_b = xlnet_stream.truncated_lengths(tf.constant(a), tf.constant(b), 21)
    for i in range(len(a)):
        assert (int(new_a[i]), int(new_b[i])) == xlnet_reference.truncated_lengths(a[i], b[i], 21), (
            a[i],
            b[i],
        )


def test_a_resumed_stream_continues_exactly(xlnet_shards, tmp_path):
    ds = pipeline.make_dataset(xlnet_shards, "train", CONFIG, ROWS)
    it = iter(ds)
    for _ in range(7):
        next(it)
    tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    expected = [next(it) for _ in range(3)]
    restored = iter(pipeline.make_dataset(xlnet_shards, "train", CONFIG, ROWS))
    tf.train.Checkpoint(iterator=restored).read(str(tmp_path / "ckpt")).assert_consumed()
    for want in expected:
        got = next(restored)
        for key in want:
            np.testing.assert_array_equal(got[key].numpy(), want[key].numpy())


def test_hosts_read_disjoint_documents(xlnet_shards):
    eod = shards.load_manifest(xlnet_shards).vocab.eod_id
    config = dataclasses.replace(CONFIG, bi_data=False)
    found = []
    for host in range(2):
        batches = _batches(xlnet_shards, 250, config, rows=2, process_index=host, process_count=2)
        found.append({doc for row in range(2) for doc in _stream_documents(batches, row, eod)})
    assert found[0] and found[1] and not found[0] & found[1]


def test_fewer_documents_than_rows_feed_every_row_by_turns(xlnet_shards, caplog):
    """The held-out split's documents (10) for 16 rows: every row is fed (no stream waits for
    a document forever), with a warning."""
    documents = shards.load_manifest(xlnet_shards).splits["eval"]["documents"]
    assert documents < 16
    ds = pipeline.make_dataset(xlnet_shards, "eval", CONFIG, 16, shuffle=False)
    batches = [b["input_ids"].numpy() for b in ds.take(4)]
    assert all(len(set(row.tolist())) > 3 for batch in batches for row in batch)
    assert f"{documents} documents for 16 row streams" in caplog.text


def test_what_the_stream_refuses(xlnet_shards, text_shards):
    with pytest.raises(ConfigError, match="ends documents with <eod>, which the shards' tokenizer lacks"):
        pipeline.make_dataset(text_shards, "train", CONFIG, ROWS)
    with pytest.raises(ConfigError, match="give each host an even number of rows"):
        pipeline.make_dataset(xlnet_shards, "train", CONFIG, 3)
    with pytest.raises(ConfigError, match="reuse_len = 0 must be in"):
        dataclasses.replace(CONFIG, reuse_len=0)
    with pytest.raises(ConfigError, match="leave PipelineConfig.masking, masking_unit and replacement unset"):
        dataclasses.replace(CONFIG, masking_unit="whole_word")
    with pytest.raises(ConfigError, match="it must be in"):
        dataclasses.replace(CONFIG, max_predictions_per_seq=40)


# --- pretraining on the stream -----------------------------------------------------------------

XLNET_TINY = EncoderConfig(
    vocab_size=600,
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    intermediate_size=64,
    hidden_act="gelu_tanh",
    type_vocab_size=0,
    pooler=False,
    xlnet=XLNetOptions(mem_len=24, reuse_len=REUSE),
)


@pytest.mark.slow(30)
def test_pretraining_resumes_to_the_uninterrupted_run_memories_included(xlnet_shards, tmp_path):
    """4 steps of PermutationLM on the stream, then the same run stopped after step 2 and
    resumed: the same parameters, memories and held-out metrics (the data position and the
    memory restored together)."""
    settings = dict(
        objective=PermutationLM,
        model_config=XLNET_TINY,
        pipeline_config=CONFIG,
        batch_size=8,
        checkpoint_every=2,
        log_every=2,
    )
    full = tiny.run(tmp_path, xlnet_shards, steps=4, **settings)
    assert 0 < full["eval"]["plm_accuracy"] < 1 and np.isfinite(full["eval"]["plm_loss"])
    memory = _carry_of(tmp_path, 4)["memory"]
    assert np.abs(memory).max() > 0
    shutil.rmtree(tmp_path / "checkpoints" / "4")  # what a preemption after step 3 leaves
    resumed = tiny.run(tmp_path, xlnet_shards, steps=4, **settings)
    assert resumed["resumed_from"] == 2
    assert resumed["params_sha256"] == full["params_sha256"] and resumed["eval"] == full["eval"]
    np.testing.assert_array_equal(_carry_of(tmp_path, 4)["memory"], memory)
