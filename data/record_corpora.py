"""Corpora of one document per record: JSONL (plain, `.gz`, `.zst`) and Parquet.

How today's corpora are published (Wikipedia on model hubs, C4, FineWeb, Dolma, RedPajama):
each record holds a document's text in a field (`text` unless `RecordFields.text` says
otherwise), and maybe an id that names it in messages (`RecordFields.id`). The text becomes
the document's sentences (`RecordFields.sentences`): "split" (the default) cuts each of
its lines into sentences with data/corpora.py's splitter, as for TFDS datasets; "lines"
takes each non-empty line as one sentence (a field written one sentence per line, as BERT's
text format has them), so the same documents as text files, JSONL or Parquet give the same
shards.

Libraries: pyarrow (already installed with tensorflow-datasets) reads Parquet, by row
groups, only the columns asked for, and decompresses zstd with the codec it ships, so no
other package is needed; gzip is the standard library's, JSON the standard library's
`json` line by line (a bad line is named by its number). Files are opened through
`tf.io.gfile`, so local paths and gs:// work alike. Memory stays flat: one line, or one
batch of rows, at a time.

Every problem is a `CorpusError` (data/corpora.py, which reads these files through this
module) naming the file and the record: a line that is not a JSON
object, a record without the text field, a Parquet file without the column, a zstd or gzip
stream that does not decompress.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import zlib
from collections.abc import Iterator

import tensorflow as tf

from data.corpora import CorpusError, Document, GFileReader, split_sentences

SENTENCE_MODES = ("split", "lines")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
PARQUET_SUFFIX = ".parquet"
_ROWS_PER_BATCH = 1024


@dataclasses.dataclass(frozen=True)
class RecordFields:
    """Which fields of a record make the document (see the module docstring)."""

    text: str = "text"
    id: str | None = None
    sentences: str = "split"
    language: str = "en"  # of the text that is split into sentences


def is_record_file(path: str) -> bool:
    return path.endswith(JSONL_SUFFIXES) or path.endswith(PARQUET_SUFFIX)


def documents(path: str, fields: RecordFields) -> Iterator[Document]:
    """The documents of one file's records, in order (a record whose text has no sentence
    is skipped)."""
    records = (
        _parquet_records(path, fields) if path.endswith(PARQUET_SUFFIX) else _jsonl_records(path, fields)
    )
    for where, text in records:
        if not isinstance(text, str):
            raise CorpusError(f"{where}: field '{fields.text}' is {type(text).__name__}, not text")
        lines = (line.strip() for line in text.split("\n"))
        if fields.sentences == "lines":
            sentences = tuple(line for line in lines if line)
        else:
            sentences = tuple(s for line in lines if line for s in split_sentences(line, fields.language))
        if sentences:
            yield Document(sentences, where)


def _named(where: str, record: dict, fields: RecordFields) -> str:
    """`where`, with the record's id when the fields name one and it has it."""
    if fields.id is not None and record.get(fields.id) is not None:
        return f"{where} (id {record[fields.id]})"
    return where


def _jsonl_records(path: str, fields: RecordFields) -> Iterator[tuple[str, object]]:
    """(where, text) of each line of a JSONL file; blank lines are skipped."""
    for number, raw in enumerate(_lines(path), 1):
        if not raw.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise CorpusError(
                f"{where}: not a JSON object ({e}): JSONL holds one JSON object per line"
            ) from None
        if not isinstance(record, dict):
            raise CorpusError(
                f"{where}: a JSON {type(record).__name__}, not an object: JSONL holds one object per line"
            )
        if fields.text not in record:
            raise CorpusError(
                f"{_named(where, record, fields)}: no field '{fields.text}' (fields: "
                f"{', '.join(sorted(record)) or 'none'}): pass --text_field=<the one with the text>"
            )
        yield _named(where, record, fields), record[fields.text]


def _lines(path: str) -> Iterator[bytes]:
    """A JSONL file's lines as bytes, decompressed on the fly (.gz, .zst)."""
    try:
        with tf.io.gfile.GFile(path, "rb") as gfile:
            stream = io.BufferedReader(GFileReader(gfile), buffer_size=1 << 20)
            if path.endswith(".zst"):
                import pyarrow as pa

                stream = io.BufferedReader(pa.CompressedInputStream(pa.PythonFile(stream, mode="r"), "zstd"))
            elif path.endswith(".gz"):
                stream = gzip.GzipFile(fileobj=stream, mode="rb")
            yield from stream
    except tf.errors.OpError as e:
        raise CorpusError(
            f"{path}: cannot read the file ({e.message}): check the path and its permissions"
        ) from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise CorpusError(
            f"{path}: not a valid gzip file ({e}): decompress it with gunzip to find the problem"
        ) from None
    except OSError as e:  # pyarrow's zstd codec: a corrupt or truncated frame
        raise CorpusError(f"{path}: not a valid zstd file ({e}): check it with `zstd -t`") from None


def _parquet_records(path: str, fields: RecordFields) -> Iterator[tuple[str, object]]:
    """(where, text) of each row of a Parquet file, read by batches of rows, two columns at most."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with tf.io.gfile.GFile(path, "rb") as gfile:
            parquet = pq.ParquetFile(pa.PythonFile(io.BufferedReader(GFileReader(gfile)), mode="r"))
            columns = parquet.schema_arrow.names
            if fields.text not in columns:
                raise CorpusError(
                    f"{path}: no column '{fields.text}' (columns: {', '.join(columns)}): pass "
                    "--text_field=<the one with the text>"
                )
            wanted = [fields.text] + ([fields.id] if fields.id in columns else [])
            row = 0
            for batch in parquet.iter_batches(batch_size=_ROWS_PER_BATCH, columns=wanted):
                for record in batch.to_pylist():
                    yield _named(f"{path}:row {row}", record, fields), record[fields.text]
                    row += 1
    except tf.errors.OpError as e:
        raise CorpusError(
            f"{path}: cannot read the file ({e.message}): check the path and its permissions"
        ) from None
    except (pa.ArrowInvalid, OSError) as e:
        raise CorpusError(f"{path}: not a readable Parquet file ({e})") from None


def add_flags(parser) -> None:
    """--text_field, --id_field, --sentences and --language, for the tools that read a corpus."""
    parser.add_argument(
        "--text_field", default="text", help="JSONL / Parquet corpora: the field or column with the text"
    )
    parser.add_argument(
        "--id_field", default=None, help="JSONL / Parquet corpora: a field that names a record in messages"
    )
    parser.add_argument(
        "--sentences",
        choices=SENTENCE_MODES,
        default="split",
        help="JSONL / Parquet corpora: 'split' the text into sentences, or take each of its 'lines' as one",
    )
    parser.add_argument(
        "--language",
        default="en",
        help="language of raw documents split into sentences (TFDS, JSONL, Parquet): an ISO 639 code such "
        "as en, zh, ja, de (sentencex's rules)",
    )


def corpus_kwargs(args) -> dict:
    """`iter_documents` keywords of the flags `add_flags` added, those not at their defaults
    only (so that the fingerprint of shards of text files stays what it was)."""
    given = {
        "text_field": args.text_field,
        "id_field": args.id_field,
        "sentences": args.sentences,
        "language": args.language,
    }
    defaults = {"text_field": "text", "id_field": None, "sentences": "split", "language": "en"}
    return {k: v for k, v in given.items() if v != defaults[k]}
