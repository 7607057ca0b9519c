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


def span_boundary_head(
    *, hidden: int, embedding: int, vocab: int, predictions: int, position_width: int
) -> float:
    """Forward FLOPs of SpanBERT's SBO head at `predictions` span tokens: dense
    (2H + W) -> H, dense H -> E, the tied [E, V] decoder."""
    return float(
        2 * predictions * ((2 * hidden + position_width) * hidden + hidden * embedding + embedding * vocab)
    )


def discriminator_head(*, hidden: int, seq: int) -> float:
    """Forward FLOPs of ELECTRA's discriminator head at every position: dense H -> H, dense H -> 1."""
    return float(2 * seq * (hidden * hidden + hidden))


def electra_pretraining(
    *,
    hidden: int,
    layers: int,
    intermediate: int,
    generator_hidden: int,
    generator_layers: int,
    generator_intermediate: int,
    vocab: int,
    seq: int,
    predictions: int,
    embedding: int,
) -> float:
    """Training FLOPs per row of ELECTRA (generator + discriminator, one shared embedding
    table of width `embedding`):

        generator     = bert_pretraining(generator_hidden, ..., embedding)  (its own E -> H_g
                        projection, MLM head at the P masked positions)
        discriminator = 3 * [L * layer(hidden) + 2*s*E*h (if E != h) + 2*s*(h*h + h)]

    Sampling (a Gumbel-max over V at P positions) is elementwise: not counted.
    """
    generator = bert_pretraining(
        hidden=generator_hidden,
        layers=generator_layers,
        intermediate=generator_intermediate,
        vocab=vocab,
        seq=seq,
        predictions=predictions,
        embedding=embedding,
    )
    discriminator = training(
        encoder_layers(layers=layers, hidden=hidden, intermediate=intermediate, seq=seq)
        + embedding_projection(embedding=embedding, hidden=hidden, seq=seq)
        + discriminator_head(hidden=hidden, seq=seq)
    )
    return generator + discriminator


def relative_terms(*, layers: int, hidden: int, seq: int, span: int, terms: int) -> float:
    """Forward FLOPs of DeBERTa's disentangled attention on top of BERT's, per row: each
    relative term (c2p, p2c) is a [s, N, D] x [2S, N, D] product, 2 * s * 2S * h per layer.
    Projecting the [2S, H] relative table happens once per batch, not per row: not counted."""
    return float(layers * terms * 2 * seq * 2 * span * hidden)


def enhanced_mask_decoder(
    *, hidden: int, intermediate: int, seq: int, predictions: int, span: int, c2p: bool, p2c: bool
) -> float:
    """Forward FLOPs of DeBERTa's enhanced mask decoder, per row: the last layer twice with
    P query rows over the s key rows of that layer's input. Keys and values are the same in
    both passes (the same weights on the same states): 2 * (2 s h h) once, and the p2c
    product over every key (2 s 2S h) once. Per pass: query and output projections
    2 * (2 P h h), FFN 2 * (2 P h f), scores and context 2 * (2 P s h), c2p 2 P 2S h."""
    h, f, s, p, r = hidden, intermediate, seq, predictions, 2 * span
    shared = 4 * s * h * h + (2 * s * r * h if p2c else 0)
    one_pass = 4 * p * h * h + 4 * p * h * f + 4 * p * s * h + (2 * p * r * h if c2p else 0)
    return float(shared + 2 * one_pass)


def deberta_pretraining(
    *,
    hidden: int,
    layers: int,
    intermediate: int,
    vocab: int,
    seq: int,
    predictions: int,
    span: int,
    c2p: bool,
    p2c: bool,
    embedding: int | None = None,
    last_layer_output_used: bool = False,
) -> float:
    """Training FLOPs per row of DeBERTa's MLM through the enhanced mask decoder: BERT's count
    (`bert_pretraining`) with the relative terms in every layer, the decoder's two passes,
    and, unless `last_layer_output_used` (a sentence head reads the pooler), without the
    encoder's own last layer, whose output nothing reads (XLA drops it)."""
    terms = int(c2p) + int(p2c)
    stack = layers if last_layer_output_used else layers - 1
    extra = relative_terms(layers=stack, hidden=hidden, seq=seq, span=span, terms=terms)
    extra += enhanced_mask_decoder(
        hidden=hidden,
        intermediate=intermediate,
        seq=seq,
        predictions=predictions,
        span=span,
        c2p=c2p,
        p2c=p2c,
    )
    return training(extra) + bert_pretraining(
        hidden=hidden,
        layers=stack,
        intermediate=intermediate,
        vocab=vocab,
        seq=seq,
        predictions=predictions,
        embedding=embedding,
    )


def xlnet_pretraining(
    *, hidden: int, layers: int, intermediate: int, vocab: int, seq: int, memory: int, predictions: int
) -> float:
    """Training FLOPs per row of XLNet's permutation LM with Transformer-XL memory.

    Per layer, the content stream over the row's s tokens attends to K = memory + s keys:
    q and output projections 2 * (2 s h h), k and v of every key 2 * (2 K h h) (the memory
    holds hidden states, projected again each step), the relative-position projection of
    the R = K + s distances (2 R h h, per row: each row has its direction), the FFN
    2 * (2 s h f), and the products q.k, q.k_r, probs.v: 2 s h (2K + R). The query stream
    at the P targets: its q and output projections, FFN and products against the same keys
    (P in place of s, k and v shared). Then the tied LM head at the targets, 2 P h V."""
    h, f, s, p = hidden, intermediate, seq, predictions
    k = memory + s
    r = k + s
    query = 2 * p * (2 * h * h + 2 * h * f) + 2 * p * h * (2 * k + r)
    content = xlnet_content_stream(hidden=h, layers=layers, intermediate=f, seq=s, memory=memory)
    return training(content + layers * query + 2 * p * h * vocab)


