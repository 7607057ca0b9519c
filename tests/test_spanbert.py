"""SpanBERT (data/masking.py mask_spans, models/heads.py SpanBoundaryHead,
pretrain/objectives/span_boundary.py): span statistics over many rows against a transcription
of facebookresearch/SpanBERT's masking code, the SBO pairs and targets exactly as the original
picks them, the head against a PyTorch transcription of `BertPairTargetPredictionHead`, the
loss, the schedule, the pipeline's rows, and mesh / microbatch / resume equality."""

import dataclasses
import math

import flax
import jax
import numpy as np
import pytest
import tensorflow as tf

from core import optim
from core.errors import ConfigError
from data import masking, pipeline, preprocess, shards, tokenizers
from data.pipeline_config import PipelineConfig
from models.encoder import EncoderConfig
from pretrain.objectives import SpanBoundary
from tests import jitted, mesh_training, tiny

CLS, SEP, PAD, MASK = 2, 3, 0, 4
VOCAB = 400
# Ids 100..399: even ids begin a word, odd ids continue one, so rows have words of 1+ pieces.
WORD_STARTS = np.arange(VOCAB) % 2 == 0
# A skewed unigram distribution over the text ids (specials never occur in text).
COUNTS = np.zeros(VOCAB, np.int64)
COUNTS[100:] = (np.arange(300) % 7 + 1) ** 2


def _block(rng, n, continue_prob=0.4):
    """n word pieces (the original's block), words of one or more pieces."""
    ids = []
    for _ in range(n):
        start = not ids or rng.random() > continue_prob
        ids.append(int(rng.integers(50, 200)) * 2 + (0 if start else 1))
    return ids


def _row(block, length):
    tokens = [CLS, *block, SEP]
    return {
        "input_ids": tf.constant(tokens + [PAD] * (length - len(tokens)), tf.int32),
        "input_mask": tf.constant([1] * len(tokens) + [0] * (length - len(tokens)), tf.int32),
    }


def _mask(row, seed, prob=0.15, cap=None, max_targets=15, eager=False):
    length = row["input_ids"].shape[0]
    mask = _mask_graph.python_function if eager else _mask_graph
    return mask(row, tf.cast(seed, tf.int64), prob, cap or length, max_targets)


# A graph (traced once per row length and setting), as the pipeline runs it: eagerly, the
# statistics tests' thousand rows cost a minute.
@tf.function
def _mask_graph(row, seed, prob, cap, max_targets):
    return masking.mask_spans(
        row,
        seed=tf.stack([seed, tf.constant(11, tf.int64)]),
        mask_id=MASK,
        never_mask_ids=(CLS, SEP),
        masked_lm_prob=prob,
        max_predictions_per_seq=cap,
        word_starts=tf.constant(WORD_STARTS),
        unigram_counts=tf.constant(COUNTS),
        max_pair_targets=max_targets,
    )


def _numpy(out):
    return {k: v.numpy() for k, v in out.items()}


def _runs(positions):
    """Maximal runs of consecutive positions -> [(start, end)] inclusive."""
    runs = []
    for p in sorted(positions):
        if runs and runs[-1][1] + 1 == p:
            runs[-1][1] = p
        else:
            runs.append([p, p])
    return [tuple(r) for r in runs]


# ---- transcription of facebookresearch/SpanBERT pretraining/fairseq/data/masking.py ------


