"""JSONL (plain, gz, zst) and Parquet corpora (data/record_corpora.py): the same documents
give the same shards as BERT-format text files, and bad input is one line naming the file
and the record, with no manifest written."""

from __future__ import annotations

import gzip
import hashlib
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from data import corpora, preprocess, shards, tokenizers

WORDS = "the cat sat on a mat while dogs ran far away from big red barns and small green houses".split()


def _documents(num_docs=40, seed=0) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    return [
        [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 10)))).capitalize() + "." for _ in range(3)]
        for _ in range(num_docs)
    ]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tok")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *sorted(set(WORDS))]
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizers.load_tokenizer(str(directory / "vocab.txt")).save(str(directory / "saved"))
    return str(directory / "saved")


def _records(documents) -> list[dict]:
    return [{"id": f"doc-{i}", "text": "\n".join(d), "url": "x"} for i, d in enumerate(documents)]


def _write_jsonl(path, records) -> str:
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    if path.endswith(".gz"):
        data = gzip.compress(data)
    if path.endswith(".zst"):
        with pa.CompressedOutputStream(path, "zstd") as out:
            out.write(data)
        return path
    with open(path, "wb") as f:
        f.write(data)
    return path


def _shard_hash(output: str) -> str:
    """sha256 of every record of every shard, in manifest order."""
    digest = hashlib.sha256()
    manifest = shards.load_manifest(output)
    for split in ("train", "eval"):
        for record in tf.data.TFRecordDataset(manifest.files(split)).as_numpy_iterator():
            digest.update(record)
    return digest.hexdigest()


def _preprocess(corpus, tokenizer_dir, output, **corpus_kwargs):
    return preprocess.preprocess(
        corpus,
        tokenizer_dir,
        output,
        num_shards=2,
        eval_fraction=0.1,
        num_workers=1,
        corpus_kwargs=corpus_kwargs,
        log=lambda *_: None,
    )


def test_text_jsonl_and_parquet_give_the_same_shards(tmp_path, tokenizer_dir):
    documents = _documents()
    (tmp_path / "c.txt").write_text("\n\n".join("\n".join(d) for d in documents) + "\n")
    records = _records(documents)
    for name in ("c.jsonl", "c.jsonl.gz", "c.jsonl.zst"):
        _write_jsonl(str(tmp_path / name), records)
    (tmp_path / "parts").mkdir()
    table = pa.Table.from_pylist(records)
    pq.write_table(table.slice(0, 15), tmp_path / "parts" / "a.parquet")
    pq.write_table(table.slice(15), tmp_path / "parts" / "b.parquet", compression="zstd")
    expected = _shard_hash(
        _preprocess(str(tmp_path / "c.txt"), tokenizer_dir, str(tmp_path / "txt")).directory
    )
    for corpus in ("c.jsonl", "c.jsonl.gz", "c.jsonl.zst", "parts", "parts/*.parquet"):
        out = str(tmp_path / "out" / corpus.replace("/", "_").replace("*", "all"))
        manifest = _preprocess(str(tmp_path / corpus), tokenizer_dir, out, sentences="lines")
        assert _shard_hash(manifest.directory) == expected, corpus


def test_raw_text_records_are_split_into_sentences_and_named_by_their_id(tmp_path):
    path = _write_jsonl(
        str(tmp_path / "raw.jsonl.zst"),
        [
            {"id": "a", "text": "She wrote it in 1990. It sold.\n\nA second paragraph here."},
            {"id": "b", "text": "   "},  # no sentence: skipped
            {"id": "c", "text": "One more document."},
        ],
    )
    documents = list(corpora.iter_documents(path, id_field="id"))
    assert [d.sentences for d in documents] == [
        ("She wrote it in 1990.", "It sold.", "A second paragraph here."),
        ("One more document.",),
    ]
    assert [d.source for d in documents] == [f"{path}:1 (id a)", f"{path}:3 (id c)"]


def _corrupt_zstd(path) -> str:
    _write_jsonl(path, _records(_documents(200)))
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2 : len(data) // 2 + 16] = b"\xff" * 16
    open(path, "wb").write(bytes(data))
    return path


@pytest.mark.parametrize(
    "case, message",
    [
        ("not_json", r"^{f}:2: not a JSON object \(.*\): JSONL holds one JSON object per line$"),
        ("no_field", r"^{f}:1 \(id doc-0\): no field 'body' \(fields: id, text, url\): pass --text_field="),
        ("parquet_column", r"^{f}: no column 'body' \(columns: id, text, url\): pass --text_field="),
        ("zstd", r"^{f}: not a valid zstd file \(.*\): check it with `zstd -t`$"),
        ("empty", r"^corpus '{f}' contains no documents"),
    ],
)
def test_bad_records_are_one_line_naming_file_and_record_and_write_no_manifest(
    tmp_path, tokenizer_dir, case, message
):
    records = _records(_documents(5))
    kwargs = {"id_field": "id"}
    if case == "not_json":
        path = str(tmp_path / "c.jsonl")
        _write_jsonl(path, records[:1])
        with open(path, "a") as f:
            f.write('{"text": "unterminated\n')
    elif case == "no_field":
        path = _write_jsonl(str(tmp_path / "c.jsonl.gz"), records)
        kwargs["text_field"] = "body"
    elif case == "parquet_column":
        path = str(tmp_path / "c.parquet")
        pq.write_table(pa.Table.from_pylist(records), path)
        kwargs["text_field"] = "body"
    elif case == "zstd":
        path = _corrupt_zstd(str(tmp_path / "c.jsonl.zst"))
    else:
        path = _write_jsonl(str(tmp_path / "c.jsonl"), [{"text": " "}, {"text": ""}])
    out = tmp_path / "out"
    with pytest.raises(corpora.CorpusError, match=message.format(f=path.replace(".", r"\."))):
        _preprocess(path, tokenizer_dir, str(out), **kwargs)
    assert not (out / shards.MANIFEST).exists() and not list(out.glob("*.tfrecord"))
    assert not os.path.exists(out / "tokenizer")
