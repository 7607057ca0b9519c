"""`make demo`: a small model pretrained on the English documentation that ships with CPython.

    python -m pretrain.demo --workdir=workdirs/demo [--gin_file=configs/runs/demo.gin ...]
        [--gin_bindings='run.steps = 100' ...]

1. trains a WordPiece vocabulary on the embedded demo corpus (data.corpora "demo"),
2. preprocesses the corpus into shards (train / held-out documents),
3. pretrains `--gin_file` on this machine's CPU: by default `configs/runs/demo_deberta.gin`
   (2 layers of 128 with DeBERTa's relative attention, MLM through its enhanced mask
   decoder); `configs/runs/demo.gin` is BERT-Tiny with MLM + NSP,
4. reports held-out MLM (and NSP) accuracy at the start and the end next to the unigram
   baseline (always predicting the most frequent training token), tokens/s, the
   model filling [MASK] in held-out sentences, and saves `loss_curve.png`.

Every stage is skipped when its output is already there, so a second `make demo`
only reports (or resumes an interrupted training run).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from core import cli

_GIN_FILE = "configs/runs/demo_deberta.gin"
_NUM_EXAMPLES = 6


def build_parser():
    parser = cli.parser(__doc__, "pretrain.demo")
    parser.add_argument("--workdir", default="workdirs/demo", help="where everything goes")
    cli.add_gin_flags(parser, default_files=[_GIN_FILE])
    parser.add_argument(
        "--vocab_size", type=cli.positive_int, default=8192, help="WordPiece vocabulary size to train"
    )
    return parser


def _tokenizer(workdir: str, vocab_size: int):
    from data import corpora, tokenizers

    path = os.path.join(workdir, "tokenizer")
    if not os.path.exists(os.path.join(path, "vocab.txt")):
        docs = (d.sentences for d in corpora.demo_documents() if not corpora.is_heldout(d, 0.05))
        tokenizers.train_wordpiece(docs, vocab_size).save(path)
        tokenizer = tokenizers.load_tokenizer(path)
        fewer = (
            f" (all this corpus yields of the {vocab_size} asked for)"
            if tokenizer.vocab_size < vocab_size
            else ""
        )
        print(f"{path}: {tokenizer.vocab_size} wordpieces{fewer}")
        return tokenizer
    tokenizer = tokenizers.load_tokenizer(path)
    print(
        f"{path} is kept ({tokenizer.vocab_size} wordpieces; --vocab_size applies to a new workdir only); "
        "nothing to do"
    )
    return tokenizer


def _number(value: float | None, spec: str) -> str:
    """`value` formatted, or 'unknown' (a time or rate of a call that left no record)."""
    return "unknown" if value is None else format(value, spec)


def _unigram_baseline(data_dir: str, eval_batches) -> tuple[float, str]:
    """Held-out MLM accuracy of always predicting the most frequent training token."""
    import numpy as np
    import tensorflow as tf

    from data import instances, shards

    manifest = shards.load_manifest(data_dir)
    counts = np.zeros(manifest.vocab_size, np.int64)
    for doc in (
        tf.data.TFRecordDataset(manifest.files("train")).map(instances.parse_document).as_numpy_iterator()
    ):
        counts += np.bincount(doc["token_ids"], minlength=len(counts))
    top = int(np.argmax(counts))
    hits = sum(float(((b["masked_lm_ids"] == top) * b["masked_lm_weights"]).sum()) for b in eval_batches)
    total = sum(float(b["masked_lm_weights"].sum()) for b in eval_batches)
    return hits / total, top


def _fill_mask_examples(workdir: str) -> tuple[list[str], dict[str, float]]:
    """Masks one word, chosen at random among its words that are a single wordpiece, in each
    held-out sentence of 8-20 words that has one, and has the model (interop.predict's
    fill-mask on the run's workdir: any objective with an MLM head) fill it. Returns the
    report lines (a few sentences with the model's top 5, then the hit rates over all of
    them) and the rates."""
    import numpy as np

    from data import corpora
    from interop import bundle, predict

    model = bundle.load_pretrained(workdir)
    tokenizer = model.tokenizer
    docs = [d for d in corpora.demo_documents() if corpora.is_heldout(d, 0.05)]
    sentences = [s for d in docs for s in d.sentences if 8 <= len(s.split()) <= 20]
    rng = np.random.default_rng(0)
    rows, texts, answers = [], [], []
    for sentence in sentences:
        ids = tokenizer.encode(sentence)[: model.config.max_length - 2]
        # Words that are one alphabetic wordpiece (none of "##" pieces): a whole word is
        # masked, and the model's top 5 can hold it.
        words = [
            i
            for i, t in enumerate(ids)
            if tokenizer.id_to_token(t).isalpha()
            and (i + 1 == len(ids) or not tokenizer.id_to_token(ids[i + 1]).startswith("##"))
        ]
        if not words:
            continue
        target = int(rng.choice(words))
        answers.append(tokenizer.id_to_token(ids[target]))
        ids[target] = tokenizer.mask_id
        rows.append([tokenizer.cls_id, *ids, tokenizer.sep_id])
        texts.append(tokenizer.decode(ids).replace(tokenizer.id_to_token(tokenizer.mask_id), "[MASK]"))
    # One call (one compilation): its probabilities are [rows, 1, vocab].
    guesses = [[token for token, _ in c] for (c,) in predict.fill_mask_ids(model, rows, 5)]
    lines = []
    for i in range(0, len(rows), max(1, len(rows) // _NUM_EXAMPLES))[:_NUM_EXAMPLES]:
        # The answer, when among the model's five, is shown in brackets.
        listed = ", ".join(f"[{token}]" if token == answers[i] else token for token in guesses[i])
        lines.append(f"  {texts[i]}\n    answer: {answers[i]}   model: {listed}")
    count = max(1, len(rows))
    rates = {
        "fill_mask_top1": sum(g[0] == a for g, a in zip(guesses, answers)) / count,
        "fill_mask_top5": sum(a in g for g, a in zip(guesses, answers)) / count,
    }
    lines.append(
        f"  over all {len(rows)} held-out sentences of 8-20 words (one random single-wordpiece word "
        f"masked in each): the answer is the model's first guess in {rates['fill_mask_top1']:.0%}, "
        f"in its top 5 in {rates['fill_mask_top5']:.0%}"
    )
    return lines, rates


def _plot(workdir: str, path: str, headline: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from core import metrics_log

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for split, style in (("train", "-"), ("eval", "o-")):
        pts = [r for r in metrics_log.read(workdir, split) if headline in r]
        ax1.plot([r["step"] for r in pts], [r["loss"] for r in pts], style, label=f"{split} loss")
        ax2.plot([r["step"] for r in pts], [r[headline] for r in pts], style, label=f"{split} {headline}")
    ax1.set_xlabel("step"), ax2.set_xlabel("step")
    ax1.legend(), ax2.legend()
    ax1.grid(alpha=0.3), ax2.grid(alpha=0.3)
    fig.suptitle("demo pretraining on CPython's documentation")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _run(args) -> None:
    from core import lease

    cli.setup_logging()
    with lease.held(args.workdir, "pretrain.demo"):  # one demo per workdir (core/lease.py)
        _demo(args)


def _demo(args) -> None:
    import gin

    from core import metrics_log
    from core import workdir as workdir_lib
    from data import pipeline, preprocess
    from interop import bundle
    from models.encoder import EncoderConfig
    from pretrain import trainer

    start = time.time()
    workdir = args.workdir
    data_dir = os.path.join(workdir, "data")
    run_dir = os.path.join(workdir, "run")
    print(f"[1/4] WordPiece vocabulary on the embedded corpus -> {workdir}/tokenizer")
    tokenizer = _tokenizer(workdir, args.vocab_size)
    print(f"[2/4] preprocessing -> {data_dir}")
    # One worker (this process): the corpus is small, and worker processes would each
    # spend longer starting than tokenizing.
    try:
        manifest = preprocess.preprocess(
            "demo",
            os.path.join(workdir, "tokenizer"),
            data_dir,
            num_shards=4,
            eval_fraction=0.05,
            num_workers=1,
        )
    except preprocess.OtherShardsError:
        # The shards of an older version (other options): the demo has no --overwrite.
        raise preprocess.OtherShardsError(
            f"'{data_dir}' holds shards an older version made: start the demo afresh with "
            f"`make clean-demo` (rm -rf {workdir})"
        ) from None
    gin_files = cli.gin_files(args)
    print(f"[3/4] pretraining {' + '.join(gin_files)} -> {run_dir}")
    cli.parse_gin(
        gin_files,
        [
            f"EncoderConfig.vocab_size = {tokenizer.vocab_size}",
            f"run.data_dir = '{data_dir}'",
            *args.gin_bindings,
        ],
    )
    model_config = EncoderConfig()
    if os.path.exists(os.path.join(run_dir, workdir_lib.MODEL_CONFIG)):
        saved = bundle.load_model_config(run_dir)
        if saved != model_config:
            # E.g. the BERT-Tiny run of a `make demo` from before its model changed.
            differ = [
                f.name
                for f in dataclasses.fields(saved)
                if getattr(saved, f.name) != getattr(model_config, f.name)
            ]
            raise workdir_lib.WorkdirError(
                f"'{run_dir}' holds a run of another model than {' + '.join(gin_files)}'s (EncoderConfig "
                f"differs in {', '.join(differ)}): start the demo afresh with `make clean-demo` "
                f"(rm -rf {workdir}), or pass another --workdir"
            )
    summary_path = os.path.join(run_dir, "summary.json")
    summary = trainer.run(run_dir)  # a finished run's: the record of the call that trained it, kept
    if summary.get("stopped_by"):  # Ctrl-C or SIGTERM: the checkpoint is written
        print(
            f"stopped by {summary['stopped_by']} at step {summary['step']}: run `make demo` again to resume"
        )
        return
    print("[4/4] report")
    pipeline_config = pipeline.PipelineConfig()
    batch_size = gin.query_parameter("run.batch_size")
    # The step-0 evaluation is in metrics.jsonl even when this call only resumed a finished run.
    start_eval = next((r for r in metrics_log.read(run_dir, "eval") if r["step"] == 0), {})
    train = summary["train"] or {}
    splits = manifest.splits
    report = [
        f"corpus: {splits['train']['documents']} train / {splits['eval']['documents']} held-out documents, "
        f"{splits['train']['tokens']} training tokens, vocab {tokenizer.vocab_size}",
        f"model: {model_config.num_layers} layers, hidden {model_config.hidden_size}, "
        f"{pipeline_config.max_seq_length} tokens, batch {batch_size}, {summary['step']} steps "
        f"({summary['objective']})",
        f"held-out {'':22} start      end",
    ]
    for metric, end in summary["eval"].items():
        percent = "accuracy" in metric
        shown = (lambda v: f"{v:8.2%}") if percent else (lambda v: f"{v:8.3f}")
        line = f"  {metric:28} {shown(start_eval.get(metric, float('nan')))} {shown(end)}"
        if metric == "mlm_accuracy":
            eval_batches = gin.query_parameter("run.eval_batches")
            ds = pipeline.make_dataset(data_dir, "eval", pipeline_config, batch_size, shuffle=False)
            baseline, top = _unigram_baseline(data_dir, list(ds.take(eval_batches).as_numpy_iterator()))
            summary["unigram_baseline"] = baseline
            line += f"   (unigram baseline {baseline:.2%}: always '{tokenizer.id_to_token(top)}')"
        elif metric == "sentence_accuracy":
            line += "   (chance 50%)"
        report.append(line)
    lines, rates = _fill_mask_examples(run_dir)
    summary.update(rates)
    plot = os.path.join(run_dir, "loss_curve.png")
    _plot(run_dir, plot, summary["headline_metric"])
    seconds = time.time() - start
    trained = summary["resumed_from"] is None or summary["resumed_from"] < summary["step"]
    # A call that found the run trained keeps the training call's time (None: not on record).
    summary["demo_wall_seconds"] = seconds if trained else summary.get("demo_wall_seconds")
    this_call = "" if trained else f" (this call found the run trained and reported in {seconds:.0f} s)"
    report += [
        f"training: {_number(summary['tokens_per_second'], '.0f')} tokens/s (non-pad tokens / training wall "
        f"time), {train.get('model_tflops_per_second', 0) * 1e3:.1f} model GFLOP/s, "
        f"run wall time {_number(summary['wall_seconds'], '.0f')} s, "
        f"demo wall time {_number(summary['demo_wall_seconds'], '.0f')} s{this_call}",
        "fill-mask on held-out sentences:",
        *lines,
        f"loss curve: {plot}; summary: {summary_path}",
    ]
    with open(summary_path, "w") as f:
        json.dump(summary, f, indent=2)
    text = "\n".join(report)
    with open(os.path.join(workdir, "report.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    baseline = summary.get("unigram_baseline")
    if baseline is not None and summary["mlm_accuracy"] <= baseline:
        print("warning: held-out MLM accuracy is not above the unigram baseline", file=sys.stderr)


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
