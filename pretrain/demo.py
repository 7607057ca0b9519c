"""`make demo`: a small BERT pretrained on the English documentation that ships with CPython.

    python -m pretrain.demo --workdir=workdirs/demo [--gin_bindings=run.steps=100]

1. trains a WordPiece vocabulary on the embedded demo corpus (data.corpora "demo"),
2. preprocesses the corpus into shards (train / held-out documents),
3. pretrains `configs/runs/demo.gin` (MLM + NSP) on this machine's CPU,
4. reports held-out MLM and NSP accuracy at the start and the end next to the unigram
   baseline (always predicting the most frequent training token), tokens/s, the
   model filling [MASK] in held-out sentences, and saves `loss_curve.png`.

Every stage is skipped when its output is already there, so a second `make demo`
only reports (or resumes an interrupted training run).
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", "workdirs/demo", "where everything goes")
_GIN_BINDINGS = flags.DEFINE_multi_string("gin_bindings", [], "extra gin bindings for the run")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 8192, "WordPiece vocabulary size to train")
_GIN_FILE = "configs/runs/demo.gin"
_NUM_EXAMPLES = 6


def _tokenizer(workdir: str):
    from data import corpora, tokenizers

    path = os.path.join(workdir, "tokenizer")
    if not os.path.exists(os.path.join(path, "vocab.txt")):
        docs = (d.sentences for d in corpora.demo_documents() if not corpora.is_heldout(d, 0.05))
        tokenizers.train_wordpiece(docs, _VOCAB_SIZE.value).save(path)
    return tokenizers.load_tokenizer(path)


def _unigram_baseline(data_dir: str, eval_batches) -> tuple[float, str]:
    """Held-out MLM accuracy of always predicting the most frequent training token."""
    import numpy as np
    import tensorflow as tf

    from data import instances, shards

    manifest = shards.load_manifest(data_dir)
    counts = np.zeros(manifest["vocab_size"], np.int64)
    files = [os.path.join(data_dir, f) for f in manifest["splits"]["train"]["files"]]
    for doc in tf.data.TFRecordDataset(files).map(instances.parse_document).as_numpy_iterator():
        counts += np.bincount(doc["token_ids"], minlength=len(counts))
    top = int(np.argmax(counts))
    hits = sum(float(((b["masked_lm_ids"] == top) * b["masked_lm_weights"]).sum()) for b in eval_batches)
    total = sum(float(b["masked_lm_weights"].sum()) for b in eval_batches)
    return hits / total, top


def _fill_mask_examples(tokenizer, model_config, params, max_seq_length: int) -> list[str]:
    """Masks one word in each of a few held-out sentences and shows the top-5 predictions."""
    import jax
    import numpy as np

    from data import corpora
    from models.pretraining import PretrainingModel

    model = PretrainingModel(model_config, sentence_objective=True)
    lines = []
    docs = [d for d in corpora.demo_documents() if corpora.is_heldout(d, 0.05)]
    sentences = [s for d in docs for s in d.sentences if 8 <= len(s.split()) <= 20][
        : 200 : 200 // _NUM_EXAMPLES
    ]
    rng = np.random.default_rng(0)
    apply = jax.jit(lambda p, b: model.apply({"params": p}, b, deterministic=True))
    for sentence in sentences[:_NUM_EXAMPLES]:
        ids = tokenizer.encode(sentence)[: max_seq_length - 2]
        # Mask one whole word (a single alphabetic wordpiece), chosen at random: a fair sample.
        words = [
            i
            for i, t in enumerate(ids)
            if tokenizer.id_to_token(t).isalpha()
            and (i + 1 == len(ids) or not tokenizer.id_to_token(ids[i + 1]).startswith("##"))
        ]
        if not words:
            continue
        target = int(rng.choice(words))
        original = ids[target]
        ids[target] = tokenizer.mask_id
        tokens = [tokenizer.cls_id, *ids, tokenizer.sep_id]
        pad = max_seq_length - len(tokens)
        batch = {
            "input_ids": np.array([tokens + [tokenizer.pad_id] * pad], np.int32),
            "input_mask": np.array([[1] * len(tokens) + [0] * pad], np.int32),
            "segment_ids": np.zeros((1, max_seq_length), np.int32),
            "positions": np.arange(max_seq_length, dtype=np.int32)[None],
            "masked_lm_positions": np.array([[target + 1]], np.int32),
        }
        logits = apply(params, batch)
        top5 = np.argsort(-np.asarray(logits["mlm_logits"][0, 0]))[:5]
        shown = tokenizer.decode(ids).replace(tokenizer.id_to_token(tokenizer.mask_id), "[MASK]")
        guesses = ", ".join(tokenizer.id_to_token(int(t)) for t in top5)
        lines.append(f"  {shown}\n    answer: {tokenizer.id_to_token(original)}   model: {guesses}")
    return lines


def _plot(workdir: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for split, style in (("train", "-"), ("eval", "o-")):
        pts = [r for r in rows if r["split"] == split]
        ax1.plot([r["step"] for r in pts], [r["loss"] for r in pts], style, label=f"{split} loss (MLM + NSP)")
        ax2.plot(
            [r["step"] for r in pts], [r["mlm_accuracy"] for r in pts], style, label=f"{split} MLM accuracy"
        )
    ax1.set_xlabel("step"), ax2.set_xlabel("step")
    ax1.legend(), ax2.legend()
    ax1.grid(alpha=0.3), ax2.grid(alpha=0.3)
    fig.suptitle("BERT demo pretraining on CPython's documentation")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv):
    del argv
    import gin
    import jax
    import orbax.checkpoint as ocp

    from data import pipeline, preprocess
    from models.encoder import EncoderConfig
    from pretrain import cli, trainer

    cli.setup_logging()
    start = time.time()
    workdir = _WORKDIR.value
    data_dir = os.path.join(workdir, "data")
    run_dir = os.path.join(workdir, "run")
    with cli.user_errors():
        print(f"[1/4] WordPiece vocabulary on the embedded corpus -> {workdir}/tokenizer")
        tokenizer = _tokenizer(workdir)
        print(f"[2/4] preprocessing -> {data_dir}")
        manifest = preprocess.preprocess(
            "demo", os.path.join(workdir, "tokenizer"), data_dir, num_shards=4, eval_fraction=0.05
        )
        print(f"[3/4] pretraining {_GIN_FILE} -> {run_dir}")
        cli.parse_gin(
            [_GIN_FILE],
            [
                f"EncoderConfig.vocab_size = {tokenizer.vocab_size}",
                f"run.data_dir = '{data_dir}'",
                *_GIN_BINDINGS.value,
            ],
        )
        summary = trainer.run(run_dir)
    print("[4/4] report")
    pipeline_config = pipeline.PipelineConfig()
    model_config = EncoderConfig()
    eval_batches = gin.query_parameter("run.eval_batches")
    batch_size = gin.query_parameter("run.batch_size")
    ds = pipeline.make_dataset(data_dir, "eval", pipeline_config, batch_size, shuffle=False)
    batches = [{k: v for k, v in b.items()} for b in ds.take(eval_batches).as_numpy_iterator()]
    baseline, top = _unigram_baseline(data_dir, batches)
    restored = ocp.CheckpointManager(os.path.abspath(os.path.join(run_dir, "checkpoints"))).restore(
        summary["step"], args=ocp.args.Composite(state=ocp.args.StandardRestore())
    )
    params = jax.tree.map(jax.numpy.asarray, restored["state"]["params"])
    # The step-0 evaluation is in metrics.jsonl even when this call only resumed a finished run.
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    start_eval = next((r for r in rows if r["split"] == "eval" and r["step"] == 0), {})
    train = summary["train"] or {}
    splits = manifest["splits"]
    report = [
        f"corpus: {splits['train']['documents']} train / {splits['eval']['documents']} held-out documents, "
        f"{splits['train']['tokens']} training tokens, vocab {tokenizer.vocab_size}",
        f"model: {model_config.num_layers} layers, hidden {model_config.hidden_size}, "
        f"{pipeline_config.max_seq_length} tokens, batch {batch_size}, {summary['step']} steps",
        "held-out                    start     end",
        f"  MLM accuracy            {start_eval.get('mlm_accuracy', float('nan')):7.2%}  "
        f"{summary['mlm_accuracy']:7.2%}"
        f"   (unigram baseline {baseline:.2%}: always '{tokenizer.id_to_token(top)}')",
        f"  NSP accuracy            {start_eval.get('sentence_accuracy', float('nan')):7.2%}  "
        f"{summary['sentence_accuracy']:7.2%}   (chance 50%)",
        f"  loss (MLM + NSP)        {start_eval.get('loss', float('nan')):7.3f}  {summary['loss']:7.3f}",
        f"training: {summary['tokens_per_second']:.0f} tokens/s (non-pad), "
        f"{train.get('model_tflops_per_second', 0) * 1e3:.1f} model GFLOP/s, "
        f"run wall time {summary['wall_seconds']:.0f} s, demo wall time {time.time() - start:.0f} s",
        "fill-mask on held-out sentences:",
        *_fill_mask_examples(tokenizer, model_config, params, pipeline_config.max_seq_length),
    ]
    plot = os.path.join(run_dir, "loss_curve.png")
    _plot(run_dir, plot)
    report.append(f"loss curve: {plot}; summary: {run_dir}/summary.json")
    summary.update(unigram_baseline=baseline, demo_wall_seconds=time.time() - start)
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    text = "\n".join(report)
    with open(os.path.join(workdir, "report.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    if summary["mlm_accuracy"] <= baseline:
        print("warning: held-out MLM accuracy is not above the unigram baseline", file=sys.stderr)


if __name__ == "__main__":
    app.run(main)
