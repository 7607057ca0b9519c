"""data.preprocess: corpus + tokenizer -> shards + manifest; no-op re-runs; clear errors."""

import functools
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from data import corpora, instances, preprocess, shards, tokenizers
from tests import cli_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = (
    "the cat sat on a mat while dogs ran far away from big red barns and small green "
    "houses near old stone walls under bright blue skies"
).split()


def _write_corpus(path, num_docs=30, seed=0):
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(num_docs):
        sentences = [
            " ".join(rng.choice(WORDS, size=int(rng.integers(3, 12)))).capitalize() + "."
            for _ in range(int(rng.integers(2, 7)))
        ]
        docs.append("\n".join(sentences))
    path.write_text("\n\n".join(docs) + "\n")
    return docs


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tok")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *sorted(set(WORDS))]
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizers.load_tokenizer(str(directory / "vocab.txt")).save(str(directory / "saved"))
    return str(directory / "saved")


def _read(output, split):
    files = shards.load_manifest(output).files(split)
    return list(tf.data.TFRecordDataset(files).map(instances.parse_document).as_numpy_iterator())


@pytest.mark.slow
def test_shards_hold_every_document_with_sentences_kept(tmp_path, tokenizer_dir):
    texts = _write_corpus(tmp_path / "corpus.txt", num_docs=40)
    out = str(tmp_path / "out")
    manifest = preprocess.preprocess(
        str(tmp_path / "corpus.txt"),
        tokenizer_dir,
        out,
        num_shards=3,
        eval_fraction=0.2,
        num_workers=2,
        log=lambda *_: None,
    )
    train, held = _read(out, "train"), _read(out, "eval")
    assert len(train) + len(held) == 40 and held and train
    assert manifest.splits["train"]["documents"] == len(train)
    assert sorted(int(d["doc_id"]) for d in train + held) == list(range(40))
    tok = tokenizers.load_tokenizer(tokenizer_dir)
    for doc in train + held:
        sentences = texts[int(doc["doc_id"])].split("\n")
        assert doc["sentence_lengths"].tolist() == [len(tok.encode(s)) for s in sentences]
        assert doc["token_ids"].tolist() == [t for s in sentences for t in tok.encode(s)]
    assert manifest.vocab_size == tok.vocab_size
    assert manifest.fields["special_ids"] == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    assert manifest.tokenizer == tok.identity()
    assert tokenizers.load_tokenizer(os.path.join(out, shards.TOKENIZER_DIR)).identity() == tok.identity()
    # Shard and order come from a hash of the text, not from the corpus order or the workers.
    for name in manifest.splits["train"]["files"]:
        docs = list(
            tf.data.TFRecordDataset(os.path.join(out, name)).map(instances.parse_document).as_numpy_iterator()
        )
        keys = [
            preprocess.order_key(corpora.Document(tuple(texts[int(d["doc_id"])].split("\n")), ""), 0)
            for d in docs
        ]
        assert all(shard % 3 == int(name.split("-")[1]) for shard, _ in keys)
        assert [order for _, order in keys] == sorted(order for _, order in keys)
    assert not os.path.exists(os.path.join(out, manifest.splits["train"]["files"][0] + ".unsorted"))
    one_worker = str(tmp_path / "one_worker")
    preprocess.preprocess(
        str(tmp_path / "corpus.txt"),
        tokenizer_dir,
        one_worker,
        num_shards=3,
        eval_fraction=0.2,
        num_workers=1,
        log=lambda *_: None,
    )
    for name in manifest.splits["train"]["files"] + manifest.splits["eval"]["files"]:
        with open(os.path.join(out, name), "rb") as a, open(os.path.join(one_worker, name), "rb") as b:
            assert a.read() == b.read(), f"{name} depends on the number of workers"


