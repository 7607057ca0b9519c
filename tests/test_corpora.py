"""Tests of data.corpora: sentence splitting, BERT-format files, TFDS, the demo corpus."""

import gzip
import hashlib

import pytest
import tensorflow_datasets as tfds

from bench.sentence_splitters import CASES
from data import corpora
from data.corpora import CorpusError, Document

# What the chosen splitter (sentencex) gets wrong on bench/sentence_splitters.py's case set,
# case number: its sentences. Every other case it splits right.
KNOWN_WRONG = {
    11: ("Apples, pears, etc. are fruit.", "Dr.", "No met Mrs. Peel."),
    14: ("(It was late.) He went home.",),
    16: ("a lowercase start.", "does not split here."),
}


@pytest.mark.parametrize("number", range(1, len(CASES) + 1))
def test_the_splitter_on_the_case_set(number):
    text, right = CASES[number - 1]
    assert tuple(corpora.split_sentences(text)) == KNOWN_WRONG.get(number, right)


def test_split_sentences_normalises_whitespace():
    assert corpora.split_sentences("He left.  Done\n  now.") == ["He left.", "Done now."]
    assert corpora.split_sentences("  \n ") == []


def _write(path, text, *, compress=False):
    data = text.encode("utf-8") if isinstance(text, str) else text
    path.write_bytes(gzip.compress(data) if compress else data)
    return str(path)


def test_bert_format_documents_and_sources(tmp_path):
    path = _write(tmp_path / "a.txt", "\ufeffA one.\n  A two.  \n\n\n \nB one.\n\t\nC one.\r\nC two.\n\n")
    docs = list(corpora.iter_documents(path))
    assert docs == [
        Document(("A one.", "A two."), f"{path}:1"),
        Document(("B one.",), f"{path}:6"),
        Document(("C one.", "C two."), f"{path}:8"),
    ]


def test_gzip_globs_and_comma_separated_specs(tmp_path):
    (tmp_path / "sub").mkdir()
    a = _write(tmp_path / "sub" / "b.txt", "B1.\nB2.\n\nB3.")
    b = _write(tmp_path / "sub" / "a.txt.gz", "A1.\n\nA2.\n", compress=True)
    c = _write(tmp_path / "c.txt", "C1.\n")
    docs = list(corpora.iter_documents(f"{tmp_path}/sub/*, {c}"))
    # Each glob's matches are read in sorted order; documents never span files.
    assert [d.sentences for d in docs] == [("A1.",), ("A2.",), ("B1.", "B2."), ("B3.",), ("C1.",)]
    assert [d.source for d in docs] == [f"{b}:1", f"{b}:3", f"{a}:1", f"{a}:4", f"{c}:1"]


def test_missing_glob(tmp_path):
    good = _write(tmp_path / "a.txt", "A.\n")
    with pytest.raises(CorpusError, match=r"^no files match '.*nope\*\.txt': check the path or glob$"):
        list(corpora.iter_documents(f"{good},{tmp_path}/nope*.txt"))


def test_a_folder_as_corpus_points_to_a_glob(tmp_path):
    _write(tmp_path / "a.txt", "A.\n")
    with pytest.raises(CorpusError) as e:
        list(corpora.iter_documents(str(tmp_path)))
    assert str(e.value) == (
        f"'{tmp_path}' is a folder: pass a glob of its files, e.g. --corpus='{tmp_path}/*.txt' "
        f"(or '{tmp_path}/*.txt.gz')"
    )


def test_bad_utf8_names_file_and_line(tmp_path):
    path = _write(tmp_path / "latin1.txt", "Fine.\n\n".encode() + "Caf\u00e9.\n".encode("latin-1"))
    with pytest.raises(CorpusError) as e:
        list(corpora.iter_documents(path))
    assert str(e.value) == (
        f"{path}:3: not valid UTF-8 (byte offset 3 in the line): re-encode the file as UTF-8, e.g. with iconv"
    )


@pytest.mark.parametrize("max_line_chars", [100, 10])  # both the whole-line and chunked paths
def test_long_line(tmp_path, max_line_chars):
    path = _write(tmp_path / "a.txt", "Short.\n" + "w" * 500 + "\n")
    with pytest.raises(CorpusError) as e:
        list(corpora.iter_documents(path, max_line_chars=max_line_chars))
    message = str(e.value)
    assert message.startswith(
        f"{path}:2: line is 500 characters long (limit {max_line_chars}): "
        "BERT format is one sentence per line"
    )
    assert "\n" not in message and "--max_line_chars" in message
    assert len(list(corpora.iter_documents(path, max_line_chars=500))[0].sentences) == 2


def test_bad_gzip(tmp_path):
    path = _write(tmp_path / "a.txt.gz", "not compressed\n")
    with pytest.raises(CorpusError, match=r"a\.txt\.gz: not a valid gzip file"):
        list(corpora.iter_documents(path))