def _original_spans(block, word_starts, mask_ratio, np_rng, p=0.2, lower=1, upper=10):
    """PairWithSpanMaskingScheme.mask's selection (tagmap None), on a block (no [CLS]/[SEP]):
    returns (mask set, spans list before merging)."""
    lens = list(range(lower, upper + 1))
    len_distrib = [p * (1 - p) ** (i - lower) for i in range(lower, upper + 1)]
    len_distrib = [x / sum(len_distrib) for x in len_distrib]
    word_piece_map = [bool(word_starts[t]) for t in block]
    word_piece_map[0] = True  # ParagraphInfo.get_word_start stops at 0 whatever the piece

    def word_start(anchor):
        left = anchor
        while left > 0 and not word_piece_map[left]:
            left -= 1
        return left

    def word_end(anchor):
        right = anchor + 1
        while right < len(block) and not word_piece_map[right]:
            right += 1
        return right

    sent_length = len(block)
    mask_num = math.ceil(sent_length * mask_ratio)
    mask, spans = set(), []
    while len(mask) < mask_num:
        span_len = np_rng.choice(lens, p=len_distrib)
        anchor = np_rng.choice(sent_length)
        if anchor in mask:
            continue
        left1, right1 = word_start(anchor), word_end(anchor)
        spans.append([left1, left1])
        for i in range(left1, right1):
            if len(mask) >= mask_num:
                break
            mask.add(i)
            spans[-1][-1] = i
        num_words, right2 = 1, right1
        while num_words < span_len and right2 < len(block) and len(mask) < mask_num:
            left2, right2 = right2, word_end(right2)
            num_words += 1
            for i in range(left2, right2):
                if len(mask) >= mask_num:
                    break
                mask.add(i)
                spans[-1][-1] = i
    return mask, spans


def _original_merge_intervals(intervals):
    intervals = sorted(intervals, key=lambda x: x[0])
    merged = []
    for interval in intervals:
        if not merged or merged[-1][1] + 1 < interval[0]:
            merged.append(list(interval))
        else:
            merged[-1][1] = max(merged[-1][1], interval[1])
    return merged


def _original_pair_targets(block, spans, max_pair_targets=15):
    """span_masking's pair_targets (endpoints 'external') before padding, shifted by 1 for
    [CLS] as NoNSPSpanBertDataset.__getitem__ does: [[left, right, target ids...]]."""
    sent_length = len(block)
    pair_targets = []
    for start, end in _original_merge_intervals(spans):
        if start > 0 and end < sent_length - 1:
            pair_targets.append([start - 1, end + 1] + [block[i] for i in range(start, end + 1)])
    pair_targets = [t[: max_pair_targets + 2] for t in pair_targets]
    return [[t[0] + 1, t[1] + 1, *t[2:]] for t in pair_targets]


def _our_pair_targets(out):
    """Our per-slot SBO keys regrouped as the original's [[left, right, targets...]]."""
    weights = out["sbo_weights"]
    groups = {}
    for j in np.flatnonzero(weights):
        key = (int(out["sbo_left"][j]), int(out["sbo_right"][j]))
        groups.setdefault(key, []).append((int(out["sbo_offset"][j]), int(out["masked_lm_ids"][j])))
    result = []
    for (left, right), targets in sorted(groups.items()):
        offsets = [o for o, _ in sorted(targets)]
        assert offsets == list(range(len(offsets))), "offsets 0, 1, ... in position order"
        result.append([left, right, *[t for _, t in sorted(targets)]])
    return result


# ---- span statistics ----------------------------------------------------------------------


def test_length_distribution_is_the_renormalised_geometric():
    probs = masking.span_length_probabilities(0.2, 10)
    expected = [0.2 * 0.8 ** (length - 1) for length in range(1, 11)]
    np.testing.assert_allclose(probs, np.array(expected) / sum(expected), rtol=1e-12)
    # The paper: "mean span length 3.8 (words)".
    assert round(float(np.dot(np.arange(1, 11), probs)), 1) == 3.8


def _span_words(block, start, end):
    return sum(1 for i in range(start, end + 1) if WORD_STARTS[block[i]] or i == start)


@pytest.mark.slow(20)
def test_span_statistics_match_the_original_over_many_rows():
    """Merged span lengths in words, spans per row and SBO-eligible spans: ours against the
    transcription of the original on the same blocks (different random streams, same law)."""
    rng = np.random.default_rng(0)
    blocks = [_block(rng, 120) for _ in range(300)]
    ours, theirs = {"words": [], "spans": [], "pairs": []}, {"words": [], "spans": [], "pairs": []}
    np_rng = np.random.RandomState(0)
    for b, block in enumerate(blocks):
        for draw in range(4):
            out = _numpy(_mask(_row(block, 128), seed=b * 10 + draw))
            n = int(out["masked_lm_weights"].sum())
            covered = [int(p) - 1 for p in out["masked_lm_positions"][:n]]  # block coordinates
            mask, spans = _original_spans(block, WORD_STARTS, 0.15, np_rng)
            for stats, merged in ((ours, _runs(covered)), (theirs, _original_merge_intervals(spans))):
                stats["spans"].append(len(merged))
                stats["words"] += [_span_words(block, s, e) for s, e in merged]
            ours["pairs"].append(len(_our_pair_targets(out)))
            theirs["pairs"].append(len(_original_pair_targets(block, spans)))
    hist = {
        name: np.bincount(np.minimum(stats["words"], 12), minlength=13) / len(stats["words"])
        for name, stats in (("ours", ours), ("theirs", theirs))
    }
    assert 0.5 * np.abs(hist["ours"] - hist["theirs"]).sum() < 0.03, hist
    for key in ("spans", "pairs", "words"):
        assert np.mean(ours[key]) == pytest.approx(np.mean(theirs[key]), rel=0.04), key
    # Merging and the budget cut make the measured spans shorter than the drawn 3.8 words.
    assert 2.5 < np.mean(ours["words"]) < 3.8