def test_rerun_is_a_noop_and_changed_input_needs_overwrite(tmp_path, tokenizer_dir):
    corpus = tmp_path / "corpus.txt"
    _write_corpus(corpus)
    out = str(tmp_path / "out")
    preprocess.preprocess(
        str(corpus), tokenizer_dir, out, num_workers=1, eval_fraction=0.2, log=lambda *_: None
    )
    stamp = os.path.getmtime(os.path.join(out, shards.MANIFEST))
    messages = []
    preprocess.preprocess(
        str(corpus), tokenizer_dir, out, num_workers=1, eval_fraction=0.2, log=messages.append
    )
    assert "up to date" in messages[0]
    assert os.path.getmtime(os.path.join(out, shards.MANIFEST)) == stamp
    _write_corpus(corpus, seed=1)
    os.utime(corpus, (stamp + 10, stamp + 10))
    with pytest.raises(preprocess.PreprocessError, match="--overwrite"):
        preprocess.preprocess(str(corpus), tokenizer_dir, out, num_workers=1, eval_fraction=0.2)
    preprocess.preprocess(
        str(corpus),
        tokenizer_dir,
        out,
        num_workers=1,
        eval_fraction=0.2,
        overwrite=True,
        num_shards=3,
        log=lambda *_: None,
    )
    # the replaced shards (8 train files) are gone, not left beside the new ones
    assert sorted(name for name in os.listdir(out) if name.startswith("train-")) == [
        f"train-0000{i}-of-00003.tfrecord" for i in range(3)
    ]


def test_single_sentence_documents_warn_then_fail_when_most(tmp_path, tokenizer_dir):
    corpus = tmp_path / "c.txt"
    _write_corpus(corpus, num_docs=30)
    with open(corpus, "a") as f:
        f.write("\nThe cat sat.\n")
    messages = []
    preprocess.preprocess(
        str(corpus), tokenizer_dir, str(tmp_path / "a"), num_workers=1, eval_fraction=0.2, log=messages.append
    )
    assert any(m.startswith("warning: 1 of 31 documents have a single sentence (first: ") for m in messages)
    # A blank line between every sentence: almost every document has one sentence.
    (tmp_path / "d.txt").write_text("\n\n".join(f"The cat sat {w}." for w in WORDS) + "\n")
    with pytest.raises(preprocess.PreprocessError, match="one sentence per line, a blank line only between"):
        preprocess.preprocess(
            str(tmp_path / "d.txt"), tokenizer_dir, str(tmp_path / "b"), num_workers=1, eval_fraction=0.2
        )


def test_a_shard_left_empty_by_the_hash_is_an_error_and_leaves_no_shard(tmp_path, tokenizer_dir):
    """The error comes once the shards are written: they are removed (no manifest, so they are
    no output), and a rerun with fewer shards leaves only its own."""
    _write_corpus(tmp_path / "c.txt", num_docs=6)
    out = tmp_path / "o"
    with pytest.raises(preprocess.PreprocessError, match="got none of the 6 train documents.*fewer shards"):
        preprocess.preprocess(
            str(tmp_path / "c.txt"), tokenizer_dir, str(out), num_shards=16, eval_fraction=0.0, num_workers=1
        )
    assert os.listdir(out) == []
    preprocess.preprocess(
        str(tmp_path / "c.txt"), tokenizer_dir, str(out), num_shards=2, eval_fraction=0.0, num_workers=1
    )
    assert sorted(p.name for p in out.glob("*.tfrecord")) == [
        "eval-00000-of-00001.tfrecord",
        "train-00000-of-00002.tfrecord",
        "train-00001-of-00002.tfrecord",
    ]


