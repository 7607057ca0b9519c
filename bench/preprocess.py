r"""Preprocessing throughput and memory, per tokenizer kind: tokenizing alone against the whole
of `data.preprocess`, at 1x and 4x the corpus, and what that projects to for a real corpus.

    python -m bench.preprocess [--corpus=demo] [--language=en] [--copies=8] \
        [--kinds=wordpiece,bpe,sentencepiece] [--num_workers=N] [--out=rows.jsonl]

The corpus (any `--corpus` that data.preprocess reads) is written `--copies` times into one
text file (1x) and 4 x `--copies` times (4x), each copy's documents made distinct by a first
sentence of their own, so that deduplication keeps them. For each kind, a vocabulary of the
published size is trained on the 1x corpus, then:

- tokenizing alone: `encode_documents` over the 1x corpus in data.preprocess's batches, in
  this process, on one thread (data/tokenizers/threads.py): tokens per second on one core;
- preprocessing: `python -m data.preprocess` on the 1x and the 4x corpus with --num_workers
  (default: one per core), timed by the wall clock (the command, start-up included) and by
  the manifest (the shards written); its cost in core-seconds (seconds x cores used) against
  tokenizing alone, for the whole 1x run and for the 3x more that the 4x run adds (the cost
  at scale, without the fixed start-up), and the peak resident memory of its largest process (a worker or the
  reader), from getrusage;
- the projection (an English corpus only): English Wikipedia plus BookCorpus (about 3.3
  billion words; BERT's paper) at this rate per core on one 96-core host, from the words
  (whitespace-separated) and tokens counted here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from core import cli
from core.errors import UserError

WIKI_BOOKS_WORDS = 3.3e9  # BERT (arXiv 1810.04805) section 3.1: 2,500M + 800M words
PROJECTION_CORES = 96


def build_parser():
    parser = cli.parser(__doc__, "bench.preprocess")
    parser.add_argument("--corpus", default="demo", help="a corpus data.preprocess reads (default: demo)")
    parser.add_argument("--language", default="en", help="its language (sentence splitting of raw documents)")
    parser.add_argument(
        "--copies", type=cli.positive_int, default=8, help="copies of the corpus in the 1x file"
    )
    parser.add_argument("--kinds", default="wordpiece,bpe,sentencepiece", help="tokenizer kinds")
    parser.add_argument(
        "--vocab_size",
        type=cli.positive_int,
        default=None,
        help="every kind's vocabulary size (default: each kind's published one; a small corpus needs less)",
    )
    parser.add_argument("--num_workers", type=cli.positive_int, default=None, help="preprocessing workers")
    parser.add_argument("--out", default=None, help="append each kind's JSON line to this file")
    return parser


def _write_corpus(documents: list[list[str]], copies: int, path: str) -> int:
    """Writes `copies` distinct copies of the documents as a BERT-format text file; returns its bytes."""
    with open(path, "w", encoding="utf-8") as f:
        for copy in range(copies):
            for i, sentences in enumerate(documents):
                f.write(f"Copy {copy}, document {i}.\n" + "\n".join(sentences) + "\n\n")
    return os.path.getsize(path)


def _tokenize_alone(tokenizer, documents: list[list[str]]) -> tuple[float, int]:
    """(seconds, tokens) of encoding the documents in batches on this process's one thread."""
    start, tokens = time.perf_counter(), 0
    from data.preprocess import BATCH_DOCUMENTS

    for i in range(0, len(documents), BATCH_DOCUMENTS):
        for doc in tokenizer.encode_documents(documents[i : i + BATCH_DOCUMENTS]):
            tokens += sum(len(s) for s in doc)
    return time.perf_counter() - start, tokens


_PEAK = (
    "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(done.returncode)"
)


def _preprocess(corpus: str, tokenizer: str, output: str, workers: int) -> dict:
    """Runs data.preprocess in a child; its wall seconds, the manifest's, tokens, and the
    peak resident set of its largest process (KiB, through a wrapper's RUSAGE_CHILDREN)."""
    argv = [sys.executable, "-m", "data.preprocess", f"--corpus={corpus}", f"--tokenizer={tokenizer}"]
    argv += [f"--output={output}", f"--num_workers={workers}", "--num_shards=8", "--eval_fraction=0.05"]
    start = time.perf_counter()
    # Not this process's one-thread limit (RAYON_NUM_THREADS): the workers set their own.
    env = {k: v for k, v in os.environ.items() if k != "RAYON_NUM_THREADS"}
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, *argv], capture_output=True, text=True, check=False, env=env
    )
    wall = time.perf_counter() - start
    if done.returncode:
        raise UserError(f"data.preprocess failed: {done.stderr.strip().splitlines()[-1]}")
    with open(os.path.join(output, "manifest.json")) as f:
        manifest = json.load(f)
    tokens = sum(split["tokens"] for split in manifest["splits"].values())
    peak_kib = int(done.stdout.strip().splitlines()[-1])
    return {
        "wall_seconds": wall,
        "shard_seconds": manifest["seconds"],
        "tokens": tokens,
        "peak_mib": peak_kib / 1024,
    }


