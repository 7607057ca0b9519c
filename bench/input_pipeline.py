"""Throughput of the tf.data input pipeline alone: instances + masking + batching.

    python -m bench.input_pipeline [--data_dir=SHARDS] [--batch=32] [--seq=128] [--batches=200]

Reads `--data_dir` (output of data.preprocess), or synthetic shards of 200 documents
of 2-12 sentences of 1-60 tokens when not given, through `data.pipeline.make_dataset`
exactly as training does (BERT recipe: static masking, NSP, shuffle buffers) and times
`--batches` batches after 10 warm-up batches. The last line is one JSON object with
examples_per_second and tokens_per_second; bench/compare.py sets it beside what the
training step consumes (the pipeline must supply at least 5x that).
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
        max_seq_length=_SEQ.value, max_predictions_per_seq=max(1, 20 * _SEQ.value // 128)
    )
    iterator = iter(pipeline.make_dataset(data_dir, "train", config, _BATCH.value))
    for _ in range(10):
        next(iterator)
    tokens = 0
    start = time.perf_counter()
    for _ in range(_BATCHES.value):
        batch = next(iterator)
        tokens += int(batch["input_mask"].numpy().sum())
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "name": "input_pipeline",
                "batch": _BATCH.value,
                "seq": _SEQ.value,
                "examples_per_second": round(_BATCH.value * _BATCHES.value / seconds, 1),
                "tokens_per_second": round(tokens / seconds, 1),
                "data_dir": _DATA_DIR.value or "synthetic",
            }
        )
    )


if __name__ == "__main__":
    app.run(main)