def test_empty_file_has_no_documents(tmp_path):
    path = _write(tmp_path / "empty.txt", "\n  \n\n")
    with pytest.raises(CorpusError, match=r"^corpus '.*empty\.txt' contains no documents"):
        list(corpora.iter_documents(path))


@pytest.mark.slow
def test_demo_corpus():
    docs = corpora.demo_documents()
    assert docs == corpora.demo_documents()
    digest = hashlib.sha256(repr(docs).encode()).hexdigest()
    corpora._demo_corpus.cache_clear()
    assert hashlib.sha256(repr(corpora.demo_documents()).encode()).hexdigest() == digest
    assert list(corpora.iter_documents("demo")) == docs

    sentences = [s for d in docs for s in d.sentences]
    text_bytes = sum(len(s.encode()) + 1 for s in sentences)
    assert len(docs) >= 300 and len(sentences) >= 10_000 and text_bytes >= 1_000_000
    assert all(len(d.sentences) >= 2 for d in docs)
    assert all(len(s.split()) >= 3 for s in sentences)
    assert len({d.source for d in docs}) == len(docs)
    assert docs[0].source.startswith("demo:topics/")
    assert any(d.source == "demo:modules/json" for d in docs)
    # Code, doctests and reST markup are cleaned away.
    assert not any(s.startswith((">>>", "def ", "import ")) or "``" in s or "::" in s for s in sentences)


@pytest.mark.slow
def test_is_heldout_rate_and_stability():
    docs = corpora.demo_documents()
    heldout = [corpora.is_heldout(d, 0.1) for d in docs]
    assert abs(sum(heldout) / len(docs) - 0.1) < 0.05
    # A pure function of the text: same answer for a copy, in any order, with another source.
    assert [corpora.is_heldout(Document(d.sentences, "elsewhere"), 0.1) for d in reversed(docs)] == heldout[
        ::-1
    ]
    assert not any(corpora.is_heldout(d, 0.0) for d in docs)
    assert all(corpora.is_heldout(d, 1.0) for d in docs)
    # Nested: a document held out at 2% is held out at 10%.
    assert all(h for d, h in zip(docs, heldout) if corpora.is_heldout(d, 0.02))


class TinyText(tfds.core.GeneratorBasedBuilder):
    """A two-split text dataset, prepared into a temporary data_dir."""

    VERSION = tfds.core.Version("1.0.0")
    # tfds looks for a checksums file beside a builder's code; for a class inside a package
    # that lookup imports `importlib_resources`, which tfds only installs on Python < 3.9.
    # This builder downloads nothing, so it has no checksums to find.
    code_path = None

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict(
                {"text": tfds.features.Text(), "title": tfds.features.Text()}
            ),
        )

    def _split_generators(self, dl_manager):
        return {
            "train": self._generate_examples(
                ["First one. Second one.\n\nNew paragraph here.", "", "Lonely line"]
            ),
            "validation": self._generate_examples(["Held out. Two."]),
        }

    def _generate_examples(self, texts):
        for i, text in enumerate(texts):
            yield i, {"text": text, "title": f"doc {i}"}


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("tfds")
    TinyText(data_dir=str(data_dir)).download_and_prepare()
    return str(data_dir)


def test_tfds_documents(tfds_dir):
    docs = list(corpora.iter_documents("tfds:tiny_text", tfds_data_dir=tfds_dir))
    # Paragraphs -> sentences, concatenated; the empty example yields no document.
    assert docs == [
        Document(("First one.", "Second one.", "New paragraph here."), "tfds:tiny_text[train]#0"),
        Document(("Lonely line",), "tfds:tiny_text[train]#2"),
    ]
    docs = list(corpora.iter_documents("tfds:tiny_text:validation", tfds_data_dir=tfds_dir))
    assert docs == [Document(("Held out.", "Two."), "tfds:tiny_text[validation]#0")]
    docs = list(corpora.iter_documents("tfds:tiny_text", tfds_data_dir=tfds_dir, tfds_text_key="title"))
    assert [d.sentences for d in docs] == [("doc 0",), ("doc 1",), ("doc 2",)]


@pytest.mark.parametrize(
    "spec, kwargs, message",
    [
        ("tfds:no_such_dataset_xyz", {}, r"^TFDS has no dataset named 'no_such_dataset_xyz': check the name"),
        ("tfds:mnist", {}, r"^TFDS dataset 'mnist' is not prepared in .*: run `tfds build mnist`"),
        ("tfds:tiny_text:test", {}, r"^TFDS dataset 'tiny_text' cannot load split 'test' in .*Unknown split"),
        (
            "tfds:tiny_text",
            {"tfds_text_key": "body"},
            r"^TFDS dataset 'tiny_text' has no feature 'body' \(features: text, title\)",
        ),
    ],
)
def test_tfds_errors(tfds_dir, spec, kwargs, message):
    with pytest.raises(CorpusError, match=message) as e:
        list(corpora.iter_documents(spec, tfds_data_dir=tfds_dir, **kwargs))
    assert "\n" not in str(e.value)
