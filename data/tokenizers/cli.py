"""Tokenizers of the BERT family: WordPiece, byte-level BPE, SentencePiece (ALBERT's, XLNet's) and
DeBERTa's.

`train` learns a new vocab from a corpus and writes a tokenizer directory (the vocab and
tokenizer_config.json) that data.preprocess, pretraining and the model tools read:

    python -m data.tokenizers train --corpus=SPEC --output=DIR
        [--kind=wordpiece|bpe|sentencepiece|xlnet_spm]
        [--vocab_size=N (default 30522 / 50265 / 30000 / 32000)] [--cased]

--kind=wordpiece is BERT's vocab (vocab.txt), bpe RoBERTa's byte-level BPE (vocab.json +
merges.txt), sentencepiece ALBERT's unigram model (spiece.model), xlnet_spm XLNet's (spiece.model
with <eod>; the published XLNets are cased: add --cased for theirs). Documents held out for
evaluation (--eval_fraction, data.corpora.is_heldout) are left out. Published vocabs, DeBERTa's
included, need no training: pass their files wherever a tokenizer is asked for.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from core import cli
from data import corpora, record_corpora
from data.tokenizers.base import TokenizerError
from data.tokenizers.training import KINDS, TRAINABLE_KINDS


def _train_main(args: argparse.Namespace) -> None:
    """`train`: the only command."""
    documents = 0

    def training_documents() -> Iterator[tuple[str, ...]]:
        nonlocal documents
        for doc in corpora.iter_documents(
            args.corpus,
            max_line_chars=args.max_line_chars,
            tfds_data_dir=args.tfds_data_dir,
            **record_corpora.corpus_kwargs(args),
        ):
            if not corpora.is_heldout(doc, args.eval_fraction):
                documents += 1
                yield doc.sentences

    kind = TRAINABLE_KINDS[args.kind]
    if args.cased and not kind.cased_applies:
        raise TokenizerError(f"--cased does not apply to --kind={args.kind}: {kind.name} always keeps case")
    tokenizer = kind.train(
        training_documents(),
        args.vocab_size or kind.default_vocab_size,
        lowercase=not args.cased,
        min_frequency=args.min_frequency,
        limit_alphabet=args.limit_alphabet,
    )
    tokenizer.save(args.output)
    casing = (", cased" if args.cased else ", uncased") if kind.cased_applies else ""
    print(
        f"wrote {os.path.join(args.output, kind.written)}: {tokenizer.vocab_size} tokens "
        f"({args.kind}{casing}) from {documents} documents"
    )


def build_parser():
    parser = cli.parser(__doc__, "data.tokenizers")
    commands = parser.add_subparsers(dest="command", required=True, help="the command: train (the only one)")
    train = commands.add_parser(
        "train",
        help="learn a WordPiece, byte-level BPE or SentencePiece vocab",
        formatter_class=parser.formatter_class,
    )
    train.add_argument(
        "--corpus",
        required=True,
        help="'demo', 'tfds:NAME[:SPLIT]', or globs of BERT-format text, JSONL (.jsonl[.gz|.zst]) or "
        "Parquet files (comma-separated)",
    )
    train.add_argument(
        "--kind", choices=KINDS, default="wordpiece", help="BERT, RoBERTa, ALBERT or XLNet vocab"
    )
    defaults = " / ".join(str(kind.default_vocab_size) for kind in TRAINABLE_KINDS.values())
    train.add_argument(
        "--vocab_size",
        type=cli.positive_int,
        default=None,
        help=f"default {defaults} by --kind (as published)",
    )
    train.add_argument("--output", required=True, help="directory for the vocab and tokenizer_config.json")
    train.add_argument(
        "--cased", action="store_true", help="keep case and accents (default: uncased; not for bpe)"
    )
    train.add_argument(
        "--min_frequency", type=int, default=2, help="wordpiece and bpe: drop rarer merges / pieces"
    )
    train.add_argument(
        "--limit_alphabet", type=int, default=1000, help="wordpiece: at most this many initial characters"
    )
    train.add_argument(
        "--eval_fraction",
        type=float,
        default=0.02,
        help="held-out documents (data.corpora.is_heldout) are left out of training",
    )
    train.add_argument(
        "--max_line_chars",
        type=cli.positive_int,
        default=100_000,
        help="a longer line in a text corpus is an error",
    )
    train.add_argument("--tfds_data_dir", default=None, help="TFDS data_dir for --corpus=tfds:NAME")
    record_corpora.add_flags(train)
    return parser


main = cli.entry(build_parser, _train_main)
