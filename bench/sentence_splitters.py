r"""Sentence splitters compared, for data/corpora.py's choice: each installed candidate on
a fixed case set (right or wrong, case by case), and its speed on the demo corpus's prose,
in sentences per second on one core.

    python -m bench.sentence_splitters [--repeat=3]

Candidates (maintained and offline, all on PyPI; those not installed are named as such):
sentencex (Wikimedia), pySBD, BlingFire (Microsoft), syntok, sentence-splitter (Moses'
non-breaking prefixes), and the rule set this project had before. To run them all:

    pip install pysbd==0.3.4 blingfire==0.1.8 syntok==1.4.4 sentence-splitter==1.4 regex

The case set: what a rule set of our own cut in two on ordinary Wikipedia prose ("Jan. 5",
"No. 1", "Gen. Lee", "pp. 12-14", "c. 1900"), then decimals, initials, initialisms, quotes,
brackets, a lowercase start, and Chinese and Japanese sentence ends (。！？), quotes
included. tests/test_corpora.py asserts the chosen splitter's results on it, case by case.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from core import cli

CASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "She was born on Jan. 5, 1990, in Ohio. She moved in 2001.",
        ("She was born on Jan. 5, 1990, in Ohio.", "She moved in 2001."),
    ),
    (
        "The song reached No. 1 on the chart. It stayed there.",
        ("The song reached No. 1 on the chart.", "It stayed there."),
    ),
    (
        "Gen. Lee surrendered at Appomattox. The war ended.",
        ("Gen. Lee surrendered at Appomattox.", "The war ended."),
    ),
    ("See pp. 12-14 for details. The rest follows.", ("See pp. 12-14 for details.", "The rest follows.")),
    (
        "The church was built c. 1900 by monks. It burned later.",
        ("The church was built c. 1900 by monks.", "It burned later."),
    ),
    ("Pi is about 3.14 in value. E is 2.72.", ("Pi is about 3.14 in value.", "E is 2.72.")),
    ("J. R. R. Tolkien wrote it. Mr. Smith read it.", ("J. R. R. Tolkien wrote it.", "Mr. Smith read it.")),
    (
        "It happened in the U.S. in 1990. Then it spread.",
        ("It happened in the U.S. in 1990.", "Then it spread."),
    ),
    (
        "Mr. Smith went to Washington. He arrived at 3.14 p.m. on Monday!",
        ("Mr. Smith went to Washington.", "He arrived at 3.14 p.m. on Monday!"),
    ),
    (
        "See e.g. the docs. It says (i.e. roughly) so.",
        ("See e.g. the docs.", "It says (i.e. roughly) so."),
    ),
    (
        "Apples, pears, etc. are fruit. Dr. No met Mrs. Peel.",
        ("Apples, pears, etc. are fruit.", "Dr. No met Mrs. Peel."),
    ),
    ('He said "Stop." Then he left.', ('He said "Stop."', "Then he left.")),
    ('He lives here now. "Really?" she asked.', ("He lives here now.", '"Really?" she asked.')),
    ("(It was late.) He went home.", ("(It was late.)", "He went home.")),
    ("Is it true? Yes! It is.", ("Is it true?", "Yes!", "It is.")),
    ("a lowercase start. does not split here.", ("a lowercase start. does not split here.",)),
    ("Visit example.com today. It is free.", ("Visit example.com today.", "It is free.")),
    ("今天天气很好。我们去公园吧！你去吗？", ("今天天气很好。", "我们去公园吧！", "你去吗？")),
    ("他说：“走吧。”然后离开了。", ("他说：“走吧。”", "然后离开了。")),
    ("今日は晴れです。公園に行きましょう！", ("今日は晴れです。", "公園に行きましょう！")),
)


# The rule-based splitter data/corpora.py had before sentencex replaced it (kept here, as a
# candidate, only to show what it got wrong).
_ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "etc", "vs", "cf", "al", "fig", "approx"}
)
_INITIALISM = re.compile(r"(?:[^\W\d_]\.){2,}")
_BOUNDARY = re.compile(r"([.!?]+)[\"'\u201d\u2019)\]]*\s+")


def _previous_rules(text: str) -> list[str]:
    text = " ".join(text.split())
    sentences, start = [], 0
    for match in _BOUNDARY.finditer(text):
        following = text[match.end() :].lstrip("([")[:1]
        if not (following.isupper() or following.isdigit() or (following and following in "\"'\u201c\u2018")):
            continue
        if match.group(1) == ".":
            begin = match.start()
            while begin > 0 and not text[begin - 1].isspace():
                begin -= 1
            word = text[begin : match.start() + 1].lstrip("\"'\u201c\u2018([")
            if (
                word[:-1].lower() in _ABBREVIATIONS
                or _INITIALISM.fullmatch(word)
                or (len(word) == 2 and word[0].isupper())
            ):
                continue
        sentences.append(text[start : match.end()].strip())
        start = match.end()
    sentences.append(text[start:].strip())
    return [s for s in sentences if s]


def candidates() -> dict[str, Callable[[str], list[str]] | str]:
    """{name: split(paragraph) -> sentences, or why it cannot run}."""
    from data import corpora

    out: dict[str, Callable[[str], list[str]] | str] = {
        f"{corpora.SPLITTER} (chosen)": corpora.split_sentences,
        "previous rules": _previous_rules,
    }
    try:
        import pysbd

        segmenter = pysbd.Segmenter(language="en", clean=False)
        out["pySBD"] = lambda t: [s.strip() for s in segmenter.segment(t) if s.strip()]
    except ImportError:
        out["pySBD"] = "not installed"
    try:
        import blingfire

        out["BlingFire"] = lambda t: [s for s in blingfire.text_to_sentences(t).split("\n") if s]
    except ImportError:
        out["BlingFire"] = "not installed"
    try:
        import syntok.segmenter

        out["syntok"] = lambda t: [
            "".join(token.spacing + token.value for token in sentence).strip()
            for paragraph in syntok.segmenter.process(t)
            for sentence in paragraph
        ]
    except ImportError:
        out["syntok"] = "not installed"
    try:
        from sentence_splitter import SentenceSplitter

        moses = SentenceSplitter(language="en")
        out["sentence-splitter"] = lambda t: [s for s in moses.split(t) if s]
    except ImportError:
        out["sentence-splitter"] = "not installed"
    return out


def build_parser():
    parser = cli.parser(__doc__, "bench.sentence_splitters")
    parser.add_argument(
        "--repeat", type=cli.positive_int, default=3, help="timed passes over the prose (best kept)"
    )
    return parser


def _run(args) -> None:
    from data import corpora

    prose = [" ".join(doc.sentences) for doc in corpora.demo_documents()]
    characters = sum(map(len, prose))
    megabytes = characters / 1e6
    print(
        f"{len(CASES)} cases; speed on the demo corpus: {len(prose)} paragraphs, {megabytes:.2f} M characters"
    )
    print("| splitter | cases right | sentences/s | MB/s | wrong on |")
    print("|---|---|---|---|---|")
    for name, split in candidates().items():
        if isinstance(split, str):
            print(f"| {name} | {split} | | | |")
            continue
        wrong = [i + 1 for i, (text, want) in enumerate(CASES) if tuple(split(text)) != want]
        best, count = float("inf"), 0
        for _ in range(args.repeat):
            start = time.perf_counter()
            count = sum(len(split(p)) for p in prose)
            best = min(best, time.perf_counter() - start)
        print(
            f"| {name} | {len(CASES) - len(wrong)}/{len(CASES)} | {count / best:,.0f} | "
            f"{characters / best / 1e6:.1f} | {', '.join(map(str, wrong)) or '-'} |"
        )


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
