r"""CLI: parameter count and training FLOPs of a pretraining recipe's model.

    python -m pretrain.summary --gin_file=configs/models/bert_base.gin \
        [--gin_file=configs/recipes/roberta.gin] [--gin_bindings='EncoderConfig.num_layers = 6'] \
        [--seq_len=128] [--num_predictions=20]

The model is the one the gin files' objective trains (`make_objective.objective`, default
the MLM objective) with the files' EncoderConfig and PipelineConfig: a model size file alone gives
BERT's MLM + NSP model; add a recipe for its objective and heads (RoBERTa's has no sentence
head). Prints, one per line:

    seq_len: L                     the shape the FLOPs are counted for ...
    predictions_per_sequence: P    ... (the masked positions decoded per row)
    params: N                      the whole pretraining tree (every head of the objective)
    encoder_params: N              the `encoder` subtree (what fine-tuning uses)
    train_flops_per_token: X       the objective's training FLOPs per row / seq_len
    train_gflops_per_sequence: X   (core/flops.py: the matmuls actually run, fwd + bwd)

--seq_len and --num_predictions default to the PipelineConfig's length and predictions.
Shapes come from jax.eval_shape, so even the largest config allocates nothing. A config
error prints one `error: ...` line on stderr and exits with status 2.
"""

from __future__ import annotations

import dataclasses
import sys

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from core import cli


def build_parser():
    parser = cli.parser(__doc__, "pretrain.summary")
    cli.add_gin_flags(parser, example="EncoderConfig.num_layers = 6")
    parser.add_argument(
        "--seq_len",
        type=cli.positive_int,
        default=None,
        help="tokens per row, s (default: PipelineConfig.max_seq_length)",
    )
    parser.add_argument(
        "--num_predictions",
        type=int,
        default=None,
        help="masked positions per row, P (default: PipelineConfig.max_predictions_per_seq)",
    )
    return parser


def _run(args) -> None:
    import jax

    from core.state import count_params
    from data.pipeline_config import PipelineConfig
    from models.encoder import EncoderConfig
    from pretrain import trainer  # noqa: F401  (registers what run and recipe files bind)
    from pretrain.objectives import make_objective

    # Run and recipe files also bind the trainer's settings (data_dir, steps, ...); only
    # the objective, the model and the data recipe are read here.
    cli.parse_gin(cli.gin_files(args), args.gin_bindings)
    pipeline_config = PipelineConfig()
    overrides = {}
    if args.seq_len is not None:
        overrides["max_seq_length"] = args.seq_len
    if args.num_predictions is not None:
        overrides["max_predictions_per_seq"] = args.num_predictions
    elif args.seq_len is not None:
        overrides["max_predictions_per_seq"] = None  # derived from the new length
    pipeline_config = dataclasses.replace(pipeline_config, **overrides)
    model_config = EncoderConfig()
    model_config.check_length(pipeline_config.max_seq_length, "--seq_len")
    objective = make_objective(model_config, pipeline_config)
    params = jax.eval_shape(objective.init, jax.random.key(0))
    seq, predictions = pipeline_config.max_seq_length, pipeline_config.max_predictions_per_seq
    flops = objective.flops_per_row(seq, predictions)
    print(f"seq_len: {seq}")
    print(f"predictions_per_sequence: {predictions}")
    print(f"params: {count_params(params)}")
    print(f"encoder_params: {count_params(params['encoder'])}")
    print(f"train_flops_per_token: {flops / seq:.6g}")
    print(f"train_gflops_per_sequence: {flops / 1e9:.6g}")


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
