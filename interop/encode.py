r"""Feature extraction: a workdir's encoder over lines of text -> an npz of hidden states.

    python -m interop.encode --workdir=W --input=FILE.txt --output=OUT.npz \
        [--seq_len=128] [--batch_size=32] [--step=N]

Each line of FILE.txt is one sentence, or a sentence pair separated by a tab. Inputs are
built as in BERT: `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`, segment ids 0 for A and 1
for B, the longer side trimmed from its end until the pair fits (`truncate_seq_pair`).
A RoBERTa tokenizer (`pair_format` "roberta") gives RoBERTa's pair format instead,
`<s> A </s></s> B </s>` with segment ids all 0, and an XLNet tokenizer XLNet's, `A <sep> B
<sep> <cls>` with segment ids 0, 1, 2 (data/pair_layout.py). Rows are padded to the longest
row (at most max_seq_length): on the right, or on the left for XLNet (segment id 4), whose
classification token is last.

OUT.npz holds `input_ids`, `attention_mask`, `token_type_ids` [n, L] int32 and
`last_hidden_state` [n, L, H] float32 (padding rows included: mask them out with
attention_mask), plus `pooled_output` [n, H] float32 when the model has a pooler (an
imported model without one, e.g. from BertForMaskedLM, has none). The names are those of
HF transformers' outputs, so parity with another implementation is one np.abs(a - b).max().
"""

from __future__ import annotations

import dataclasses
import functools
import io
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

import jax
import jax.numpy as jnp
import numpy as np
import tensorflow as tf

from core import cli
from core.errors import UserError
from data import pair_layout, tokenizers
from interop import bundle
from models.backbone import encoder_module
from models.encoder import EncoderConfig


class EncodeError(UserError):
    """Bad input to the encode / predict CLIs (one line, user-facing)."""


def has_pooler(params: Mapping[str, Any]) -> bool:
    return "pooler" in params["encoder"]


@functools.partial(jax.jit, static_argnums=0)
def encode_arrays(
    config: EncoderConfig, params: Any, input_ids: jax.Array, input_mask: jax.Array, segment_ids: jax.Array
) -> tuple[jax.Array, jax.Array | None]:
    """The encoder's outputs: ([B, L, H], [B, H] or None without a pooler) float32 for
    [B, L] int32 inputs; no dropout."""
    out = encoder_module(config).apply(
        {"params": params}, input_ids, input_mask, segment_ids, deterministic=True
    )
    pooled = None if out.pooled_output is None else out.pooled_output.astype(jnp.float32)
    return out.sequence_output.astype(jnp.float32), pooled


def build_inputs(
    tokenizer: tokenizers.Tokenizer, texts: Sequence[str], max_seq_length: int
) -> dict[str, np.ndarray]:
    """Model inputs for lines of text ("A" or "A<TAB>B"): input_ids, attention_mask,
    token_type_ids [n, L] int32, L = the longest row (<= max_seq_length), in the
    tokenizer's `pair_format` (`tokenizers.pair_inputs`)."""
    rows = []
    for line in texts:
        a_text, tab, b_text = line.partition("\t")
        b = tokenizer.encode(b_text) if tab else None
        rows.append(tokenizers.pair_inputs(tokenizer, tokenizer.encode(a_text), b, max_seq_length)[:2])
    length = max(len(ids) for ids, _ in rows)
    layout = pair_layout.get(tokenizer.pair_format)
    out = {
        "input_ids": np.full((len(rows), length), tokenizer.pad_id, np.int32),
        "attention_mask": np.zeros((len(rows), length), np.int32),
        "token_type_ids": np.full((len(rows), length), layout.pad_segment, np.int32),
    }
    for i, (ids, segment) in enumerate(rows):
        place = layout.placement(len(ids), length)
        out["input_ids"][i, place] = ids
        out["attention_mask"][i, place] = 1
        out["token_type_ids"][i, place] = segment
    return out


def encode(
    pretrained: bundle.Pretrained, inputs: Mapping[str, np.ndarray], batch_size: int = 32
) -> dict[str, np.ndarray]:
    """`inputs` (from build_inputs) plus last_hidden_state [n, L, H] and, with a pooler,
    pooled_output [n, H], float32. The last batch is padded to `batch_size` (one compilation)."""
    # Whether the parameters have a pooler decides (an imported BertForMaskedLM has none).
    config = dataclasses.replace(pretrained.config, pooler=has_pooler(pretrained.params))
    params = pretrained.params["encoder"]
    n = len(inputs["input_ids"])
    sequences, pooled = [], []
    for start in range(0, n, batch_size):
        chunk = {k: v[start : start + batch_size] for k, v in inputs.items()}
        rows = len(chunk["input_ids"])
        chunk = {k: np.pad(v, ((0, batch_size - rows), (0, 0))) for k, v in chunk.items()}
        seq, pool = encode_arrays(
            config, params, chunk["input_ids"], chunk["attention_mask"], chunk["token_type_ids"]
        )
        sequences.append(np.asarray(seq)[:rows])
        if config.pooler:
            pooled.append(np.asarray(pool)[:rows])
    out = {**inputs, "last_hidden_state": np.concatenate(sequences)}
    if config.pooler:
        out["pooled_output"] = np.concatenate(pooled)
    return out


def read_lines(path: str) -> list[str]:
    if not tf.io.gfile.exists(path):
        raise EncodeError(f"--input '{path}' not found: pass a text file, one sentence (or A<TAB>B) per line")
    with tf.io.gfile.GFile(path, "rb") as f:
        try:
            text = f.read().decode("utf-8")
        except UnicodeDecodeError as e:
            raise EncodeError(
                f"{path}: not valid UTF-8 (byte offset {e.start}): re-encode it as UTF-8"
            ) from None
    lines = [line.rstrip("\r") for line in text.split("\n") if line.strip()]
    if not lines:
        raise EncodeError(f"{path}: no non-empty lines to encode")
    return lines


def build_parser():
    parser = cli.parser(__doc__, "interop.encode")
    parser.add_argument("--workdir", required=True, help="pretraining or imported workdir")
    parser.add_argument("--input", required=True, help="text file: one sentence or A<TAB>B per line")
    parser.add_argument("--output", required=True, help="npz file to write")
    seq_len = parser.add_argument(
        "--seq_len",
        type=cli.positive_int,
        default=None,
        help="tokens per row (default: 128, or the model's limit)",
    )
    parser.add_argument("--batch_size", type=cli.positive_int, default=32, help="rows per forward pass")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    cli.hidden_alias(parser, "--max_seq_length", seq_len)
    return parser


def _run(args) -> None:
    pretrained = bundle.load_pretrained(args.workdir, args.step)
    config = pretrained.config
    max_seq_length = min(128, config.max_length) if args.seq_len is None else args.seq_len
    if max_seq_length < 3:
        raise EncodeError(f"--seq_len={max_seq_length} is too short: a row needs [CLS], [SEP] and text")
    config.check_length(max_seq_length, "--seq_len")
    inputs = build_inputs(pretrained.tokenizer, read_lines(args.input), max_seq_length)
    out = encode(pretrained, inputs, args.batch_size)
    buffer = io.BytesIO()  # zipfile seeks, which a GFile opened for writing cannot
    np.savez(buffer, **out)
    with tf.io.gfile.GFile(args.output, "wb") as f:
        f.write(buffer.getvalue())
    n, length, hidden = out["last_hidden_state"].shape
    print(f"wrote {args.output}: {n} rows, length {length}, hidden {hidden} ({', '.join(sorted(out))})")


main = cli.entry(build_parser, _run)


if __name__ == "__main__":
    sys.exit(main())
