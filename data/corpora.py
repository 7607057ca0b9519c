"""Document sources: BERT-format text files, TFDS datasets, and the embedded demo corpus.

A document is a sequence of sentences (str), the unit `create_pretraining_data.py` works
on: NSP/SOP pairs are drawn inside one document, random "B" segments from another.

    iter_documents("demo")                                   the embedded English corpus
    iter_documents("tfds:wikipedia/20230601.en")             a prepared TFDS dataset (split "train")
    iter_documents("tfds:wikipedia/20230601.en:train[:1%]")  ... any TFDS split expression
    iter_documents("corpus/*.txt,extra/books.txt.gz")        BERT-format text files (local or gs://)
    iter_documents("c4/*.jsonl.zst"), ("wiki/" or "wiki/*.parquet")  one document per record

BERT text format (google-research/bert `sample_text.txt`): one sentence per line, a
blank line between documents, UTF-8; `.gz` files are decompressed on the fly.

Every user-facing problem is a `CorpusError` with a one-line message saying what is
wrong, where, and what to do.
"""

from __future__ import annotations

import ast
import codecs
import dataclasses
import functools
import gzip
import hashlib
import importlib.metadata
import inspect
import io
import os
import re
import sys
import warnings
import zlib
from typing import Iterator

import tensorflow as tf

from core.errors import UserError


@dataclasses.dataclass(frozen=True)
class Document:
    """One document.

    Attributes:
      sentences: the sentences, in order; each stripped and non-empty.
      source: where it came from, for messages: "corpus/wiki.txt:120" (file and line of the
        first sentence), "tfds:wikipedia/20230601.en[train]#17" (example index), or
        "demo:topics/assert".
    """

    sentences: tuple[str, ...]
    source: str


class CorpusError(UserError):
    """A user-facing problem with a corpus (one line: what is wrong, where, what to do)."""


# ----------------------------------------------------------------------------- sentences

# The sentence splitter of raw documents (TFDS datasets, JSONL and Parquet records, the demo
# corpus), as preprocessing's fingerprint records it: shards split by another never mix.
# sentencex (Wikimedia) won the comparison in docs/pretraining.md ("Sentence boundaries",
# `python -m bench.sentence_splitters`): most cases right and the fastest.
SPLITTER = f"sentencex {importlib.metadata.version('sentencex')}"
_WHITESPACE = re.compile(r"\s+")


def split_sentences(text: str, language: str = "en") -> list[str]:
    """Splits prose into sentences with sentencex (no model, no download): rules and
    abbreviation lists per language (`language`: an ISO 639 code, "en", "zh", "ja", "de",
    ...; an unknown one falls back to its generic rules, which know the CJK sentence ends
    "。！？").

    Args:
      text: a paragraph (internal newlines are treated as spaces).

    Returns:
      The sentences, stripped, whitespace runs collapsed to one space, empty ones dropped.
    """
    import sentencex  # imported on first use: the tools that read no raw text never need it

    text = _WHITESPACE.sub(" ", text).strip()
    return [s.strip() for s in sentencex.segment(language, text) if s.strip()]


def splitter_of(spec: str, sentences: str = "split", language: str = "en") -> str | None:
    """The splitter (and language) that cuts a corpus's documents into sentences, for
    preprocessing's fingerprint; None when its files already hold one sentence per line
    (BERT-format text, or records read with sentences="lines")."""
    from data import record_corpora

    if spec == "demo":
        return f"{SPLITTER} en"
    if spec.startswith("tfds:"):
        return f"{SPLITTER} {language}"
    if sentences != "split":
        return None
    for pattern in (p.strip() for p in spec.split(",") if p.strip()):
        for path in tf.io.gfile.glob(pattern):
            if record_corpora.is_record_file(path) or tf.io.gfile.isdir(path):
                return f"{SPLITTER} {language}"
    return None


# ----------------------------------------------------------------------------- held-out split