@pytest.mark.slow
@pytest.mark.parametrize("candidates", [10, 37, 100, 126, 200])
def test_budget_is_ceil_of_fifteen_percent_of_the_block(candidates):
    rng = np.random.default_rng(candidates)
    row = _row(_block(rng, candidates), 256)
    for seed in range(5):
        out = _numpy(_mask(row, seed))
        # 100 x 0.15 = 15.000000000000002 in float64: the original's math.ceil gives 16.
        assert out["masked_lm_weights"].sum() == math.ceil(candidates * 0.15)
    capped = _numpy(_mask(row, 0, cap=4))
    assert capped["masked_lm_weights"].sum() == min(4, math.ceil(candidates * 0.15))


@pytest.mark.slow
def test_spans_are_whole_words_merged_and_their_boundaries_unmasked():
    rng = np.random.default_rng(3)
    for seed in range(200):
        block = _block(rng, int(rng.integers(20, 120)))
        out = _numpy(_mask(_row(block, 128), seed))
        n = int(out["masked_lm_weights"].sum())
        covered = set(int(p) for p in out["masked_lm_positions"][:n])
        assert not covered & {0, len(block) + 1}, "never [CLS] or [SEP]"
        runs = _runs(covered)
        for s, _ in runs:
            # A span starts at a word start (only the budget may cut one short at its end).
            assert WORD_STARTS[block[s - 1]] or s == 1
        for j in np.flatnonzero(out["sbo_weights"]):
            left, right = int(out["sbo_left"][j]), int(out["sbo_right"][j])
            assert left not in covered and right not in covered, "boundaries never masked"
            assert set(range(left + 1, right)) <= covered, "the span between them is masked"
            assert 1 <= left and right <= len(block), "boundaries are block tokens"
        # Touching spans are merged: runs are separated by at least one unmasked token.
        assert all(b[0] - a[1] >= 2 for a, b in zip(runs, runs[1:]))


@pytest.mark.slow
def test_one_replacement_decision_per_span_and_unigram_random_tokens():
    rng = np.random.default_rng(4)
    kinds = {"mask": 0, "kept": 0, "random": 0}
    random_tokens = []
    for seed in range(600):
        block = _block(rng, 100)
        row = _row(block, 128)
        out = _numpy(_mask(row, seed))
        original = row["input_ids"].numpy()
        n = int(out["masked_lm_weights"].sum())
        for s, e in _runs(int(p) for p in out["masked_lm_positions"][:n]):
            new, old = out["input_ids"][s : e + 1], original[s : e + 1]
            if (new == MASK).any():
                assert (new == MASK).all(), "a span is all [MASK] or none"
                kinds["mask"] += 1
            elif (new == old).all() and e - s >= 2:
                kinds["kept"] += 1  # (a short random span may equal the original by chance)
            elif not (new == old).all():
                kinds["random"] += 1
                random_tokens += list(new)
    spans = sum(kinds.values())
    assert abs(kinds["mask"] / spans - 0.8) < 0.03, kinds
    assert kinds["random"] > 0.07 * spans and kinds["kept"] > 0.05 * spans, kinds
    # Random tokens come from the unigram counts: never an id with count 0 (e.g. the specials),
    # and the frequent ids more often (the law itself: the next test).
    freq = np.bincount(random_tokens, minlength=VOCAB)
    assert freq[COUNTS == 0].sum() == 0 and len(random_tokens) > 500
    assert freq[COUNTS == 49].sum() > 20 * freq[COUNTS == 1].sum()


