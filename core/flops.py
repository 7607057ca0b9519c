"""Model FLOPs: the matmuls a training step must run, counted the same way for every
objective, benchmark and peer (docs/performance.md).

Pure Python (no numpy, no jax), so that the peer's own virtualenv (bench/peer_hf.py)
counts with this very module. Forward matmul FLOPs per row of `seq` tokens; training is
3x forward (the backward pass costs two forward passes). Embedding lookups are gathers
(0 FLOPs), softmax, LayerNorm and other elementwise work are not counted, and neither
are the pooler and the 2-way sentence classifier (H x 2 per row: negligible).
"""

from __future__ import annotations


def encoder_layers(*, layers: int, hidden: int, intermediate: int, seq: int) -> float:
    """Forward FLOPs of `layers` Transformer layers on one row of `seq` tokens.

    Per layer: q, k, v and output projections 4 * (2 s h h), the FFN 2 * (2 s h f), and
    attention's two [s, s] products 2 * (2 s s h). Layers that share parameters (ALBERT)
    still run, so sharing changes nothing here.
    """
    h, f, s = hidden, intermediate, seq
    return float(layers * (2 * s * (4 * h * h + 2 * h * f) + 4 * s * s * h))


def embedding_projection(*, embedding: int, hidden: int, seq: int) -> float:
    """Forward FLOPs of ALBERT's E -> H projection (0 when the embedding is not factorized)."""
    return 0.0 if embedding == hidden else float(2 * seq * embedding * hidden)


def mlm_head(*, hidden: int, embedding: int, vocab: int, predictions: int) -> float:
    """Forward FLOPs of BERT's MLM head at `predictions` masked positions: the H -> E
    transform and the tied [E, V] decoder (E = H unless factorized). A head that decodes
    every position does L instead of P times this work, and gets no credit for it."""
    return float(2 * predictions * (hidden * embedding + embedding * vocab))


def training(forward: float) -> float:
    """Training FLOPs of a forward pass: forward + backward = 3x forward."""
    return 3.0 * forward


def bert_pretraining(
    *,
    hidden: int,
    layers: int,
    intermediate: int,
    vocab: int,
    seq: int,
    predictions: int,
    embedding: int | None = None,
) -> float:
    """Training FLOPs per row of BERT-style MLM pretraining (BERT, RoBERTa, ALBERT):

        F = 3 * [L * (2*s*(4*h*h + 2*h*f) + 4*s*s*h) + 2*s*E*h (if E != h) + 2*P*(h*E + E*V)]

    BERT-base at s = 128, P = 20: about 70 GFLOP per row.
    """
    e = hidden if embedding is None else embedding
    return training(
        encoder_layers(layers=layers, hidden=hidden, intermediate=intermediate, seq=seq)
        + embedding_projection(embedding=e, hidden=hidden, seq=seq)
        + mlm_head(hidden=hidden, embedding=e, vocab=vocab, predictions=predictions)
    )