def is_heldout(doc: Document, eval_fraction: float) -> bool:
    r"""Whether `doc` belongs to the held-out (eval) split.

    A pure function of the document's text (sha256 of its sentences joined by "\n",
    read as a number in [0, 1)), so the split is the same in any order, in a stream, and
    across runs; about `eval_fraction` of distinct documents are held out.
    """
    digest = hashlib.sha256("\n".join(doc.sentences).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < eval_fraction


# ----------------------------------------------------------------------------- sources


def iter_documents(
    spec: str,
    *,
    max_line_chars: int = 100_000,
    tfds_data_dir: str | None = None,
    tfds_text_key: str = "text",
    text_field: str = "text",
    id_field: str | None = None,
    sentences: str = "split",
    language: str = "en",
) -> Iterator[Document]:
    """Yields the documents of a corpus, streaming (memory does not grow with its size).

    Args:
      spec: "demo"; "tfds:NAME" or "tfds:NAME:SPLIT" (SPLIT defaults to "train" and may be any
        TFDS split expression, e.g. "train[:1%]"); or a comma-separated list of file paths or
        globs (local or any `tf.io.gfile` filesystem, e.g. gs://): BERT-format text (`.txt`,
        `.gz`, anything else), JSONL (`.jsonl`, `.jsonl.gz`, `.jsonl.zst`) and Parquet
        (`.parquet`, or a folder of them), one document per record
        (data/record_corpora.py).
      max_line_chars: text files only: the longest line accepted. A longer line almost always
        means the file is not one sentence per line.
      tfds_data_dir: TFDS only: where the prepared dataset lives (TFDS's default if None).
      tfds_text_key: TFDS only: the feature holding each example's text.
      text_field, id_field, sentences: JSONL and Parquet only: the field with the text, the
        one that names a record in messages, and "split" (into sentences) or "lines" (one
        sentence per line of the text).
      language: the language of the raw documents that are split into sentences (TFDS,
        JSONL and Parquet with sentences="split"; `split_sentences`).

    Raises:
      CorpusError: the corpus is missing, malformed, or has no documents.
    """
    if sentences not in ("split", "lines"):
        raise CorpusError(
            f"sentences={sentences!r}: write 'split' (raw text) or 'lines' (one sentence per line)"
        )
    if spec == "demo":
        documents = iter(demo_documents())
    elif spec.startswith("tfds:"):
        documents = _tfds_documents(spec[len("tfds:") :], tfds_data_dir, tfds_text_key, language)
    else:
        from data import record_corpora  # which reads data/corpora.py's splitter and errors

        fields = record_corpora.RecordFields(text_field, id_field, sentences, language)
        documents = _file_documents(spec, max_line_chars, fields)
    count = 0
    for doc in documents:
        count += 1
        yield doc
    if not count:
        raise CorpusError(
            f"corpus '{spec}' contains no documents: text files need one sentence per line and a "
            "blank line between documents"
        )


def _file_documents(spec: str, max_line_chars: int, fields) -> Iterator[Document]:
    """The documents of the files a spec's globs match, in order, each read by its kind."""
    from data import record_corpora

    for pattern in (p.strip() for p in spec.split(",")):
        if not pattern:
            continue
        paths = sorted(tf.io.gfile.glob(pattern))
        if not paths:
            raise CorpusError(f"no files match '{pattern}': check the path or glob")
        for path in paths:
            if tf.io.gfile.isdir(path):  # a Parquet dataset is a folder of files
                folder = path.rstrip("/")
                parts = sorted(tf.io.gfile.glob(f"{folder}/*{record_corpora.PARQUET_SUFFIX}"))
                if not parts:
                    raise CorpusError(
                        f"'{path}' is a folder: pass a glob of its files, e.g. --corpus='{folder}/*.txt' "
                        f"(or '{folder}/*.txt.gz')"
                    )
                for part in parts:
                    yield from record_corpora.documents(part, fields)
            elif record_corpora.is_record_file(path):
                yield from record_corpora.documents(path, fields)
            else:
                yield from _read_text_file(path, max_line_chars)


class GFileReader(io.RawIOBase):
    """A `tf.io.gfile.GFile` opened "rb" as a raw, seekable stream, so that the standard
    library (`io.BufferedReader`, `gzip.GzipFile`: bounded `readline(limit)`, which GFile's
    own readline lacks) and pyarrow (zstd, Parquet) read any file system GFile reads."""

    def __init__(self, gfile):
        self._gfile = gfile

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._gfile.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._gfile.seek(offset, whence)
        return self._gfile.tell()

    def tell(self) -> int:
        return self._gfile.tell()


def _read_text_file(path: str, max_line_chars: int) -> Iterator[Document]:
    """Documents of one BERT-format file, read line by line."""
    # A line of at most max_line_chars characters fits in 4 * max_line_chars bytes of UTF-8
    # (+ "\r\n"), so chunks of that size bound memory without ever splitting a valid line.
    limit = 4 * max_line_chars + 2
    chunks = _line_chunks(path, limit)
    sentences: list[str] = []
    first_line = 0
    for line_number, raw in enumerate(chunks, 1):
        where = f"{path}:{line_number}"
        if len(raw) == limit and not raw.endswith(b"\n"):
            raise CorpusError(_long_line_message(where, _line_length(raw, chunks, where), max_line_chars))
        line = _decode(raw, where)
        if line_number == 1:
            line = line.lstrip("\ufeff")  # a byte-order mark some editors write
        line = line.strip()
        if len(line) > max_line_chars:
            raise CorpusError(_long_line_message(where, len(line), max_line_chars))
        if line:
            if not sentences:
                first_line = line_number
            sentences.append(line)
        elif sentences:
            yield Document(tuple(sentences), f"{path}:{first_line}")
            sentences = []
    if sentences:
        yield Document(tuple(sentences), f"{path}:{first_line}")


def _line_chunks(path: str, limit: int) -> Iterator[bytes]:
    r"""The lines of a file (gzip-decompressed if it ends in .gz), as bytes with their line
    ending; a line longer than `limit` bytes comes as several chunks, only the last ending
    in b"\n"."""
    try:
        with tf.io.gfile.GFile(path, "rb") as gfile:
            stream = io.BufferedReader(GFileReader(gfile), buffer_size=1 << 20)
            if path.endswith(".gz"):
                stream = gzip.GzipFile(fileobj=stream, mode="rb")
            while chunk := stream.readline(limit):
                yield chunk
    except tf.errors.OpError as e:  # unreadable: a directory, no permission, no credentials
        raise CorpusError(
            f"{path}: cannot read the file ({e.message}): check the path and its permissions"
        ) from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise CorpusError(
            f"{path}: not a valid gzip file ({e}): decompress it with gunzip to find "
            "the problem, or drop the .gz suffix if it is plain text"
        ) from None


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorpusError(
            f"{where}: not valid UTF-8 (byte offset {e.start} in the line): "
            "re-encode the file as UTF-8, e.g. with iconv"
        ) from None


def _line_length(head: bytes, rest: Iterator[bytes], where: str) -> int:
    """Characters in an over-long line: `head`, then the chunks of `rest` up to the one that
    ends the line (so a multi-GB single-line file is measured, never loaded)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    length = 0
    chunk = head
    while True:
        try:
            length += len(decoder.decode(chunk.rstrip(b"\r\n")))
        except UnicodeDecodeError:
            raise CorpusError(
                f"{where}: not valid UTF-8 (after character {length} of the line): "
                "re-encode the file as UTF-8, e.g. with iconv"
            ) from None
        if chunk.endswith(b"\n"):
            return length
        chunk = next(rest, b"\n")


def _long_line_message(where: str, length: int, limit: int) -> str:
    return (
        f"{where}: line is {length} characters long (limit {limit}): BERT format is one "
        "sentence per line with a blank line between documents; split the text into sentences "
        "or raise --max_line_chars"
    )


def _tfds_documents(
    name_and_split: str, data_dir: str | None, text_key: str, language: str
) -> Iterator[Document]:
    """Documents of a prepared TFDS dataset: each example's text is one document, split into
    paragraphs on newlines and each paragraph into sentences."""
    # Imported here: tensorflow_datasets is slow to import and only this source needs it.
    import tensorflow_datasets as tfds

    name, _, split = name_and_split.partition(":")
    split = split or "train"
    where = f" in {data_dir}" if data_dir else ""
    try:
        dataset = tfds.load(name, split=split, data_dir=data_dir, shuffle_files=False, download=False)
    except tfds.core.DatasetNotFoundError:
        raise CorpusError(
            f"TFDS has no dataset named '{name}': check the name against the TFDS "
            "catalog (a dataset defined in your own code must be registered)"
        ) from None
    except AssertionError:  # how tfds says "registered, but not prepared in data_dir"
        raise CorpusError(
            f"TFDS dataset '{name}' is not prepared{where}: run `tfds build {name}` "
            "(with --data_dir) or pass the --tfds_data_dir that holds it"
        ) from None
    except ValueError as e:  # e.g. an unknown split
        reason = " ".join(str(e).split()).rstrip(".")
        raise CorpusError(
            f"TFDS dataset '{name}' cannot load split '{split}'{where}: {reason}. "
            f"Name a prepared split, or run `tfds build {name}`"
        ) from None
    if not isinstance(dataset.element_spec, dict) or text_key not in dataset.element_spec:
        keys = sorted(dataset.element_spec) if isinstance(dataset.element_spec, dict) else []
        raise CorpusError(
            f"TFDS dataset '{name}' has no feature '{text_key}' (features: "
            f"{', '.join(keys) or 'none'}): pass tfds_text_key=<one of them>"
        )
    for index, example in enumerate(tfds.as_numpy(dataset)):
        where = f"tfds:{name}[{split}]#{index}"
        value = example[text_key]
        try:
            text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
        except UnicodeDecodeError as e:
            raise CorpusError(
                f"{where}: feature '{text_key}' is not valid UTF-8 (byte offset "
                f"{e.start}): the dataset must hold UTF-8 text"
            ) from None
        sentences = [s for paragraph in text.split("\n") for s in split_sentences(paragraph, language)]
        if sentences:
            yield Document(tuple(sentences), where)


# ----------------------------------------------------------------------------- demo corpus

# Standard-library packages left out of the demo corpus: not prose about the library
# (tests, IDLE/Tk GUIs, demos, installers, jokes) or deprecated.
_DEMO_SKIPPED_MODULES = frozenset(
    {
        "test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "lib2to3",
        "ensurepip",
        "antigravity",
        "this",
    }
)
_UNDERLINE = re.compile(r"[*=\-~^\"#+_]{3,}")
_ROLE = re.compile(r":[\w:+.-]+:`~?([^`<]*?)\s*(?:<[^`>]*>)?`")
# Lines that are Python code even when not indented as a code block: definitions, bare
# imports, comments, assignments, bare calls, and compound-statement headers.
_CODE_LINE = re.compile(
    r"(?:async\s+)?def \w+\(.*|class [\w.]+[(:].*|import [\w.]+(?:, [\w.]+)*|from [\w.]+ import .+"
    r"|#.*|[\w(][\w.\[\]'\",() ]* [-+*/%|&]?= \S.*|[\w.]+\(.*\)"
    r"|(?:if|elif|else|for|while|with|try|except|finally)\b.*:"
)
_ADMONITIONS = frozenset(
    {"note:", "warning:", "see also:", "tip:", "important:", "caution:", "attention:", "hint:"}
)


def _prose_paragraphs(text: str) -> list[str]:
    """The prose paragraphs of reST-ish text (pydoc topics, docstrings), code left out.

    Blocks are runs of non-blank lines. A block is code (dropped) when it starts with ">>>"
    (a doctest with its output); when a line looks like Python (a definition, import,
    comment, assignment, bare call or compound-statement header); when it is indented 4+
    columns deeper than the prose before it; or when it is indented deeper than prose
    ending in ":" ("For example:", "Args:"), except after an admonition label such as
    "Note:". Code continues through blank lines while the indentation stays as deep.
    Section titles (a line over an underline) and lines without letters are dropped;
    reST markup ("*", backticks, roles such as :func:`x`, "::") is removed.
    """
    blocks: list[list[str]] = [[]]
    for line in inspect.cleandoc(text).expandtabs().split("\n"):
        if line.strip():
            blocks[-1].append(line)
        elif blocks[-1]:
            blocks.append([])
    paragraphs = []
    prose_indent, after_colon, code_indent = 0, False, None
    for block in blocks:
        if not block:
            continue
        indent = len(block[0]) - len(block[0].lstrip())
        if code_indent is not None and indent >= code_indent:
            continue
        code_indent = None
        if indent > prose_indent and (after_colon or indent >= prose_indent + 4):
            code_indent = indent
            continue
        first = block[0].strip()
        if first.startswith(">>>") or any(
            _UNDERLINE.fullmatch(line.strip()) or _CODE_LINE.fullmatch(line.strip()) for line in block
        ):
            continue
        lines = [
            line.strip()
            for line in block
            if not line.strip().startswith((">>>", "...")) and any(c.isalpha() for c in line)
        ]
        if not lines:
            continue
        prose_indent = indent
        after_colon = lines[-1].endswith(":") and lines[-1].lower() not in _ADMONITIONS
        paragraph = _ROLE.sub(r"\1", " ".join(lines))
        paragraphs.append(paragraph.replace("::", ":").replace("`", "").replace("*", ""))
    return paragraphs


def _is_prose_sentence(sentence: str) -> bool:
    """At least 3 words, and at least 70% of its non-space characters are letters."""
    compact = sentence.replace(" ", "")
    letters = sum(c.isalpha() for c in compact)
    return len(sentence.split()) >= 3 and letters >= 0.7 * len(compact)


def _demo_document(text: str, source: str) -> Document | None:
    sentences = tuple(
        s
        for paragraph in _prose_paragraphs(text)
        for s in split_sentences(paragraph)
        if _is_prose_sentence(s)
    )
    return Document(sentences, source) if len(sentences) >= 2 else None


def _stdlib_sources() -> list[tuple[str, str]]:
    """(dotted module name, source path) of the public pure-Python standard library, sorted.

    Modules are read, never imported: no side effects, and the result does not depend on
    which optional C extensions (ssl, sqlite3, curses, ...) this Python was built with.
    """
    root = os.path.dirname(os.__file__)
    sources = []
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in _DEMO_SKIPPED_MODULES:
            continue
        if os.path.isfile(os.path.join(root, name + ".py")):
            sources.append((name, os.path.join(root, name + ".py")))
            continue
        for directory, subdirectories, files in os.walk(os.path.join(root, name)):
            subdirectories[:] = sorted(
                d for d in subdirectories if not d.startswith("_") and d not in ("test", "tests")
            )
            package = os.path.relpath(directory, root).replace(os.sep, ".")
            for file in sorted(files):
                if file == "__init__.py":
                    sources.append((package, os.path.join(directory, file)))
                elif file.endswith(".py") and not file.startswith("_"):
                    sources.append((f"{package}.{file[:-3]}", os.path.join(directory, file)))
    return sorted(sources)


def _module_docstrings(path: str) -> str:
    """Module docstring, then those of public top-level classes, functions and public
    methods, in source order, separated by blank lines."""
    with open(path, "rb") as f:  # bytes: ast honours a file's coding cookie
        source = f.read()
    with warnings.catch_warnings():  # e.g. invalid escape sequences in old modules
        warnings.simplefilter("ignore")
        tree = ast.parse(source)
    definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    docstrings = [ast.get_docstring(tree)]
    for node in tree.body:
        if isinstance(node, definitions) and not node.name.startswith("_"):
            docstrings.append(ast.get_docstring(node))
            if isinstance(node, ast.ClassDef):
                docstrings.extend(
                    ast.get_docstring(m)
                    for m in node.body
                    if isinstance(m, definitions) and not m.name.startswith("_")
                )
    return "\n\n".join(d for d in docstrings if d)


@functools.lru_cache(maxsize=1)
def _demo_corpus() -> tuple[Document, ...]:
    # Imported here: only the demo corpus needs this 0.5 MB module.
    from pydoc_data import topics

    documents = [_demo_document(topics.topics[key], f"demo:topics/{key}") for key in sorted(topics.topics)]
    documents += [
        _demo_document(_module_docstrings(path), f"demo:modules/{name}") for name, path in _stdlib_sources()
    ]
    return tuple(doc for doc in documents if doc is not None)


def demo_documents() -> list[Document]:
    """The embedded English demo corpus: Python's own documentation, no download needed.

    Documents: (a) each entry of `pydoc_data.topics` (the language reference sections that
    `help("for")` shows), sorted by key; (b) for each public pure-Python standard-library
    module and submodule (sorted; tests, IDLE, Tk and demos left out), its docstring and
    those of its public classes, functions and methods, read from the source with `ast`.
    Code, doctests, section titles and reST markup are removed, prose is split with
    `split_sentences`, sentences with fewer than 3 words or under 70% letters are dropped,
    and documents with fewer than 2 sentences are dropped.

    On CPython 3.11.7: 418 documents (78 topics, 340 modules), 14,237 sentences, 198,622
    words, 1.24 MB of UTF-8 text; about 2 s to build on one CPU core, cached after the
    first call. The content is a pure function of the CPython version's own files, so it is
    identical across runs and machines (and changes only with the Python version).
    """
    return list(_demo_corpus())