def test_random_tokens_are_drawn_from_the_unigram_counts():
    ids = masking._unigram_ids(tf.constant([3, 4], tf.int64), 200_000, tf.constant(COUNTS)).numpy()
    freq = np.bincount(ids, minlength=VOCAB) / ids.size
    expected = COUNTS / COUNTS.sum()
    assert freq[COUNTS == 0].sum() == 0
    for c in np.unique(COUNTS[COUNTS > 0]):  # each count class (about 43 ids) as a whole
        assert freq[COUNTS == c].sum() == pytest.approx(expected[COUNTS == c].sum(), abs=0.004), c
    assert 0.5 * np.abs(freq - expected).sum() < 0.03


@pytest.mark.slow
def test_sbo_pairs_and_targets_are_the_originals():
    """Given the same masked spans, our SBO keys are span_masking's pair_targets (endpoints
    'external', [CLS] offset, 15 targets per span)."""
    rng = np.random.default_rng(5)
    checked = 0
    for seed in range(150):
        block = _block(rng, int(rng.integers(10, 126)))
        out = _numpy(_mask(_row(block, 128), seed, prob=0.3))
        n = int(out["masked_lm_weights"].sum())
        spans = [[s - 1, e - 1] for s, e in _runs(int(p) for p in out["masked_lm_positions"][:n])]
        # Also overlapping pieces, as the original's spans list has before merge_intervals.
        expected = _original_pair_targets(block, spans + [[s, s] for s, _ in spans])
        assert _our_pair_targets(out) == expected
        checked += sum(len(t) - 2 for t in expected)
    assert checked > 1000


def test_sbo_targets_are_capped_at_max_targets_per_span():
    block = [102] * 60  # one-piece words: the whole block is candidates
    out = _numpy(_mask(_row(block, 64), seed=1, prob=0.9, max_targets=4))
    offsets = out["sbo_offset"][out["sbo_weights"] > 0]
    assert offsets.size and offsets.max() == 3
    assert (out["sbo_offset"] < 4).all(), "offsets index the position table"


@pytest.mark.slow
def test_inside_tf_data_matches_eager():
    rng = np.random.default_rng(6)
    rows = [_row(_block(rng, 50), 64) for _ in range(5)]
    eager = [_numpy(_mask(r, i, eager=True)) for i, r in enumerate(rows)]
    ds = tf.data.Dataset.from_tensor_slices({k: tf.stack([r[k] for r in rows]) for k in rows[0]})
    graph = list(ds.enumerate().map(lambda i, r: _mask(r, tf.cast(i, tf.int64))).as_numpy_iterator())
    for x, y in zip(graph, eager):
        assert set(x) == set(y)
        for key in y:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


def test_spans_never_cross_a_separator():
    rng = np.random.default_rng(7)
    for seed in range(100):
        a, b = _block(rng, 20), _block(rng, 30)
        tokens = [CLS, *a, SEP, *b, SEP]
        row = {"input_ids": tf.constant(tokens, tf.int32), "input_mask": tf.ones(len(tokens), tf.int32)}
        out = _numpy(_mask(row, seed, prob=0.4))
        n = int(out["masked_lm_weights"].sum())
        for s, e in _runs(int(p) for p in out["masked_lm_positions"][:n]):
            assert e <= len(a) or s > len(a) + 1, "a span inside one segment"


# ---- the SBO head against a transcription of pair_bert.py ---------------------------------

TINY = EncoderConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    num_layers=2,
    num_heads=8,
    intermediate_size=64,
    max_position_embeddings=64,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
)


