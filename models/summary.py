"""CLI: parameter count and training FLOPs of a model config.

    python -m models.summary --gin_file=configs/models/bert_base.gin \
        [--gin_bindings='EncoderConfig.num_layers = 6'] [--seq_len=128] [--num_predictions=20] \
        [--nosentence_objective]

Prints, one per line: `params: N` (the pretraining model, with the NSP/SOP head unless
--nosentence_objective: RoBERTa has none; it is 2 * (H + 1) parameters),
`train_flops_per_token: X`, `train_gflops_per_sequence: X` (the matmuls actually run,
forward + backward: models/pretraining.py `flops_per_sequence`)
and `encoder_params: N` (without the heads). Shapes come from jax.eval_shape, so
even the largest config allocates nothing. A config error prints one
`error: ...` line on stderr and exits with status 2.
"""

from __future__ import annotations

import sys

import gin
from absl import app, flags

from models.encoder import EncoderConfig
from models.pretraining import abstract_params, count_params, flops_per_sequence

_GIN_FILE = flags.DEFINE_multi_string("gin_file", [], "Gin files to parse, in order.")
_GIN_BINDINGS = flags.DEFINE_multi_string("gin_bindings", [], "Extra gin bindings, applied last.")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 128, "Tokens per sequence (s in the FLOPs formula).")
_NUM_PREDICTIONS = flags.DEFINE_integer("num_predictions", 20, "Masked positions per sequence (P).")
_SENTENCE_OBJECTIVE = flags.DEFINE_boolean(
    "sentence_objective", True, "Count the NSP/SOP head (BERT, ALBERT); --nosentence_objective for RoBERTa."
)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        # skip_unknown: recipe and run files also bind the trainer's configurables, which
        # this tool does not import; a typo in an EncoderConfig binding is still an error.
        gin.parse_config_files_and_bindings(_GIN_FILE.value, _GIN_BINDINGS.value, skip_unknown=True)
        config = EncoderConfig()
        if not 1 <= _SEQ_LEN.value <= config.max_length:
            raise ValueError(
                f"--seq_len={_SEQ_LEN.value} is outside [1, {config.max_length}] "
                f"(max_position_embeddings={config.max_position_embeddings} - "
                f"position_offset={config.position_offset})"
            )
    # Anything raised while reading the config is a config error, whatever its type
    # (gin raises ValueError, SyntaxError, OSError, tokenize.TokenError, ...).
    except Exception as e:  # pylint: disable=broad-except
        print("error: " + " ".join(str(e).split()), file=sys.stderr)
        sys.exit(2)
    params = abstract_params(config, sentence_objective=_SENTENCE_OBJECTIVE.value)
    flops = flops_per_sequence(config, _SEQ_LEN.value, _NUM_PREDICTIONS.value)
    print(f"params: {count_params(params)}")
    print(f"train_flops_per_token: {flops / _SEQ_LEN.value:.6g}")
    print(f"train_gflops_per_sequence: {flops / 1e9:.6g}")
    print(f"encoder_params: {count_params(params['encoder'])}")


if __name__ == "__main__":
    app.run(main)
