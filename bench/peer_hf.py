r"""The peer: HF transformers' Flax BERT pretraining step, timed like bench/pretrain.py.

Runs in its own virtualenv (`make bench-peer-venv`: transformers==4.57.6, the last
release with Flax models, with our jax/flax/optax pins); never import it from ours.

    .venv-peer/bin/python -m bench.peer_hf --model='{"vocab_size": 30522, ...}' \
        --batch_size=32 --seq_len=128 --num_predictions=20 [--dtype=bfloat16] [--steps=10]

`--model` is our EncoderConfig as JSON (bench/compare.py passes it), so both sides
train the identical architecture. The step is what HF's examples/flax
run_mlm_flax.py does (FlaxBertForPreTraining, logits for all [B, L, V] positions,
softmax cross-entropy on a one-hot of the labels with a label mask, summed and divided
by the label count), plus the NSP cross-entropy mean, optax AdamW with the
LayerNorm/bias no-decay mask, jit with the state donated. Same synthetic rows and
masked positions as ours (bench/report.py), same JSON result line.
"""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

from bench import report
from core import cli, flops
from core.errors import UserError


class PeerVenvError(UserError):
    """Run outside the peer's virtualenv (transformers without Flax models)."""


def build_parser():
    parser = cli.parser(__doc__, "bench.peer_hf")
    parser.add_argument(
        "--model", required=True, help="our EncoderConfig as JSON (bench/compare.py passes it)"
    )
    batch_size = parser.add_argument(
        "--batch_size", type=cli.positive_int, default=32, help="global batch (rows)"
    )
    seq_len = parser.add_argument("--seq_len", type=cli.positive_int, default=128, help="sequence length")
    num_predictions = parser.add_argument(
        "--num_predictions", type=cli.positive_int, default=20, help="masked positions per row"
    )
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="compute dtype")
    parser.add_argument(
        "--steps", type=cli.positive_int, default=10, help="timed steps after compilation and 2 warm-up steps"
    )
    cli.hidden_alias(parser, "--batch", batch_size)
    cli.hidden_alias(parser, "--seq", seq_len)
    cli.hidden_alias(parser, "--predictions", num_predictions)
    return parser


def _run(args) -> None:
    try:  # transformers 5 (our test venv) has no Flax models: only the peer venv's 4.57.6 does
        from transformers import BertConfig, FlaxBertForPreTraining
    except ImportError:
        raise PeerVenvError(
            "bench.peer_hf needs transformers==4.57.6 (Flax models): run `make bench-peer-venv`, "
            "then .venv-peer/bin/python -m bench.peer_hf"
        ) from None
    peak_flops = report.matmul_peak_flops(args.dtype)  # before the model exists: see report.py
    ours = json.loads(args.model)
    config = BertConfig(
        vocab_size=ours["vocab_size"],
        hidden_size=ours["hidden_size"],
        num_hidden_layers=ours["num_layers"],
        num_attention_heads=ours["num_heads"],
        intermediate_size=ours["intermediate_size"],
        max_position_embeddings=ours["max_position_embeddings"],
        type_vocab_size=ours["type_vocab_size"],
        hidden_dropout_prob=ours["dropout_rate"],
        attention_probs_dropout_prob=ours["attention_dropout_rate"],
        hidden_act=ours["hidden_act"],
        layer_norm_eps=ours["layer_norm_eps"],
    )
    model = FlaxBertForPreTraining(config, seed=0, dtype=jnp.dtype(args.dtype))

    batch = report.synthetic_batch(args.batch_size, args.seq_len, args.num_predictions, config.vocab_size)
    labels = np.zeros_like(batch["input_ids"])  # 0 = not predicted (the example's label mask is labels > 0)
    np.put_along_axis(labels, batch["masked_lm_positions"], batch["masked_lm_ids"], axis=1)
    inputs = {
        "input_ids": jnp.asarray(batch["input_ids"]),
        "attention_mask": jnp.asarray(batch["input_mask"]),
        "token_type_ids": jnp.asarray(batch["segment_ids"]),
        "labels": jnp.asarray(labels),
        "next_sentence_label": jnp.asarray(batch["sentence_label"]),
    }

    def decay_mask(params):  # run_mlm_flax.py's mask
        flat = traverse_util.flatten_dict(params)
        return traverse_util.unflatten_dict(
            {path: path[-1] != "bias" and path[-2:] not in [("LayerNorm", "scale")] for path in flat}
        )

    schedule = optax.linear_schedule(0.0, 1e-4, 100)
    optimizer = optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=decay_mask)
    state = {"params": model.params, "opt_state": optimizer.init(model.params), "rng": jax.random.key(0)}

    def train_step(state, inputs):
        dropout_rng, next_rng = jax.random.split(state["rng"])

        def loss_fn(params):
            outputs = model(
                inputs["input_ids"],
                attention_mask=inputs["attention_mask"],
                token_type_ids=inputs["token_type_ids"],
                params=params,
                dropout_rng=dropout_rng,
                train=True,
            )
            logits = outputs.prediction_logits
            label_mask = jnp.where(inputs["labels"] > 0, 1.0, 0.0)
            onehot = jax.nn.one_hot(inputs["labels"], logits.shape[-1])
            mlm = (optax.softmax_cross_entropy(logits, onehot) * label_mask).sum() / label_mask.sum()
            nsp = optax.softmax_cross_entropy_with_integer_labels(
                outputs.seq_relationship_logits, inputs["next_sentence_label"]
            ).mean()
            return mlm + nsp

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt_state": opt_state, "rng": next_rng}, loss

    step = jax.jit(train_step, donate_argnums=0)
    compile_seconds, seconds = report.time_steps(step, state, inputs, args.steps)
    print(
        report.result_line(
            "peer_hf_flax",
            batch=args.batch_size,
            seq=args.seq_len,
            real_tokens_per_row=float(batch["input_mask"].sum(1).mean()),
            # Credited with the same model FLOPs as ours: its extra [B, L, V] work gets no credit.
            flops_per_row=flops.bert_pretraining(
                hidden=ours["hidden_size"],
                layers=ours["num_layers"],
                intermediate=ours["intermediate_size"],
                vocab=ours["vocab_size"],
                seq=args.seq_len,
                predictions=args.num_predictions,
                embedding=ours.get("embedding_size"),
            ),
            dtype=args.dtype,
            compile_seconds=compile_seconds,
            seconds_per_step=seconds,
            peak_flops=peak_flops,
            predictions=args.num_predictions,
        )
    )


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