def test_shard_writer_routes_counts_and_sorts_documents(tmp_path):
    writer = preprocess.ShardWriter(str(tmp_path), {"train": 2, "eval": 1}, vocab_size=12)
    batch = preprocess.DocumentBatch(
        documents=[(0, ["a b", "c"]), (1, ["d"]), (2, ["e"]), (3, ["f", "g"]), (4, ["h i"])],
        heldout=[False, False, True, False, False],
        sources=["s0", "s1", "s2", "s3", "s4"],
        # (shard key, order key): documents 0 and 4 share train shard 0, 4 sorts first.
        keys=[(0, 5), (1, 7), (4, 1), (2, 3), (2, 2)],
    )
    T = preprocess.Tokenized.of
    tokenized = [T(0, [[5, 6], [7]], 0), T(1, [[8]], 1), T(2, [[9]], 0), T(3, [], 2), T(4, [[10, 10]], 0)]
    writer.write(batch, tokenized)
    writer.close()
    assert sorted(os.listdir(tmp_path)) == sorted(
        os.path.basename(path) + ".unsorted" for path in writer.all_paths
    )
    assert writer.per_shard == {"train": [2, 1], "eval": [1]}
    assert (writer.dropped_sentences, writer.dropped_documents, writer.first_single) == (3, 1, "s1")
    # Train tokens per id; the held-out document's 9 is not counted.
    assert writer.unigrams.tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 2, 0]
    counts = writer.manifest_counts()
    assert counts["splits"] == {
        "train": {
            "files": ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"],
            "documents": 3,
            "sentences": 4,
            "tokens": 6,
            "single_sentence_documents": 2,
        },
        "eval": {
            "files": ["eval-00000-of-00001.tfrecord"],
            "documents": 1,
            "sentences": 1,
            "tokens": 1,
            "single_sentence_documents": 1,
        },
    }
    assert (counts["dropped_empty_sentences"], counts["dropped_empty_documents"]) == (3, 1)
    assert counts[shards.UNIGRAM_COUNTS] == writer.unigrams.tolist()
    for path in writer.all_paths:
        preprocess._sort_shard(path)
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(path) for path in writer.all_paths)

    def read(name):
        records = tf.data.TFRecordDataset(str(tmp_path / name)).map(instances.parse_document)
        return [(int(d["doc_id"]), d["token_ids"].tolist()) for d in records.as_numpy_iterator()]

    assert read("train-00000-of-00002.tfrecord") == [(4, [10, 10]), (0, [5, 6, 7])]
    assert read("train-00001-of-00002.tfrecord") == [(1, [8])]
    assert read("eval-00000-of-00001.tfrecord") == [(2, [9])]


def test_shard_writer_removes_its_unsorted_files(tmp_path):
    writer = preprocess.ShardWriter(str(tmp_path), {"train": 2, "eval": 1}, vocab_size=12)
    writer.write(
        preprocess.DocumentBatch([(0, ["a"])], [False], ["s"], [(0, 0)]),
        [preprocess.Tokenized.of(0, [[5]], 0)],
    )
    writer.close()
    writer.remove_unsorted()
    assert os.listdir(tmp_path) == []


def _records_digest(path):
    """sha256 of a shard's records in order, each serialized deterministically: a plain
    SerializeToString writes the feature map in an order that differs between processes."""
    digest = hashlib.sha256()
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        digest.update(tf.train.Example.FromString(record).SerializeToString(deterministic=True))
    return digest.hexdigest()


# The output for this corpus and options as data/preprocess.py wrote it before ShardWriter
# (its records, their order, and manifest.json with the fingerprint, the seconds and the
# corpus's directory masked): what preprocessing writes must not change. (The manifest has
# counted the duplicates dropped, "dropped_duplicate_documents": 0 here, since they are.)
PINNED_SHARDS = {
    "train-00000-of-00003.tfrecord": "3899e9ed1b268f97e1c013821ef00fc9a8947484c403518c4e59de6943d83bf6",
    "train-00001-of-00003.tfrecord": "0120bbe50072d0dbb64b1838c4352c0e0ea6dfd99bd999c588827ec93c219b5e",
    "train-00002-of-00003.tfrecord": "33c5e8493e486e890721c3fbdfa4b16f954acde7831e11f916ac38f0a02cff2f",
    "eval-00000-of-00002.tfrecord": "37d530d334507d1be844451aa72336c588eef1e8d5c7370dfa3b2dc173403314",
    "eval-00001-of-00002.tfrecord": "a53029e7ef07af9b7ee1a707ad2e14abcb5165805c102ba64474dc225bcb2e0e",
}
PINNED_MANIFEST = "8a75da4e49b612c9c0f85c7ec1d340a7712546a0885a819d7bad4041e5e8d161"


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [1, 2])
@pytest.mark.extended(keep=["1"])
def test_output_is_pinned(tmp_path, tokenizer_dir, num_workers):
    _write_corpus(tmp_path / "corpus.txt", num_docs=40)
    out = str(tmp_path / "out")
    manifest = preprocess.preprocess(
        str(tmp_path / "corpus.txt"),
        tokenizer_dir,
        out,
        num_shards=3,
        num_eval_shards=2,
        eval_fraction=0.2,
        num_workers=num_workers,
        log=lambda *_: None,
    )
    names = manifest.splits["train"]["files"] + manifest.splits["eval"]["files"]
    assert {name: _records_digest(os.path.join(out, name)) for name in names} == PINNED_SHARDS
    with open(os.path.join(out, shards.MANIFEST)) as f:
        text = re.sub(r'"(fingerprint|seconds)": [^,\n]+', r'"\1": null', f.read())
    assert hashlib.sha256(text.replace(str(tmp_path), "TMP").encode()).hexdigest() == PINNED_MANIFEST