def _torch_pair_target_head(torch, config, embedding_weights, max_targets, position_width):
    """facebookresearch/SpanBERT pretraining/fairseq/models/pair_bert.py
    BertPairTargetPredictionHead + MLPWithLayerNorm + BertLayerNorm, transcribed."""
    nn = torch.nn

    def gelu(x):
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))

    class BertLayerNorm(nn.Module):
        def __init__(self, hidden_size, eps=1e-12):
            super().__init__()
            self.gamma = nn.Parameter(torch.ones(hidden_size))
            self.beta = nn.Parameter(torch.zeros(hidden_size))
            self.variance_epsilon = eps

        def forward(self, x):
            u = x.mean(-1, keepdim=True)
            s = (x - u).pow(2).mean(-1, keepdim=True)
            x = (x - u) / torch.sqrt(s + self.variance_epsilon)
            return self.gamma * x + self.beta

    class MLPWithLayerNorm(nn.Module):
        def __init__(self, input_size):
            super().__init__()
            self.linear1 = nn.Linear(input_size, config.hidden_size)
            self.layer_norm1 = BertLayerNorm(config.hidden_size, eps=1e-12)
            self.linear2 = nn.Linear(config.hidden_size, config.hidden_size)
            self.layer_norm2 = BertLayerNorm(config.hidden_size, eps=1e-12)

        def forward(self, hidden):
            return self.layer_norm2(gelu(self.linear2(self.layer_norm1(gelu(self.linear1(hidden))))))

    class BertPairTargetPredictionHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.position_embeddings = nn.Embedding(max_targets, position_width)
            self.mlp_layer_norm = MLPWithLayerNorm(config.hidden_size * 2 + position_width)
            self.decoder = nn.Linear(embedding_weights.size(1), embedding_weights.size(0), bias=False)
            self.decoder.weight = embedding_weights
            self.bias = nn.Parameter(torch.zeros(embedding_weights.size(0)))
            self.max_targets = max_targets

        def forward(self, hidden_states, pairs):
            bs, num_pairs, _ = pairs.size()
            bs, seq_len, dim = hidden_states.size()
            left, right = pairs[:, :, 0], pairs[:, :, 1]
            left_hidden = torch.gather(hidden_states, 1, left.unsqueeze(2).repeat(1, 1, dim))
            left_hidden = (
                left_hidden.contiguous().view(bs * num_pairs, dim).unsqueeze(1).repeat(1, self.max_targets, 1)
            )
            right_hidden = torch.gather(hidden_states, 1, right.unsqueeze(2).repeat(1, 1, dim))
            right_hidden = (
                right_hidden.contiguous()
                .view(bs * num_pairs, dim)
                .unsqueeze(1)
                .repeat(1, self.max_targets, 1)
            )
            position_embeddings = self.position_embeddings.weight
            hidden_states = self.mlp_layer_norm(
                torch.cat(
                    (
                        left_hidden,
                        right_hidden,
                        position_embeddings.unsqueeze(0).repeat(bs * num_pairs, 1, 1),
                    ),
                    -1,
                )
            )
            return self.decoder(hidden_states) + self.bias

    return BertPairTargetPredictionHead()


@pytest.mark.slow
def test_sbo_head_equals_the_original_head():
    import torch  # requirements-test.txt: a missing torch is a failure, not a skip

    from models.heads import SpanBoundaryHead

    batch, length, pairs, targets = 2, 24, 3, 15
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(batch, length, TINY.hidden_size)).astype(np.float32)
    table = rng.normal(scale=0.1, size=(VOCAB, TINY.hidden_size)).astype(np.float32)  # logits ~ +-3
    boundaries = np.sort(rng.integers(0, length, size=(batch, pairs, 2)), axis=-1).astype(np.int32)
    # Our per-slot layout: every (pair, offset) of the original's [pairs x 15] grid.
    left = np.repeat(boundaries[..., 0], targets, axis=1)
    right = np.repeat(boundaries[..., 1], targets, axis=1)
    offset = np.tile(np.arange(targets, dtype=np.int32), (batch, pairs))
    head = SpanBoundaryHead(TINY, max_targets=targets)
    params = flax.linen.meta.unbox(head.init(jax.random.key(1), hidden, left, right, offset, table))["params"]
    params = jax.tree.map(lambda x: x + rng.normal(scale=0.1, size=x.shape).astype(np.float32), params)
    ours = np.asarray(head.apply({"params": params}, hidden, left, right, offset, table))

    theirs = _torch_pair_target_head(torch, TINY, torch.nn.Parameter(torch.tensor(table)), targets, 200)
    p = jax.tree.map(lambda x: torch.tensor(np.asarray(x)), params)
    with torch.no_grad():
        theirs.position_embeddings.weight.copy_(p["position_embeddings"]["embedding"])
        mlp = theirs.mlp_layer_norm
        for i in (1, 2):
            getattr(mlp, f"linear{i}").weight.copy_(p[f"dense_{i}"]["kernel"].T)
            getattr(mlp, f"linear{i}").bias.copy_(p[f"dense_{i}"]["bias"])
            getattr(mlp, f"layer_norm{i}").gamma.copy_(p[f"layer_norm_{i}"]["scale"])
            getattr(mlp, f"layer_norm{i}").beta.copy_(p[f"layer_norm_{i}"]["bias"])
        theirs.bias.copy_(p["output_bias"])
        expected = theirs(torch.tensor(hidden), torch.tensor(boundaries, dtype=torch.long)).numpy()
    expected = expected.reshape(batch, pairs * targets, VOCAB)
    diff = float(np.abs(ours - expected).max())
    print("SBO head vs the PyTorch transcription: max abs diff", diff)
    assert diff < 1e-5