def _measure(kind: str, documents, paths: dict, workers: int, work: str, vocab_size: int | None) -> dict:
    from data import tokenizers

    trainable = tokenizers.TRAINABLE_KINDS[kind]
    tokenizer = trainable.train(
        documents,
        vocab_size or trainable.default_vocab_size,
        lowercase=True,
        min_frequency=2,
        limit_alphabet=10000,
    )
    tokenizer.save(os.path.join(work, kind))
    corpus_1x = [d for copy in range(paths["copies"]) for d in documents]
    alone_seconds, alone_tokens = _tokenize_alone(tokenizer, corpus_1x)
    runs = {
        size: _preprocess(
            paths[size], os.path.join(work, kind), os.path.join(work, f"{kind}_{size}"), workers
        )
        for size in ("1x", "4x")
    }
    cpus = os.cpu_count() or 1
    cores = min(cpus, workers * max(1, cpus // workers))  # each worker's threads: its share of the cores
    one = runs["1x"]
    per_core = one["tokens"] / one["shard_seconds"] / cores
    tokens_per_word = alone_tokens / paths["words"] if paths["words"] else None
    projected_hours = None  # English words only
    if tokens_per_word is not None:
        projected_hours = WIKI_BOOKS_WORDS * tokens_per_word / (per_core * PROJECTION_CORES) / 3600
    return {
        "kind": kind,
        "vocab_size": tokenizer.vocab_size,
        "tokens": {size: r["tokens"] for size, r in runs.items()},
        "tokens_per_word": tokens_per_word,
        "alone_tokens_per_s_core": alone_tokens / alone_seconds,
        "preprocess_tokens_per_s_core": per_core,
        "cost_vs_alone": one["shard_seconds"] * cores / alone_seconds,
        # The 3x more of the 4x run against tokenizing 3x more alone: the cost at scale,
        # where the start-up (workers importing TensorFlow, ~2-4 s) no longer counts.
        "marginal_cost_vs_alone": (runs["4x"]["shard_seconds"] - one["shard_seconds"])
        * cores
        / (3 * alone_seconds),
        "shard_seconds": {size: r["shard_seconds"] for size, r in runs.items()},
        "wall_seconds": {size: r["wall_seconds"] for size, r in runs.items()},
        "peak_mib": {size: r["peak_mib"] for size, r in runs.items()},
        "workers": workers,
        "cores": cores,
        "projected_hours_wiki_books_96_cores": projected_hours,
    }


def _minutes(hours: float | None) -> str:
    return "(English only)" if hours is None else f"{60 * hours:.0f} min"


def _table(rows: list[dict], corpus_mb: float) -> str:
    out = [
        f"| kind | tokens (1x, {corpus_mb:.1f} MB) | tokenizing alone, tokens/s on one core | preprocessing, "
        "tokens/s per core | preprocessing / tokenizing alone (all; the 4x run's extra 3x) | shards written "
        "in (1x / 4x) | peak RSS of the "
        "largest process, MiB (1x / 4x) | Wikipedia + BookCorpus on 96 cores (projected) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['kind']} | {r['tokens']['1x'] / 1e6:.2f} M | {r['alone_tokens_per_s_core'] / 1e3:.0f} k | "
            f"{r['preprocess_tokens_per_s_core'] / 1e3:.0f} k | {r['cost_vs_alone']:.2f}x; "
            f"{r['marginal_cost_vs_alone']:.2f}x | "
            f"{r['shard_seconds']['1x']:.1f} s / {r['shard_seconds']['4x']:.1f} s | "
            f"{r['peak_mib']['1x']:.0f} / {r['peak_mib']['4x']:.0f} | "
            f"{_minutes(r['projected_hours_wiki_books_96_cores'])} |"
        )
    return "\n".join(out)


def _run(args) -> None:
    from data import corpora, tokenizers

    tokenizers.limit_threads(1)  # tokenizing alone measures one core
    documents = [list(d.sentences) for d in corpora.iter_documents(args.corpus, language=args.language)]
    workers = args.num_workers or max(1, min(os.cpu_count() or 1, 8))
    rows = []
    with tempfile.TemporaryDirectory() as work:
        paths = {"copies": args.copies}
        paths["1x"], paths["4x"] = os.path.join(work, "corpus_1x.txt"), os.path.join(work, "corpus_4x.txt")
        size = _write_corpus(documents, args.copies, paths["1x"])
        _write_corpus(documents, 4 * args.copies, paths["4x"])
        english = args.language == "en"
        paths["words"] = args.copies * sum(len(s.split()) for d in documents for s in d) if english else 0
        for kind in args.kinds.split(","):
            row = _measure(kind, documents, paths, workers, work, args.vocab_size)
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
            rows.append(row)
    print(_table(rows, size / 1e6))


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
