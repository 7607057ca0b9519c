r"""Training-step benchmark of our pretraining code (the same step `pretrain.train` runs).

    python -m bench.pretrain --gin_file=configs/models/bert_base.gin --batch_size=32 --seq_len=128 \
        [--dtype=bfloat16] [--steps=10] [--num_predictions=20] [--mesh=data:1] \
        [--without=masked_decoding,donation,vocab_padding,f32_accumulation,dropout_bits] [--fused_attention] \
        [--dropout_prng=rbg] [--scan_layers] [--profile_dir=DIR] [--compile_only]

Builds the real sharded train step (pretrain/step.py `build`, for the gin files' objective,
by default MLM + NSP; ELECTRA with `--gin_file=configs/models/electra_base.gin
--gin_file=configs/recipes/electra.gin`, which masks inside the step: AdamW, donated state,
MLM on the P masked positions only) for full-length synthetic rows with P masked
positions, compiles it, runs 2 warm-up steps and times `--steps` more. The last line is
one JSON object (bench/report.py): compile seconds, steps/s, non-pad tokens/s, model
TFLOP/s counted by core/flops.py (docs/performance.md), this device's matmul peak
measured in the same run and dtype, MFU and peak memory. `--fake_devices=N` runs on N fake CPU devices.

`--without=X,...` turns off one of our optimisations, to measure what each buys:
`masked_decoding` (the MLM head decodes all L positions, loss unchanged:
report.all_positions_batch), `donation` (the state is not donated), `vocab_padding`
(the vocab is not padded to --vocab_pad_multiple), `f32_accumulation` (matmuls in bf16
give bf16 products, flax's nn.Dense way: `EncoderConfig.matmul_accumulation = 'compute'`),
`dropout_bits` (a float32 uniform per dropout-mask element, flax's nn.Dropout way, instead of
16 bits: `EncoderConfig.dropout_bits = 32`, models/dropout.py).
`--dropout_prng=rbg` draws the dropout masks with XLA's RngBitGenerator instead of
threefry (core/prng.py); `--scan_layers` runs the layers as one lax.scan
(`EncoderConfig.scan_layers`: compile seconds are in the JSON). `--fused_attention` sets attention
dropout to 0 so that attention goes through jax.nn.dot_product_attention
(`EncoderConfig.attention_implementation`, e.g. cudnn on GPU) instead of the explicit
softmax with dropout that BERT's recipe trains with. Model FLOPs are always counted
for P masked positions, so a variant doing more work gets no credit for it.
`--paired` also builds the default step and times the two alternately (`--rounds`
times `--steps` steps each), so that a shared machine's drift hits both alike; the
JSON then has default_seconds_per_step and variant_over_default (the ratio of seconds
per step: what an optimisation buys, when the variant turns it off).
`--profile_dir=DIR` then traces `--steps` more steps with jax.profiler into DIR (open
it in TensorBoard's profile plugin or Perfetto) and prints the time per XLA operation
kind, largest first (bench/report.py:profile_steps); the JSON gets the same table.
`--compile_only` compiles the init and the step (of both variants with `--paired`) into
the persistent compilation cache that JAX_COMPILATION_CACHE_DIR names, and runs nothing
(bench.suite's compile-ahead workers); the JSON line is then `ours_compiled`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from core import cli, prng
from core.errors import UserError

OPTIMISATIONS = ("masked_decoding", "donation", "vocab_padding", "f32_accumulation", "dropout_bits")


def build_parser():
    parser = cli.parser(__doc__, "bench.pretrain")
    cli.add_gin_flags(parser, example="EncoderConfig.num_layers = 6")
    batch_size = parser.add_argument(
        "--batch_size", type=cli.positive_int, default=32, help="global batch (rows)"
    )
    seq_len = parser.add_argument("--seq_len", type=cli.positive_int, default=128, help="sequence length")
    num_predictions = parser.add_argument(
        "--num_predictions",
        type=cli.positive_int,
        default=None,
        help="masked positions per row (default 20 per 128 tokens)",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="compute dtype (params stay float32)",
    )
    parser.add_argument(
        "--steps", type=cli.positive_int, default=10, help="timed steps after compilation and 2 warm-up steps"
    )
    parser.add_argument("--mesh", default=None, help="e.g. data:8; default every device on data")
    parser.add_argument("--fake_devices", type=int, default=0, help="run on this many fake CPU devices")
    parser.add_argument(
        "--vocab_pad_multiple",
        type=int,
        default=128,
        help="EncoderConfig.vocab_pad_multiple, as the pretraining recipes bind it",
    )
    parser.add_argument(
        "--without",
        type=_optimisations,
        default=[],
        help=f"optimisations to turn off, comma-separated, of {', '.join(OPTIMISATIONS)}",
    )
    parser.add_argument(
        "--fused_attention",
        action="store_true",
        help="attention dropout 0, so attention runs jax.nn.dot_product_attention",
    )
    parser.add_argument(
        "--dropout_prng", choices=prng.DROPOUT_PRNGS, default="threefry", help="PRNG of the dropout masks"
    )
    parser.add_argument("--scan_layers", action="store_true", help="the layers as one lax.scan")
    parser.add_argument(
        "--paired", action="store_true", help="also time the default step, alternating with this variant"
    )
    parser.add_argument(
        "--rounds", type=cli.positive_int, default=1, help="with --paired: alternate the two this many times"
    )
    parser.add_argument(
        "--compile_only",
        action="store_true",
        help="compile the init and the step, run nothing: fills the compilation cache that "
        "JAX_COMPILATION_CACHE_DIR names (what bench.suite's compile-ahead workers do)",
    )
    parser.add_argument(
        "--profile_dir",
        default=None,
        help="after timing, trace --steps more steps with jax.profiler here and summarise them",
    )
    cli.hidden_alias(parser, "--batch", batch_size)
    cli.hidden_alias(parser, "--seq", seq_len)
    cli.hidden_alias(parser, "--predictions", num_predictions)
    return parser


def _optimisations(text: str) -> list[str]:
    names = [n for n in text.split(",") if n]
    unknown = sorted(set(names) - set(OPTIMISATIONS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {unknown}: --without takes {', '.join(OPTIMISATIONS)}")
    return names


def _run(args) -> None:
    if args.fake_devices:
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.fake_devices}"
        os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    from core import compilation_cache

    # The persistent cache the environment configures (JAX_COMPILATION_CACHE_DIR: bench.suite
    # compiles ahead into it), counted so that the JSON says which compilations it served.
    directory = jax.config.jax_compilation_cache_dir or None
    if args.compile_only:
        if directory is None:
            raise UserError(
                "--compile_only: no compilation cache to fill: set JAX_COMPILATION_CACHE_DIR "
                "(bench.suite --compile_workers does)"
            )
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # short inits too
    with compilation_cache.counted(directory) as cache:
        _measure(args, cache)


def _measure(args, cache) -> None:
    import gin
    import jax

    from bench import report
    from core import optim, sharding
    from data.pipeline_config import PipelineConfig
    from models.encoder import EncoderConfig
    from pretrain import step as step_lib
    from pretrain.objectives import make_objective  # registers the objectives, models and configs

    started = time.perf_counter()
    # Before the model exists (see report.py); 0 s after the first call in a process (cached).
    peak_flops = None if args.compile_only else report.matmul_peak_flops(args.dtype)
    peak_seconds = time.perf_counter() - started
    batch_size, seq = args.batch_size, args.seq_len
    predictions = args.num_predictions or max(1, 20 * seq // 128)
    without = set(args.without)
    # The recipes' run.* settings are the trainer's (which needs TensorFlow): the benchmark
    # sets its own shape and steps.
    cli.parse_gin(cli.gin_files(args), args.gin_bindings, skip_unknown=["run"])
    partitioner = sharding.Partitioner.create(args.mesh)
    sharding.check_batch_size(batch_size, partitioner.mesh, jax.process_count())
    optimizer, schedule = optim.adamw(total_steps=10_000, learning_rate=1e-4, warmup_steps=100)
    # The gin files' data recipe (e.g. ELECTRA's in-step masking) at the benchmark's shape,
    # bound before it is built, so that its checks see the benchmark's shape.
    with gin.unlock_config():
        gin.bind_parameter("PipelineConfig.max_seq_length", seq)
        gin.bind_parameter("PipelineConfig.max_predictions_per_seq", predictions)
    pipeline_config = PipelineConfig()
    rng = jax.random.key(1)

    def build(without=frozenset(), fused_attention=False, dropout_prng="threefry", scan_layers=False):
        """(objective, rows, Steps, device batch) of one variant of our train step (the
        default step without arguments)."""
        config = dataclasses.replace(
            EncoderConfig(),
            dtype=args.dtype,
            vocab_pad_multiple=1 if "vocab_padding" in without else args.vocab_pad_multiple,
            matmul_accumulation="compute" if "f32_accumulation" in without else "float32",
            dropout_bits=32 if "dropout_bits" in without else 16,
            scan_layers=scan_layers,
        )
        if fused_attention:
            config = dataclasses.replace(config, attention_dropout_rate=0.0)
        objective = make_objective(config, pipeline_config)
        batch = report.synthetic_batch(batch_size, seq, predictions, config.vocab_size)
        if "masked_decoding" in without:
            batch = report.all_positions_batch(batch)
        batch = {k: batch[k] for k in objective.batch_spec(1, seq, predictions)}
        steps = step_lib.build(
            objective=objective,
            optimizer=optimizer,
            schedule=schedule,
            partitioner=partitioner,
            batch_size=batch_size,
            donate="donation" not in without,
            dropout_prng=dropout_prng,
        )
        with partitioner:
            device_batch = partitioner.global_batch(batch)
        return objective, batch, steps, device_batch

    def timed(steps, device_batch):
        """(step, state, device batch) for report.time_alternately."""
        last_state = {}  # the state the timed steps end with (the earlier ones were donated)

        def step(state, b):
            last_state["state"], metrics = steps.train_step(state, b, rng)
            return last_state["state"], metrics

        step.last_state = last_state
        return step, steps.states(jax.random.key(0)), device_batch

    started = time.perf_counter()
    variants = [build(without, args.fused_attention, args.dropout_prng, args.scan_layers)]
    if args.paired:
        variants.append(build())
    if args.compile_only:
        build_seconds = time.perf_counter() - started
        line = {
            "name": "ours_compiled",
            "device": jax.devices()[0].device_kind,
            "batch": batch_size,
            "seq": seq,
            "variants": len(variants),
        }
        line |= _compile_without_running([v[2:] for v in variants], partitioner, rng)
        print(
            json.dumps(line | {"build_seconds": round(build_seconds, 2), "compilation_cache": _usage(cache)})
        )
        return
    variants = [v[:2] + timed(*v[2:]) for v in variants]
    jax.block_until_ready([v[3] for v in variants])
    # Start-up beyond the step's compilation: what the suite's "overhead" column is made of.
    startup = {
        "peak_seconds": round(peak_seconds, 2),
        "build_seconds": round(time.perf_counter() - started, 2),
    }
    extra = {}
    with partitioner:
        timings = report.time_alternately([v[2:] for v in variants], args.steps, args.rounds)
        if args.profile_dir:
            started = time.perf_counter()
            step, _, device_batch = variants[0][2:]
            extra["profile"] = report.profile_steps(
                step, step.last_state["state"], device_batch, args.steps, args.profile_dir
            )
            extra["profile_seconds"] = round(time.perf_counter() - started, 2)
            print(f"profile of {args.steps} steps in {args.profile_dir}; time per XLA operation:")
            for row in extra["profile"]:
                print(f"  {row['ms_per_step']:10.1f} ms/step  {row['share']:6.1%}  {row['op']}")
    objective, batch = variants[0][:2]
    if args.paired:
        extra["default_seconds_per_step"] = round(timings[1][1], 6)
        extra["default_compile_seconds"] = round(timings[1][0], 2)
        extra["variant_over_default"] = round(timings[0][1] / timings[1][1], 4)
    print(
        report.result_line(
            "ours",
            batch=batch_size,
            seq=seq,
            real_tokens_per_row=float(batch["input_mask"].sum(1).mean()),
            flops_per_row=objective.flops_per_row(seq, predictions),
            dtype=args.dtype,
            compile_seconds=timings[0][0],
            seconds_per_step=timings[0][1],
            peak_flops=peak_flops,
            predictions=predictions,
            without=sorted(without),
            fused_attention=args.fused_attention,
            dropout_prng=args.dropout_prng,
            scan_layers=args.scan_layers,
            objective=type(objective).__name__,
            attention=objective.model_config.attention_choice(seq, dropout=True)[0],
            **startup,
            **extra,
            compilation_cache=_usage(cache),
            config=dataclasses.asdict(objective.model_config),
        )
    )


def _compile_without_running(variants, partitioner, rng) -> dict:
    """Compiles each (Steps, device batch)'s init and train step without running them or
    allocating a state; {"init_compile_seconds", "step_compile_seconds"} summed over the
    variants."""
    init_seconds = step_seconds = 0.0
    for steps, device_batch in variants:
        started = time.perf_counter()
        steps.states.compile()
        init_seconds += time.perf_counter() - started
        started = time.perf_counter()
        with partitioner:  # as the timed steps run: the mesh's axis rules shape the program
            steps.train_step.lower(steps.states.abstract, device_batch, rng).compile()
        step_seconds += time.perf_counter() - started
    return {"init_compile_seconds": round(init_seconds, 2), "step_compile_seconds": round(step_seconds, 2)}


def _usage(cache) -> dict | None:
    """The persistent compilation cache's use in this run, None without one."""
    if cache.path is None:
        return None
    return {"hits": cache.hits, "requests": cache.requests, "seconds_saved": round(cache.seconds_saved, 2)}


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
