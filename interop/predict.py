"""Fill-mask: the top-k tokens a workdir's masked LM predicts for each mask in a text (its
MLM head; ELECTRA's and DeBERTa-v3's generator; XLNet's query stream: models/trees.py
`masked_lm`).

    python -m interop.predict --workdir=W --text "Paris is the [MASK] of France." [--text ...] [--top_k=5]

The mask is written as the tokenizer's mask token ("[MASK]" for WordPiece). The text
between masks is tokenized on its own, since BERT's tokenizer would split "[MASK]" into
"[", "mask", "]". Prints, per text, the text with each mask filled by its best token,
then one line per mask: `mask K: token (probability) ...`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

import jax
import numpy as np

from core import cli
from data import pair_layout, tokenizers
from interop import bundle
from interop import encode as encode_lib
from models import trees


def masked_inputs(tokenizer: tokenizers.Tokenizer, text: str, max_seq_length: int) -> list[int]:
    """The ids of `text` as a single-text row of the tokenizer's layout (`[CLS] ... [SEP]`;
    XLNet's `... <sep> <cls>`) with each written mask token as the mask id."""
    mask = tokenizer.id_to_token(tokenizer.mask_id)
    pieces = text.split(mask)
    if len(pieces) == 1:
        raise encode_lib.EncodeError(f"--text {text!r} has no {mask} token to fill")
    ids = []
    for i, piece in enumerate(pieces):
        if i:
            ids.append(tokenizer.mask_id)
        # The space before a mask belongs to the mask (RoBERTa's "<mask>" absorbs it), the
        # space after it to the next word (byte-level BPE's "Ġword"); WordPiece ignores both.
        if i + 1 < len(pieces):
            piece = piece.rstrip()
        ids += tokenizer.encode(piece.lstrip() if i == 0 else piece)
    layout = pair_layout.get(tokenizer.pair_format)
    ids = layout.ids(ids, None, cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id)[0]
    if len(ids) > max_seq_length:
        raise encode_lib.EncodeError(
            f"--text {text[:40]!r}... is {len(ids)} tokens long; the model takes at most {max_seq_length}"
        )
    return ids


def fill_mask(
    pretrained: bundle.Pretrained, texts: Sequence[str], top_k: int
) -> list[list[list[tuple[str, float]]]]:
    """For each text, for each mask in it: the top_k (token, probability) pairs, best first."""
    rows = [masked_inputs(pretrained.tokenizer, text, pretrained.config.max_length) for text in texts]
    return fill_mask_ids(pretrained, rows, top_k)


def fill_mask_ids(
    pretrained: bundle.Pretrained, rows: Sequence[Sequence[int]], top_k: int
) -> list[list[list[tuple[str, float]]]]:
    """`fill_mask` for rows already tokenized (single-text rows of the tokenizer's layout,
    `masked_inputs`, with the mask id at the positions to fill): for each row, for each mask,
    the top_k (token, probability) pairs."""
    tokenizer = pretrained.tokenizer
    layout = pair_layout.get(tokenizer.pair_format)
    model, params = trees.masked_lm(pretrained.config, pretrained.params)
    # One batch, padded to the longest row and to the most masks of a row: one compilation.
    length = max(len(ids) for ids in rows)
    places = [layout.placement(len(ids), length) for ids in rows]
    positions = [
        [place.start + i for i, t in enumerate(ids) if t == tokenizer.mask_id]
        for ids, place in zip(rows, places)
    ]
    predictions = max(len(p) for p in positions)
    batch = {
        "input_ids": np.full((len(rows), length), tokenizer.pad_id, np.int32),
        "input_mask": np.zeros((len(rows), length), np.int32),
        "segment_ids": np.full((len(rows), length), layout.pad_segment, np.int32),
        "masked_lm_positions": np.zeros((len(rows), predictions), np.int32),
        "masked_lm_weights": np.zeros((len(rows), predictions), np.float32),
    }
    for row, (ids, place, where) in enumerate(zip(rows, places, positions)):
        batch["input_ids"][row, place] = ids
        batch["input_mask"][row, place] = 1
        batch["segment_ids"][row, place] = layout.single_segments(len(ids))
        batch["masked_lm_positions"][row, : len(where)] = where
        batch["masked_lm_weights"][row, : len(where)] = 1
    apply = jax.jit(
        lambda p, b: jax.nn.softmax(model.apply({"params": p}, b, deterministic=True)["mlm_logits"])
    )
    probs = np.asarray(apply(params, batch))  # [rows, predictions, V]
    results = []
    for row, where in enumerate(positions):
        found = probs[row, : len(where)]
        best = np.argsort(-found, axis=-1)[:, :top_k]
        results.append(
            [[(tokenizer.id_to_token(int(t)), float(p[t])) for t in ids] for ids, p in zip(best, found)]
        )
    return results


def build_parser():
    parser = cli.parser(__doc__, "interop.predict")
    parser.add_argument("--workdir", required=True, help="pretraining or imported workdir (with an MLM head)")
    parser.add_argument(
        "--text", action="append", required=True, help="text with mask tokens, e.g. [MASK] (repeatable)"
    )
    parser.add_argument("--top_k", type=cli.positive_int, default=5, help="candidates shown per mask")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    return parser


def _run(args) -> None:
    if args.top_k < 1:
        raise encode_lib.EncodeError(f"--top_k={args.top_k} must be >= 1")
    pretrained = bundle.load_pretrained(args.workdir, args.step)
    results = fill_mask(pretrained, args.text, args.top_k)
    mask = pretrained.tokenizer.id_to_token(pretrained.tokenizer.mask_id)
    for text, masks in zip(args.text, results):
        pieces = text.split(mask)
        filled = pieces[0] + "".join(f"[{m[0][0]}]{piece}" for m, piece in zip(masks, pieces[1:]))
        print(filled)
        for k, candidates in enumerate(masks, 1):
            print(f"  mask {k}: " + "  ".join(f"{token} ({p:.3f})" for token, p in candidates))


main = cli.entry(build_parser, _run)


if __name__ == "__main__":
    sys.exit(main())