# ---- the objective ------------------------------------------------------------------------

L, P = 32, 8
DATA = PipelineConfig(
    max_seq_length=L, max_predictions_per_seq=P, masking_unit="span", sentence_objective="none"
)


def _batch(batch_size, seed=0):
    """Span-masked rows [CLS] block [SEP] + padding from mask_spans (the pipeline's op)."""
    rng = np.random.default_rng(seed)
    rows = []
    for b in range(batch_size):
        block = _block(rng, int(rng.integers(10, L - 2)))
        rows.append(_numpy(_mask(_row(block, L), seed * 100 + b, prob=0.2, cap=P)))
    batch = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    batch["segment_ids"] = np.zeros_like(batch["input_ids"])
    batch["positions"] = np.broadcast_to(np.arange(L, dtype=np.int32), batch["input_ids"].shape).copy()
    return batch


@pytest.mark.slow
def test_loss_is_mlm_mean_plus_sbo_sum_over_targets_plus_one():
    objective = SpanBoundary(TINY, DATA)
    params = flax.linen.meta.unbox(jax.jit(objective.init)(jax.random.key(0)))
    batch = _batch(4)
    assert set(objective.batch_spec(4, L, P)) <= set(batch)
    outputs = jitted.apply(objective.module, {"params": params}, batch, deterministic=True)
    loss, sums = jax.jit(
        lambda p: objective.loss(
            p, batch, {"dropout": jax.random.key(1)}, objective.normalizers(batch), train=False
        )
    )(params)

    def nll(logits, ids):
        logits = np.asarray(logits, np.float64)
        logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        return logz - np.take_along_axis(logits, ids[..., None], -1)[..., 0]

    ids, w, sbo_w = batch["masked_lm_ids"], batch["masked_lm_weights"], batch["sbo_weights"]
    mlm = (nll(outputs["mlm_logits"], ids) * w).sum() / w.sum()
    sbo = (nll(outputs["sbo_logits"], ids) * sbo_w).sum() / (sbo_w.sum() + 1)
    assert 0 < sbo_w.sum() < w.sum()
    assert float(loss) == pytest.approx(mlm + sbo, rel=1e-5)
    means = objective.summarize(jax.tree.map(float, sums))
    assert means["sbo_loss"] == pytest.approx(sbo * (sbo_w.sum() + 1) / sbo_w.sum(), rel=1e-5)
    assert means["loss"] == pytest.approx(means["mlm_loss"] + means["sbo_loss"])
    assert 0 <= means["sbo_accuracy"] <= 1 and objective.log_labels()["sbo_accuracy"] == "sbo_acc"
    assert objective.flops_per_row(L, P) > objective.__class__.__mro__[1](TINY, DATA).flops_per_row(L, P)


def test_recipe_misconfigurations_are_one_line_errors():
    with pytest.raises(ConfigError, match="masking_unit = 'span'"):
        SpanBoundary(TINY, dataclasses.replace(DATA, masking_unit="whole_word"))
    with pytest.raises(ConfigError, match="span_geometric_p"):
        dataclasses.replace(DATA, span_geometric_p=0.0)
    # With NSP the sentence head and its mean are added (the original's mlm_nsp_sbo_loss.py).
    with_nsp = SpanBoundary(TINY, dataclasses.replace(DATA, sentence_objective="nsp"))
    assert "sentence_label" in with_nsp.batch_spec(2, L, P) and with_nsp.module.sentence_head


