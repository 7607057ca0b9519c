r"""Throughput of the tf.data input pipeline alone: instances + masking + batching.

    python -m bench.input_pipeline [--data_dir=SHARDS] [--batch_size=32] [--seq_len=128] [--steps=200] \
        [--format=segment_pair|sentence_pair|full_sentences|doc_sentences]

Reads `--data_dir` (output of data.preprocess), or synthetic shards of 200 documents
of 2-12 sentences of 1-60 tokens when not given, through `data.pipeline.make_dataset`
exactly as training does (BERT recipe: static masking, NSP, shuffle buffers) and times
`--batches` batches after 10 warm-up batches. The last line is one JSON object with
examples_per_second and tokens_per_second; bench/compare.py sets it beside what the
training step consumes (the pipeline must supply at least 5x that).

It also reports `fill`, the fraction of row positions holding real tokens: a step costs
the same whatever the fill, so useful tokens/s scale with it. For DOC-SENTENCES rows,
which are packed (several short examples per row, attention kept within each),
`examples_per_row` is the mean number packed together and `unpacked_fill` the fill the
same examples would have one per row: packing multiplies useful tokens/s by
fill / unpacked_fill. Measured on real text with `make demo`'s shards:
`--data_dir=workdirs/demo/data` (docs/performance.md).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from core import cli


def build_parser():
    parser = cli.parser(__doc__, "bench.input_pipeline")
    parser.add_argument("--data_dir", default=None, help="shards from data.preprocess (default: synthetic)")
    batch_size = parser.add_argument("--batch_size", type=cli.positive_int, default=32, help="rows per batch")
    seq_len = parser.add_argument("--seq_len", type=cli.positive_int, default=128, help="sequence length")
    steps = parser.add_argument("--steps", type=cli.positive_int, default=200, help="timed batches")
    parser.add_argument(
        "--format",
        default="segment_pair",
        choices=("segment_pair", "sentence_pair", "full_sentences", "doc_sentences"),
        help="PipelineConfig.format",
    )
    parser.add_argument(
        "--masking_unit",
        default="token",
        choices=("token", "whole_word", "ngram", "span"),
        help="PipelineConfig.masking_unit (the others need a --data_dir with a word-start tokenizer)",
    )
    cli.hidden_alias(parser, "--batch", batch_size)
    cli.hidden_alias(parser, "--seq", seq_len)
    cli.hidden_alias(parser, "--batches", steps)
    return parser


def _run(args) -> None:
    import tensorflow as tf

    from data import pipeline

    tf.config.set_visible_devices([], "GPU")
    data_dir = args.data_dir
    if data_dir is None:
        from data import synthetic

        data_dir = synthetic.write_shards(
            tempfile.mkdtemp(prefix="bench_input_"),
            synthetic.make_documents(200, seed=0, max_len=60),
            synthetic.make_documents(4, seed=1, first_id=190),
        )
    config = pipeline.PipelineConfig(
        max_seq_length=args.seq_len,
        max_predictions_per_seq=max(1, 20 * args.seq_len // 128),
        format=args.format,
        sentence_objective="nsp" if args.format in ("segment_pair", "sentence_pair") else "none",
        masking_unit=args.masking_unit,
    )
    iterator = iter(pipeline.make_dataset(data_dir, "train", config, args.batch_size))
    for _ in range(10):
        next(iterator)
    tokens = examples = 0
    start = time.perf_counter()
    for _ in range(args.steps):
        batch = next(iterator)
        tokens += int(batch["input_mask"].numpy().sum())
        # Packed rows number their examples 1..k (example_ids); other formats hold one per row.
        examples += (
            int(batch["example_ids"].numpy().max(1).sum()) if "example_ids" in batch else args.batch_size
        )
    seconds = time.perf_counter() - start
    rows = args.batch_size * args.steps
    packing = (
        {
            "examples_per_row": round(examples / rows, 3),
            "unpacked_fill": round(tokens / (examples * args.seq_len), 4),
        }
        if args.format == "doc_sentences"
        else {}
    )
    print(
        json.dumps(
            {
                "name": "input_pipeline",
                "batch": args.batch_size,
                "seq": args.seq_len,
                "format": args.format,
                "masking_unit": args.masking_unit,
                "fill": round(tokens / (rows * args.seq_len), 4),
                **packing,
                "examples_per_second": round(args.batch_size * args.steps / seconds, 1),
                "tokens_per_second": round(tokens / seconds, 1),
                "data_dir": args.data_dir or "synthetic",
            }
        )
    )


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