# `python THIS_SCRIPT ARGS` runs data.preprocess with one step wrapped so that the worker
# given the first batch (or the first shard to sort) SIGKILLs itself, as the out-of-memory
# killer would. Spawned workers run this script's top level too (as __mp_main__), so the
# wrapper that the main process hands them exists there.
_KILL_SCRIPT = """
import os, signal, sys

from data import preprocess

STEP = os.environ["KILLED_STEP"]
_step = getattr(preprocess, STEP)


def _killed_on_the_first(work, *rest):
    first = work[0][0] == 0 if STEP == "_tokenize_batch" else work.endswith("train-00000-of-00008.tfrecord")
    if first:
        os.kill(os.getpid(), signal.SIGKILL)
    return _step(work, *rest)


setattr(preprocess, STEP, _killed_on_the_first)

if __name__ == "__main__":
    sys.exit(preprocess.main(sys.argv[1:]))
"""


@pytest.mark.slow(20)
@pytest.mark.parametrize(
    "step, lost",
    [
        ("_tokenize_batch", "tokenizing documents 0-63"),
        ("_sort_shard", "sorting train-00000-of-00008.tfrecord"),
    ],
)
@pytest.mark.extended
def test_a_killed_worker_is_one_error_line_not_a_hang(tmp_path, tokenizer_dir, step, lost):
    # multiprocessing.Pool replaced the dead worker and waited forever for its result.
    _write_corpus(tmp_path / "c.txt", num_docs=300)
    (tmp_path / "kill.py").write_text(_KILL_SCRIPT)
    out = tmp_path / "o"
    args = [
        f"--corpus={tmp_path / 'c.txt'}",
        f"--tokenizer={tokenizer_dir}",
        f"--output={out}",
        "--num_workers=2",
    ]
    env = dict(os.environ, KILLED_STEP=step, PYTHONPATH=ROOT)
    try:
        result = subprocess.run(
            [sys.executable, str(tmp_path / "kill.py"), *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("preprocessing hung after a worker was killed")
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert f"a preprocessing worker process died while {lost}" in errors[0]
    assert "out-of-memory" in errors[0] and "fewer --num_workers (now 2) or more memory" in errors[0]
    assert "Traceback" not in result.stderr
    assert not (out / shards.MANIFEST).exists()  # the shards are not presented as complete
    assert not [name for name in os.listdir(out) if name.endswith(".unsorted")]


@pytest.fixture
def _cli(capsys):
    """`python -m data.preprocess ARGS`, run in this process (tests/cli_run.py)."""
    return lambda *args: cli_run.run(preprocess.main, args, capsys)


def _error_lines(result):
    return result.errors()


@pytest.mark.parametrize(
    "make_corpus, message",
    [
        (lambda p: str(p / "missing*.txt"), "no files match"),
        (
            lambda p: (p.joinpath("empty.txt").write_text("\n\n"), str(p / "empty.txt"))[1],
            "contains no documents",
        ),
        (
            lambda p: (
                p.joinpath("bad.txt").write_bytes(b"Good line.\nBad \xff byte.\n"),
                str(p / "bad.txt"),
            )[1],
            "bad.txt:2: not valid UTF-8",
        ),
        (
            lambda p: (p.joinpath("long.txt").write_text("word " * 210_000 + "\n"), str(p / "long.txt"))[1],
            "long.txt:1: line is 1050000 characters long",
        ),
    ],
)
def test_cli_bad_corpus_gives_one_error_line(tmp_path, tokenizer_dir, _cli, make_corpus, message):
    result = _cli(
        f"--corpus={make_corpus(tmp_path)}",
        f"--tokenizer={tokenizer_dir}",
        f"--output={tmp_path / 'o'}",
        "--num_workers=1",
    )
    assert result.returncode == 2
    assert len(_error_lines(result)) == 1 and message in _error_lines(result)[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "o" / shards.MANIFEST)
    # No half-written copy of the corpus is left behind.
    leftovers = (
        [n for n in os.listdir(tmp_path / "o") if n.endswith(".unsorted")]
        if (tmp_path / "o").exists()
        else []
    )
    assert not leftovers


def test_cli_missing_tokenizer(tmp_path, _cli):
    _write_corpus(tmp_path / "c.txt")
    result = _cli(
        f"--corpus={tmp_path / 'c.txt'}", f"--tokenizer={tmp_path / 'nope'}", f"--output={tmp_path / 'o'}"
    )
    assert result.returncode == 2 and len(_error_lines(result)) == 1 and "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.extended
def test_manifest_is_json_with_counts(tmp_path, tokenizer_dir, _cli):
    _write_corpus(tmp_path / "c.txt")
    result = _cli(
        f"--corpus={tmp_path / 'c.txt'}",
        f"--tokenizer={tokenizer_dir}",
        f"--output={tmp_path / 'o'}",
        "--num_shards=2",
        "--eval_fraction=0.2",
        "--num_workers=2",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    manifest = json.loads((tmp_path / "o" / shards.MANIFEST).read_text())
    assert manifest["splits"]["train"]["files"] == [
        "train-00000-of-00002.tfrecord",
        "train-00001-of-00002.tfrecord",
    ]
    total = manifest["splits"]["train"]["documents"] + manifest["splits"]["eval"]["documents"]
    assert total == 30 and "wrote" in result.stdout


# ---- data order: a batch draws from across the corpus -----------------------------------

SOURCES = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")


@pytest.fixture(scope="module")
def sources_corpus(tmp_path_factory):
    """8 text files ("sources"), 50 documents each, read in corpus order one source after
    another (as a corpus of Wikipedia, then books, ...). Every sentence of source k starts
    with the word SOURCES[k], so any row tells which sources it came from."""
    directory = tmp_path_factory.mktemp("sources")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *sorted(set(WORDS)), *SOURCES]
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    rng = np.random.default_rng(5)
    paths = []
    for name in SOURCES:
        docs = [
            "\n".join(
                f"{name} " + " ".join(rng.choice(WORDS, size=int(rng.integers(3, 10)))) + "."
                for _ in range(int(rng.integers(2, 6)))
            )
            for _ in range(50)
        ]
        path = directory / f"{name}.txt"
        path.write_text("\n\n".join(docs) + "\n")
        paths.append(str(path))
    return ",".join(paths), str(directory / "vocab.txt")


def _sources_per_batch(data_dir, batches=12, **config):
    """Mean number of distinct sources among the A segments of a batch of 16 rows."""
    from data import pipeline

    tok = tokenizers.load_tokenizer(os.path.join(data_dir, shards.TOKENIZER_DIR))
    marker_ids = {tok.encode(name)[0]: name for name in SOURCES}
    settings = dict(max_seq_length=64, document_shuffle_buffer=20, instance_shuffle_buffer=50, dupe_factor=1)
    ds = pipeline.make_dataset(data_dir, "train", pipeline.PipelineConfig(**{**settings, **config}), 16)
    counts = []
    for batch in ds.take(batches).as_numpy_iterator():
        ids = batch["input_ids"].copy()
        for r in range(len(ids)):
            w = batch["masked_lm_weights"][r] > 0
            ids[r, batch["masked_lm_positions"][r][w]] = batch["masked_lm_ids"][r][w]
        a_tokens = ids[(batch["segment_ids"] == 0) & (batch["input_mask"] == 1)]
        counts.append(len({marker_ids[t] for t in a_tokens.tolist() if t in marker_ids}))
    return float(np.mean(counts))


@pytest.mark.slow
def test_a_batch_draws_documents_from_across_the_corpus(tmp_path, sources_corpus):
    # The original shuffles all documents before making instances (google-research/bert
    # create_pretraining_data.py: rng.shuffle(all_documents)), so a batch mixes sources.
    # With shards in corpus order, a 20-document buffer (1000 for millions of documents)
    # sees one region of the corpus: one or two sources per batch.
    corpus, vocab = sources_corpus
    out = str(tmp_path / "out")
    preprocess.preprocess(
        corpus, vocab, out, num_shards=4, eval_fraction=0.0, num_workers=1, log=lambda *_: None
    )
    per_batch = _sources_per_batch(out)
    print(f"sources per batch of 16 rows: {per_batch:.2f} of {len(SOURCES)}")
    assert per_batch >= 5, per_batch


def test_bpe_shards_hold_each_document_as_its_joined_text(tmp_path):
    # Byte-level BPE (RoBERTa): a sentence after the first keeps the space that joins it to
    # the one before ("ĠThe", not "The"), as fairseq encodes whole lines
    # (examples/roberta/multiprocessing_bpe_encoder.py), so FULL-SENTENCES rows decode as
    # "... mat. The ..." and not "... mat.The ...".
    texts = _write_corpus(tmp_path / "corpus.txt", num_docs=12)
    tok = tokenizers.train_bpe([text.split("\n") for text in texts], 400)
    tok.save(str(tmp_path / "bpe"))
    out = str(tmp_path / "out")
    preprocess.preprocess(
        str(tmp_path / "corpus.txt"),
        str(tmp_path / "bpe"),
        out,
        num_shards=2,
        eval_fraction=0.0,
        num_workers=1,
        log=lambda *_: None,
    )
    documents = _read(out, "train")
    assert len(documents) == 12
    for doc in documents:
        sentences = texts[int(doc["doc_id"])].split("\n")
        assert doc["token_ids"].tolist() == tok.encode(" ".join(sentences))
        assert tok.decode(doc["token_ids"].tolist()) == " ".join(sentences)
        assert doc["sentence_lengths"].tolist() == [len(tok.encode(s)) for s in sentences[:1]] + [
            len(tok.encode(" " + s)) for s in sentences[1:]
        ]


@pytest.mark.parametrize(
    "flag", ["--num_shards=0", "--num_shards=-3", "--num_eval_shards=0", "--num_workers=0"]
)
def test_cli_counts_below_one_are_a_usage_error_before_anything_is_written(tmp_path, _cli, flag):
    _write_corpus(tmp_path / "c.txt")
    result = _cli(f"--corpus={tmp_path / 'c.txt'}", "--tokenizer=nowhere", f"--output={tmp_path / 'o'}", flag)
    name, value = flag.split("=")
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith(f"error: argument {name}: must be at least 1, got {value}")
    )
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(num_shards=0), "--num_shards=0: write at least 1"),
        (dict(num_eval_shards=-3), "--num_eval_shards=-3: write at least 1"),
        (dict(eval_fraction=1.0), "--eval_fraction=1.0: write a fraction in [0, 1)"),
    ],
)
def test_preprocess_refuses_impossible_counts_before_reading(tmp_path, options, message):
    with pytest.raises(preprocess.PreprocessError, match=re.escape(message)):
        preprocess.preprocess("demo", "nowhere", str(tmp_path / "o"), **options)
    assert not (tmp_path / "o").exists()


