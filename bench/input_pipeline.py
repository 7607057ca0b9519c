"""Throughput of the tf.data input pipeline alone: instances + masking + batching.

    python -m bench.input_pipeline [--data_dir=SHARDS] [--batch=32] [--seq=128] [--batches=200] \
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
`--data_dir=workdirs/demo/data` (README "Performance").
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from absl import app, flags

_DATA_DIR = flags.DEFINE_string("data_dir", None, "shards from data.preprocess (default: synthetic)")
_BATCH = flags.DEFINE_integer("batch", 32, "rows per batch")
_SEQ = flags.DEFINE_integer("seq", 128, "sequence length")
_BATCHES = flags.DEFINE_integer("batches", 200, "timed batches")
_FORMAT = flags.DEFINE_string("format", "segment_pair", "PipelineConfig.format")


def main(argv):
    del argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from data import pipeline

    tf.config.set_visible_devices([], "GPU")
    data_dir = _DATA_DIR.value
    if data_dir is None:
        from tests import synthetic

        data_dir = synthetic.write_shards(
            tempfile.mkdtemp(prefix="bench_input_"),
            synthetic.make_documents(200, seed=0, max_len=60),
            synthetic.make_documents(4, seed=1, first_id=190),
        )
    config = pipeline.PipelineConfig(
        max_seq_length=_SEQ.value,
        max_predictions_per_seq=max(1, 20 * _SEQ.value // 128),
        format=_FORMAT.value,
        sentence_objective="nsp" if _FORMAT.value in ("segment_pair", "sentence_pair") else "none",
    )
    iterator = iter(pipeline.make_dataset(data_dir, "train", config, _BATCH.value))
    for _ in range(10):
        next(iterator)
    tokens = examples = 0
    start = time.perf_counter()
    for _ in range(_BATCHES.value):
        batch = next(iterator)
        tokens += int(batch["input_mask"].numpy().sum())
        # Packed rows number their examples 1..k (example_ids); other formats hold one per row.
        examples += int(batch["example_ids"].numpy().max(1).sum()) if "example_ids" in batch else _BATCH.value
    seconds = time.perf_counter() - start
    rows = _BATCH.value * _BATCHES.value
    packing = (
        {
            "examples_per_row": round(examples / rows, 3),
            "unpacked_fill": round(tokens / (examples * _SEQ.value), 4),
        }
        if _FORMAT.value == "doc_sentences"
        else {}
    )
    print(
        json.dumps(
            {
                "name": "input_pipeline",
                "batch": _BATCH.value,
                "seq": _SEQ.value,
                "format": _FORMAT.value,
                "fill": round(tokens / (rows * _SEQ.value), 4),
                **packing,
                "examples_per_second": round(_BATCH.value * _BATCHES.value / seconds, 1),
                "tokens_per_second": round(tokens / seconds, 1),
                "data_dir": _DATA_DIR.value or "synthetic",
            }
        )
    )


if __name__ == "__main__":
    app.run(main)
