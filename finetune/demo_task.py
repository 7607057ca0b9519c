"""A small GLUE-format task made from the embedded demo corpus, to run GLUE offline.

    python -m finetune.demo_task --output=DIR [--train=7000 --dev=1000 --test=1000]

Writes DIR/WordOrder/{train,dev,test}.tsv in SST-2's layout (`sentence<TAB>label` with a
header; test: `index<TAB>sentence`): "is this sentence in its original word order?".
Label 1: a sentence of the demo corpus as written; label 0: the same sentence with its
words shuffled. Half of each split is shuffled; no sentence appears in two splits.
Fine-tune on it with `--tasks=word_order --glue_dir=DIR` (see `make demo-glue`).
"""

from __future__ import annotations

import os
import sys

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

import numpy as np

from core import cli
from core.errors import UserError
from data import corpora

FOLDER = "WordOrder"
_MIN_WORDS, _MAX_WORDS = 6, 25


def _sentences() -> list[str]:
    """Distinct demo-corpus sentences of 6-25 words, whitespace normalised (no tabs), sorted."""
    seen = set()
    for doc in corpora.demo_documents():
        for sentence in doc.sentences:
            words = sentence.split()
            if _MIN_WORDS <= len(words) <= _MAX_WORDS:
                seen.add(" ".join(words))
    return sorted(seen)


def _shuffled(sentence: str, rng: np.random.Generator) -> str:
    """The sentence's words in a random order different from the original."""
    words = sentence.split()
    while True:
        order = rng.permutation(len(words))
        candidate = " ".join(words[i] for i in order)
        if candidate != sentence:
            return candidate


def make_task(output: str, train: int = 7000, dev: int = 1000, test: int = 1000, seed: int = 0) -> str:
    """Writes the task folder under `output`; returns its path. Deterministic for a seed."""
    sentences = _sentences()
    if train + dev + test > len(sentences):
        raise UserError(
            f"the demo corpus has {len(sentences)} usable sentences, "
            f"fewer than the {train + dev + test} asked for: lower --train/--dev/--test"
        )
    rng = np.random.default_rng(seed)
    chosen = [sentences[i] for i in rng.permutation(len(sentences))[: train + dev + test]]
    folder = os.path.join(output, FOLDER)
    os.makedirs(folder, exist_ok=True)
    splits = {"train": chosen[:train], "dev": chosen[train : train + dev], "test": chosen[train + dev :]}
    for name, rows in splits.items():
        labels = rng.permutation(np.arange(len(rows)) % 2)  # exactly balanced
        texts = [s if label else _shuffled(s, rng) for s, label in zip(rows, labels)]
        with open(os.path.join(folder, f"{name}.tsv"), "w", encoding="utf-8") as f:
            if name == "test":
                f.write("index\tsentence\n")
                f.writelines(f"{i}\t{text}\n" for i, text in enumerate(texts))
            else:
                f.write("sentence\tlabel\n")
                f.writelines(f"{text}\t{label}\n" for text, label in zip(texts, labels))
    return folder


def build_parser():
    parser = cli.parser(__doc__, "finetune.demo_task")
    parser.add_argument("--output", required=True, help="folder to write WordOrder/ into")
    parser.add_argument("--train", type=cli.positive_int, default=7000, help="training sentences")
    parser.add_argument("--dev", type=cli.positive_int, default=1000, help="dev sentences")
    parser.add_argument("--test", type=cli.positive_int, default=1000, help="test sentences")
    parser.add_argument("--seed", type=int, default=0, help="which sentences, which are shuffled, and how")
    return parser


def _run(args) -> None:
    folder = make_task(args.output, args.train, args.dev, args.test, args.seed)
    print(f"wrote {folder}/{{train,dev,test}}.tsv ({args.train} / {args.dev} / {args.test} rows)")


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