def _interrupted(args: list[str], when) -> subprocess.CompletedProcess:
    """`python -m data.preprocess ARGS` in a session of its own (as a terminal's foreground
    job, SIGINT not ignored), Ctrl-C sent to its whole process group (the workers too) once
    `when()` is true."""
    process = subprocess.Popen(
        [sys.executable, "-m", "data.preprocess", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while not when() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@pytest.mark.slow(30)
@pytest.mark.extended
def test_ctrl_c_in_preprocessing_is_one_line_and_keeps_nothing(tmp_path, tokenizer_dir):
    """Ctrl-C reaches the tool and its workers: one line that says what was kept, status 130,
    whether it comes while the tool imports or while the workers tokenize."""
    _write_corpus(tmp_path / "c.txt", num_docs=20000)
    out = tmp_path / "out"
    args = ["--corpus", str(tmp_path / "c.txt"), "--tokenizer", tokenizer_dir, "--output", str(out)]
    launched = time.monotonic()  # a second in, it is importing TensorFlow (3 s or more)
    starting = _interrupted([*args, "--num_workers=2"], when=lambda: time.monotonic() > launched + 1)
    assert (starting.returncode, starting.stderr) == (
        130,
        "error: interrupted (Ctrl-C) while starting; nothing was done\n",
    )
    working = _interrupted([*args, "--num_workers=2"], when=lambda: any(out.glob("*.unsorted")))
    assert working.returncode == 130, working.stderr[-3000:]
    assert working.stderr == (
        f"error: interrupted (Ctrl-C): nothing was kept in {out} (no shards, no manifest); run the same "
        "command to start again\n"
    )
    assert os.listdir(out) == []


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [1, 2])
@pytest.mark.extended(keep=["1"])
def test_exact_duplicate_documents_are_dropped_and_counted_unless_kept(tmp_path, tokenizer_dir, num_workers):
    """Copies of a document anywhere in the corpus: the first is kept, the others dropped,
    and every count of the manifest (documents, sentences, tokens, per-shard, unigrams) is
    that of the corpus without them; --keep_duplicates keeps them all."""
    texts = _write_corpus(tmp_path / "unique.txt", num_docs=40)
    with_copies = texts[:10] + [texts[3], texts[7]] + texts[10:] + [texts[3], texts[25]]
    (tmp_path / "copies.txt").write_text("\n\n".join(with_copies) + "\n")
    run = functools.partial(
        preprocess.preprocess,
        tokenizer_path=tokenizer_dir,
        num_shards=3,
        eval_fraction=0.2,
        log=lambda *_: None,
    )
    unique = run(str(tmp_path / "unique.txt"), output=str(tmp_path / "u"), num_workers=1)
    deduped = run(str(tmp_path / "copies.txt"), output=str(tmp_path / "d"), num_workers=num_workers)
    kept = run(str(tmp_path / "copies.txt"), output=str(tmp_path / "k"), num_workers=1, keep_duplicates=True)
    assert (
        deduped.fields["dropped_duplicate_documents"] == 4 and kept.fields["dropped_duplicate_documents"] == 0
    )
    for key in ("splits", shards.UNIGRAM_COUNTS):
        assert deduped.fields[key] == unique.fields[key], key

    def documents(manifest):
        return sorted(
            tuple(doc["token_ids"].tolist())
            for split in ("train", "eval")
            for doc in _read(manifest.directory, split)
        )

    assert documents(deduped) == documents(unique)
    assert len(documents(kept)) == len(with_copies)


@pytest.mark.slow(20)
@pytest.mark.extended
def test_the_throughput_benchmark_measures_what_it_reports(tmp_path):
    """bench.preprocess on a small corpus: its tokens are the shards' (the 4x run four times
    the 1x's), and each rate is tokens over the seconds it reports."""
    corpus = tmp_path / "corpus.txt"
    docs = [d.sentences for d in corpora.demo_documents()[:100]]
    corpus.write_text("\n\n".join("\n".join(d) for d in docs) + "\n")
    out = tmp_path / "rows.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "bench.preprocess", f"--corpus={corpus}", "--copies=1", "--kinds=wordpiece"]
        + ["--num_workers=1", f"--out={out}"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    # One worker tokenizes in the reading process, its libraries on every core's thread.
    assert row["kind"] == "wordpiece" and row["workers"] == 1 and row["cores"] == (os.cpu_count() or 1)
    # Each copy's documents start with a sentence of their own ("Copy 0, document 3."): the
    # 4x has about four times the tokens. The rate is tokens over the seconds reported.
    assert 3.9 < row["tokens"]["4x"] / row["tokens"]["1x"] < 4.1
    assert row["tokens"]["1x"] / row["shard_seconds"]["1x"] / row["cores"] == pytest.approx(
        row["preprocess_tokens_per_s_core"]
    )
    assert row["peak_mib"]["1x"] > 50 and row["peak_mib"]["4x"] > 50
    assert row["tokens_per_word"] > 1 and row["projected_hours_wiki_books_96_cores"] > 0
    assert "| wordpiece |" in done.stdout