@pytest.mark.slow
def test_schedule_is_spanberts_polynomial_decay():
    """pretraining/fairseq/optim/lr_scheduler/polynomial_decay_schedule.py step_update (power 1,
    end 0) against configs/recipes/spanbert.gin's form, 'bert'."""
    peak, warmup, total = 1e-4, 100, 2400

    def theirs(num_updates):
        if num_updates <= warmup:
            return num_updates / warmup * peak
        return peak * (1 - num_updates / total)

    ours = optim.warmup_linear_decay(peak, warmup, total, "bert")
    for n in [0, 1, 50, 99, 101, 500, 2399, 2400]:
        assert float(ours(n)) == pytest.approx(theirs(n), rel=1e-5, abs=1e-6 * peak), n  # float32
    with open("configs/recipes/spanbert.gin") as f:
        assert "adamw.schedule = 'bert'" in f.read()


@pytest.mark.slow(30)
@pytest.mark.extended
def test_microbatched_and_sharded_steps_equal_the_single_device_step():
    mesh_training.assert_layouts_equal_one_device(
        lambda: SpanBoundary(TINY, DATA), [_batch(16, seed=s) for s in range(2)]
    )


# ---- the pipeline on real WordPiece shards ------------------------------------------------


@pytest.mark.slow
def test_manifest_keeps_the_train_unigram_counts(text_shards, tmp_path):
    manifest = shards.load_manifest(text_shards)
    counts = manifest.unigram_counts()
    assert counts.shape == (manifest.vocab_size,) and counts.sum() == manifest.splits["train"]["tokens"]
    assert counts[[manifest.vocab.cls_id, manifest.vocab.sep_id, manifest.vocab.mask_id]].sum() == 0
    with open(f"{text_shards}/manifest.json") as f:
        assert len(f.read().splitlines()) < 80, "the counts sit on one line"
    # Shards written before span masking: a one-line error, and preprocess adds the counts.
    import shutil

    old = tmp_path / "old"
    shutil.copytree(text_shards, old)
    fields = dict(manifest.fields)
    del fields[shards.UNIGRAM_COUNTS]
    shards.write_manifest(str(old), fields)
    with pytest.raises(shards.ShardsError, match="run data.preprocess again"):
        pipeline.make_dataset(str(old), "train", tiny.SPAN_DATA, 4)
    tokenizer_dir = str(old / shards.TOKENIZER_DIR)
    messages = []
    again = preprocess.preprocess(
        manifest.fields["corpus"],
        tokenizer_dir,
        str(old),
        num_shards=2,
        eval_fraction=0.1,
        num_workers=1,
        log=messages.append,
    )
    assert "unigram counts" in messages[-1]
    np.testing.assert_array_equal(again.unigram_counts(), counts)


@pytest.mark.slow
def test_pipeline_rows_are_single_blocks_with_span_keys(text_shards):
    tokenizer = tokenizers.load_tokenizer(f"{text_shards}/tokenizer")
    batch = next(iter(pipeline.make_dataset(text_shards, "train", tiny.SPAN_DATA, 16)))
    batch = {k: v.numpy() for k, v in batch.items()}
    assert "example_ids" not in batch and "sentence_label" not in batch
    assert set(SpanBoundary(TINY, tiny.SPAN_DATA).batch_spec(16, 64, 12)) <= set(batch)
    for b in range(16):
        n = int(batch["input_mask"][b].sum())
        ids = batch["input_ids"][b]
        assert ids[0] == tokenizer.cls_id and ids[n - 1] == tokenizer.sep_id
        assert not np.isin(ids[1 : n - 1], [tokenizer.cls_id, tokenizer.sep_id]).any(), "one block a row"
        assert (batch["segment_ids"][b] == 0).all()
        count = int(batch["masked_lm_weights"][b].sum())
        assert count == min(tiny.SPAN_DATA.max_predictions_per_seq, math.ceil((n - 2) * 0.15))
        targets = batch["sbo_weights"][b] > 0
        assert (batch["sbo_left"][b][targets] >= 1).all() and (batch["sbo_right"][b][targets] <= n - 2).all()
