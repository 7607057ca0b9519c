"""Writes a small GLUE folder in the official layout (download_glue_data.py's files), for tests.

Every file has the real header (or none: CoLA train/dev), column order and label spelling,
and the text has what breaks naive readers: unbalanced quotes, unicode, a UTF-8 BOM
(MRPC), empty fields, and test files without labels. `write_glue_dir` returns what each
file holds, so tests can check that every row is read with the right label.
"""

from __future__ import annotations

import os

import numpy as np

# Text a csv reader with quoting would mangle, and non-ASCII text.
_TRICKY = [
    'He said "hello and left.',
    "It's a \"quoted\" 'phrase' with an unbalanced ' mark",
    "Caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \u00fcber \u2014 dash",
    '"',
    "plain words here",
    "",
]
_NLI = ("contradiction", "entailment", "neutral")
_ENT = ("entailment", "not_entailment")


def _text(rng: np.random.Generator, i: int) -> str:
    return f"{_TRICKY[i % len(_TRICKY)]} row {i} {rng.integers(1000)}".strip()


def write_glue_dir(root: str, rows: int = 7, seed: int = 0) -> dict[tuple[str, str], list[dict]]:
    """Writes every task's files under `root`; returns {(task, file stem): [row dicts]}.

    Row dicts: index, text_a, text_b (None for single-sentence tasks) and label (the label
    *string* as written, None for test rows). Split sizes differ (rows, rows + 1, rows + 2
    for train, dev, test) so a test can tell them apart.
    """
    rng = np.random.default_rng(seed)
    expected: dict[tuple[str, str], list[dict]] = {}

    def write(task, folder, stem, header, make_row, n, pair, labels):
        os.makedirs(os.path.join(root, folder), exist_ok=True)
        records = []
        lines = [header] if header is not None else []
        for i in range(n):
            a, b = _text(rng, i), (_text(rng, i + 3) if pair else None)
            label = None if labels is None else labels[rng.integers(len(labels))]
            index = str(1000 + i)
            lines.append("\t".join(make_row(index, a, b, label)))
            records.append({"index": index, "text_a": a, "text_b": b, "label": label})
        with open(os.path.join(root, folder, f"{stem}.tsv"), "w", encoding="utf-8", newline="") as f:
            f.write("".join(line + "\n" for line in lines))
        expected[(task, stem)] = records

    sizes = {"train": rows, "dev": rows + 1, "test": rows + 2}
    binary = ("0", "1")

    # CoLA: train/dev without header (source, label, original label, sentence).
    for stem in ("train", "dev"):
        write(
            "cola", "CoLA", stem, None,
            lambda i, a, b, l: ["gj04", l, "" if l == "1" else "*", a],
            sizes[stem], False, binary,
        )  # fmt: skip
    write("cola", "CoLA", "test", "index\tsentence", lambda i, a, b, l: [i, a], sizes["test"], False, None)

    for stem in ("train", "dev"):
        write("sst2", "SST-2", stem, "sentence\tlabel", lambda i, a, b, l: [a, l], sizes[stem], False, binary)
    write("sst2", "SST-2", "test", "index\tsentence", lambda i, a, b, l: [i, a], sizes["test"], False, None)

    # MRPC's files start with a UTF-8 byte-order mark.
    mrpc = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"
    for stem in ("train", "dev"):
        write("mrpc", "MRPC", stem, mrpc, lambda i, a, b, l: [l, "11", "22", a, b], sizes[stem], True, binary)
    write(
        "mrpc", "MRPC", "test", "index\t#1 ID\t#2 ID\t#1 String\t#2 String",
        lambda i, a, b, l: [i, "11", "22", a, b], sizes["test"], True, None,
    )  # fmt: skip

    sts = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
    scores = tuple(f"{x:.3f}" for x in np.linspace(0, 5, 11))
    for stem in ("train", "dev"):
        write(
            "stsb", "STS-B", stem, sts + "\tscore",
            lambda i, a, b, l: [i, "main-news", "f", "2012", "7", "none", "none", a, b, l],
            sizes[stem], True, scores,
        )  # fmt: skip
    write(
        "stsb", "STS-B", "test", sts,
        lambda i, a, b, l: [i, "main-news", "f", "2012", "7", "none", "none", a, b],
        sizes["test"], True, None,
    )  # fmt: skip

    for stem in ("train", "dev"):
        write(
            "qqp", "QQP", stem, "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
            lambda i, a, b, l: [i, "1", "2", a, b, l], sizes[stem], True, binary,
        )  # fmt: skip
    write(
        "qqp",
        "QQP",
        "test",
        "id\tquestion1\tquestion2",
        lambda i, a, b, l: [i, a, b],
        sizes["test"],
        True,
        None,
    )

    parses = "sentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse"
    mnli = f"index\tpromptID\tpairID\tgenre\t{parses}\tsentence1\tsentence2"
    write(
        "mnli", "MNLI", "train", mnli + "\tlabel1\tgold_label",
        lambda i, a, b, l: [i, "1", "1e", "fiction", "( a )", "( b )", "(A)", "(B)", a, b, l, l],
        sizes["train"], True, _NLI,
    )  # fmt: skip
    for stem, extra in (("dev_matched", 0), ("dev_mismatched", 3)):
        write(
            "mnli", "MNLI", stem, mnli + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label",
            lambda i, a, b, l: [i, "1", "1e", "slate", "( a )", "( b )", "(A)", "(B)", a, b, *[l] * 6],
            sizes["dev"] + extra, True, _NLI,
        )  # fmt: skip
    for stem, extra in (("test_matched", 0), ("test_mismatched", 2)):
        write(
            "mnli", "MNLI", stem, mnli,
            lambda i, a, b, l: [i, "1", "1e", "slate", "( a )", "( b )", "(A)", "(B)", a, b],
            sizes["test"] + extra, True, None,
        )  # fmt: skip

    for task, folder, cols, labels in (
        ("qnli", "QNLI", "index\tquestion\tsentence", _ENT),
        ("rte", "RTE", "index\tsentence1\tsentence2", _ENT),
        ("wnli", "WNLI", "index\tsentence1\tsentence2", binary),
    ):
        for stem in ("train", "dev"):
            write(
                task,
                folder,
                stem,
                cols + "\tlabel",
                lambda i, a, b, l: [i, a, b, l],
                sizes[stem],
                True,
                labels,
            )
        write(task, folder, "test", cols, lambda i, a, b, l: [i, a, b], sizes["test"], True, None)

    write(
        "ax", "diagnostic", "diagnostic", "index\tsentence1\tsentence2",
        lambda i, a, b, l: [i, a, b], sizes["test"] + 1, True, None,
    )  # fmt: skip
    return expected