def xlnet_content_stream(*, hidden: int, layers: int, intermediate: int, seq: int, memory: int) -> float:
    """Forward FLOPs per row of XLNet's content stream over s tokens and `memory` memory
    positions (`xlnet_pretraining`'s content part; with memory 0, XLNet's encoder as a
    masked LM's or a fine-tuned model's)."""
    h, f, s = hidden, intermediate, seq
    k = memory + s
    r = k + s
    per_layer = 2 * s * (2 * h * h + 2 * h * f) + 2 * 2 * k * h * h + 2 * r * h * h + 2 * s * h * (2 * k + r)
    return float(layers * per_layer)


# --- the ELECTRA paper's count (google-research/electra flops_computation.py) ---------------
# Reported beside ours when comparing with the paper's tables. It differs from ours on
# purpose: training is 2x forward (not 3x), embedding lookups are dense one-hot matmuls,
# the MLM head is charged for output_frac of the positions, and elementwise work
# (softmax, LayerNorm, GELU, dropout) is counted with the per-element costs below.
_PAPER_DROPOUT, _PAPER_LAYER_NORM, _PAPER_ACTIVATION, _PAPER_SOFTMAX = 4, 5, 8, 5


def _paper_block(h: int, s: int, i: int, heads: int) -> float:
    """One Transformer layer's forward FLOPs on s tokens (TransformerHparams.get_block_flops)."""
    per_token = (
        3 * 2 * h * h  # q, k, v
        + 3 * h  # their biases
        + 2 * h * s  # attention scores
        + (_PAPER_SOFTMAX + _PAPER_DROPOUT + 1) * s * heads  # softmax, dropout, scale
        + 2 * h * s  # weighted sum of the values
        + 2 * h * h
        + h
        + _PAPER_DROPOUT * h
        + h  # output projection, bias, dropout, residual
        + _PAPER_LAYER_NORM  # the script charges the attention LayerNorm 5, not 5 h
        + 2 * h * i
        + _PAPER_ACTIVATION * i
        + i  # intermediate, GELU, bias
        + 2 * h * i
        + h
        + _PAPER_DROPOUT * h
        + h
        + _PAPER_LAYER_NORM * h  # output ... LayerNorm
    )
    return float(per_token * s)


def _paper_embedding(h: int, s: int, v: int, e: int, output: bool, output_frac: float) -> float:
    """Input embeddings (dense lookups) or the MLM output head (get_embedding_flops)."""
    per_token = 2 * e * v
    if not output:
        per_token += 2 * e * (s + 2) + 2 * e + _PAPER_LAYER_NORM * e + _PAPER_DROPOUT * e
        if e != h:
            per_token += 2 * h * e + h
        return float(per_token * s)
    per_token += 2 * h * e + e + _PAPER_ACTIVATION * e + _PAPER_LAYER_NORM * e + _PAPER_SOFTMAX * v + 2 * v
    return output_frac * per_token * s


def paper_train(
    *,
    hidden: int,
    layers: int,
    seq: int,
    vocab: int = 30522,
    embedding: int | None = None,
    discriminator: bool = False,
    output_frac: float = 0.15625,
) -> float:
    """Training FLOPs per row as flops_computation.py counts them (TransformerHparams with
    its defaults: FFN 4h, max(1, h // 64) heads; `get_train_flops` for batch 1, 1 step): a
    masked LM, or with `discriminator` the per-position binary head instead of the MLM head."""
    h, s, v = hidden, seq, vocab
    e = h if embedding is None else embedding
    body = layers * _paper_block(h, s, 4 * h, max(h // 64, 1)) + _paper_embedding(
        h, s, v, e, False, output_frac
    )
    if discriminator:
        head = float((2 * h * h + h + _PAPER_ACTIVATION * h + 2 * h) * s)
    else:
        head = _paper_embedding(h, s, v, e, True, output_frac)
    return 2.0 * (body + head)


def paper_electra_train(
    *,
    hidden: int,
    layers: int,
    generator_hidden: int,
    generator_layers: int,
    seq: int,
    vocab: int = 30522,
    embedding: int | None = None,
    output_frac: float = 0.15625,
) -> float:
    """ELECTRA's training FLOPs per row by flops_computation.py (get_electra_train_flops with
    tied embeddings): discriminator + generator, both with the discriminator's embedding width."""
    e = hidden if embedding is None else embedding
    disc = paper_train(
        hidden=hidden,
        layers=layers,
        seq=seq,
        vocab=vocab,
        embedding=e,
        discriminator=True,
        output_frac=output_frac,
    )
    gen = paper_train(
        hidden=generator_hidden,
        layers=generator_layers,
        seq=seq,
        vocab=vocab,
        embedding=e,
        output_frac=output_frac,
    )
    return disc + gen
