"""What a pretraining row looks like: PipelineConfig (gin: PipelineConfig), the recipe part of
the data, without TensorFlow, so that the objectives, the train step and the benchmarks can
be built where only JAX is installed; data/pipeline.py builds the rows with tf.data."""

from __future__ import annotations

import dataclasses
import math

import gin

from core.errors import ConfigError
from data import pair_layout

MASKING_UNITS = ("token", "whole_word", "ngram", "span")  # data/masking.py's units
WORD_UNITS = ("whole_word", "ngram", "span")  # the units made of words
# What replaces a chosen token (data/masking.py mask_tokens): "mask", BERT's 80% [MASK], 10%
# kept, 10% a random id; "random", MacBERT's MLM as correction without a similar-word table
# (Cui et al. 2020, "Revisiting Pre-Trained Models for Chinese Natural Language Processing",
# section 3: 80% a similar word, or a random word where there is none, 10% a random word, 10%
# kept): 90% a random id, 10% kept; "similar", MacBERT's with a table of similar words
# (`similar_words`, data/similar_words.py), decided per word.
REPLACEMENTS = ("mask", "random", "similar")

# "static": masks drawn from the copy (epoch % dupe_factor), as the original's offline
# copies; "dynamic": fresh masks every pass (RoBERTa); "in_step": the pipeline does not mask,
# the objective does inside the train step (ELECTRA): rows carry `maskable` and `mask_id`
# (data/masking.py mark_maskable) instead of the masked_lm_* keys.
MASKING_MODES = ("static", "dynamic", "in_step")
FORMATS = ("segment_pair", "sentence_pair", "full_sentences", "doc_sentences", "xlnet_stream")
SENTENCE_OBJECTIVES = ("nsp", "sop", "none")

# max_predictions_per_seq, when not given, is round(L * masked_lm_prob) rounded up to a
# multiple of this: 20 for L=128 and 80 for L=512 at 15%, BERT's published values.
# masking never predicts more than round(n * rate) <= round(L * rate) tokens (whole-word
# and n-gram masking skip a unit that would overshoot), nor span masking more than
# ceil((L - 2) * rate) (SpanBERT's budget over the block between [CLS] and [SEP]), so the
# cap never binds; the margin (0..3 slots) only pads.
_PREDICTIONS_MULTIPLE = 4
# XLNet's target budget: num_predict 85 at length 512 (its README's pretraining command).
_XLNET_PREDICT_RATE = 85 / 512


def derived_max_predictions(max_seq_length: int, masked_lm_prob: float) -> int:
    """max(round(L * rate), ceil((L - 2) * rate)) (Python arithmetic, as masking) rounded up
    to a multiple of 4, >= 1."""
    need = max(1, round(max_seq_length * masked_lm_prob), math.ceil((max_seq_length - 2) * masked_lm_prob))
    return -(-need // _PREDICTIONS_MULTIPLE) * _PREDICTIONS_MULTIPLE


@gin.configurable
@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """What instances and masks look like; the recipe part of the data (gin: PipelineConfig).

    format: "segment_pair" (BERT; RoBERTa's SEGMENT-PAIR), "sentence_pair" (RoBERTa's
    SENTENCE-PAIR: one natural sentence each side), "full_sentences" (contiguous
    sentences filling the row, crossing documents with a separator), "doc_sentences"
    (the same within one document, short rows packed; batches get `example_ids`).
    sentence_objective: "nsp" (BERT), "sop" (ALBERT, pair formats only) or "none" (no
    sentence_label in the batch). pair_format: "bert" / "roberta", or None to take it
    from the shards' manifest (the tokenizer's identity), default "bert".
    masking_unit: "token", "whole_word", "ngram" or "span" (data/masking.py; "span" is
    SpanBERT's, shaped by span_geometric_p, span_max_words and sbo_max_targets, and draws its
    random tokens from the shards' unigram counts).
    ngram_probabilities: "ngram"'s P(n) for n = 1, 2, ... (None: ALBERT's, proportional to 1/n
    for n <= 3; MacBERT's: (0.4, 0.3, 0.2, 0.1)).
    replacement: "mask" (BERT's 80/10/10), "random" (MacBERT's without a table: a random id
    instead of [MASK]) or "similar" (MacBERT's: the word's similar word from the table
    `similar_words` names, data/similar_words.py); REPLACEMENTS.
    require_word_segmenter: the masking's words must be a word segmenter's (Chinese whole-word
    masking: shards preprocessed with --word_segmenter, data/word_segmentation.py); shards
    without them are a one-line error. Such shards' words are used whenever the unit is made
    of words, required or not.
    pack_examples: DOC-SENTENCES packs short rows (True, our default: no padding compute);
    False keeps one example per row, as SpanBERT's blocks.
    max_predictions_per_seq: None derives it from the length and rate
    (`derived_max_predictions`); after construction it is always an int.

    format "xlnet_stream" is XLNet's (data/xlnet_stream.py): each row continues the row of the
    same place in the previous batch. reuse_len: the row's first tokens, which the next row's
    memory holds (the original's reuse_len, 256 at 512); the rest is A <sep> B <sep> <cls>.
    bi_data: every second row reads its documents backwards. max_predictions_per_seq is the
    row's target budget (the original's num_predict; None: 85 per 512 tokens), drawn as
    n-grams of up to plm_max_gram pieces in contexts of plm_mask_alpha / plm_mask_beta tokens
    per target (data/plm_targets.py). The masking options do not apply to it.
    """

    max_seq_length: int = 128
    max_predictions_per_seq: int | None = None
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    next_sentence_prob: float = 0.5  # probability of a NotNext pair (BERT: 0.5)
    masking: str = "static"  # one of MASKING_MODES
    dupe_factor: int = 10
    document_shuffle_buffer: int = 1000  # documents are shuffled within blocks of this many per pass
    instance_shuffle_buffer: int = 10000  # rows, across passes
    seed: int = 12345
    format: str = "segment_pair"
    sentence_objective: str = "nsp"
    pair_format: str | None = None
    masking_unit: str = "token"
    span_geometric_p: float = 0.2  # SpanBERT: P(l words) ~ p (1 - p)^(l - 1) ...
    span_max_words: int = 10  # ... for l = 1..10, renormalised (mean 3.8 words)
    sbo_max_targets: int = 15  # span boundary objective targets per span
    require_word_segmenter: bool = False
    ngram_probabilities: tuple[float, ...] | None = None
    replacement: str = "mask"
    similar_words: str | None = None
    pack_examples: bool = True
    reuse_len: int = 0
    bi_data: bool = False
    plm_max_gram: int = 5
    plm_mask_alpha: int = 6
    plm_mask_beta: int = 1

    def __post_init__(self):
        if self.masking not in MASKING_MODES:
            raise ConfigError(f"PipelineConfig.masking must be one of {MASKING_MODES}, got {self.masking!r}")
        if self.masking == "in_step" and self.masking_unit != "token":
            raise ConfigError(
                "PipelineConfig.masking = 'in_step' masks single tokens inside the train step: "
                f"set PipelineConfig.masking_unit = 'token' (got {self.masking_unit!r})"
            )
        if self.max_seq_length < 8:
            raise ConfigError(f"PipelineConfig.max_seq_length={self.max_seq_length} is too short (>= 8)")
        if self.dupe_factor < 1:
            raise ConfigError(f"PipelineConfig.dupe_factor must be >= 1, got {self.dupe_factor}")
        if self.format not in FORMATS:
            raise ConfigError(f"PipelineConfig.format must be one of {FORMATS}, got {self.format!r}")
        if self.sentence_objective not in SENTENCE_OBJECTIVES:
            raise ConfigError(
                f"PipelineConfig.sentence_objective must be one of {SENTENCE_OBJECTIVES}, "
                f"got {self.sentence_objective!r}"
            )
        if self.format in ("full_sentences", "doc_sentences") and self.sentence_objective != "none":
            raise ConfigError(
                f"PipelineConfig.format={self.format!r} has no sentence pair: set "
                "PipelineConfig.sentence_objective = 'none'"
            )
        if self.pair_format not in (None, *pair_layout.NAMES):
            raise ConfigError(
                f"PipelineConfig.pair_format must be None or one of {pair_layout.NAMES}, "
                f"got {self.pair_format!r}"
            )
        if self.masking_unit not in MASKING_UNITS:
            raise ConfigError(
                f"PipelineConfig.masking_unit must be one of {MASKING_UNITS}, got {self.masking_unit!r}"
            )
        if self.ngram_probabilities is not None and (
            self.masking_unit != "ngram"
            or not self.ngram_probabilities
            or min(self.ngram_probabilities) < 0
            or sum(self.ngram_probabilities) <= 0
        ):
            raise ConfigError(
                "PipelineConfig.ngram_probabilities are P(n) of masking_unit = 'ngram': non-negative, "
                "not all 0, "
                f"for n = 1, 2, ... (got {self.ngram_probabilities} with masking_unit {self.masking_unit!r})"
            )
        if self.replacement not in REPLACEMENTS or (
            self.replacement != "mask" and (self.masking_unit == "span" or self.masking == "in_step")
        ):
            raise ConfigError(
                f"PipelineConfig.replacement must be one of {REPLACEMENTS}, and 'mask' with span masking or "
                f"masking in the step (got {self.replacement!r})"
            )
        if (self.replacement == "similar") != (self.similar_words is not None) or (
            self.replacement == "similar" and self.masking_unit not in ("whole_word", "ngram")
        ):
            raise ConfigError(
                "PipelineConfig.replacement = 'similar' and PipelineConfig.similar_words (a table of similar "
                "words) go together, with masking_unit 'whole_word' or 'ngram' (got replacement "
                f"{self.replacement!r}, similar_words {self.similar_words!r}, "
                f"masking_unit {self.masking_unit!r})"
            )
        if self.require_word_segmenter and self.masking_unit not in WORD_UNITS:
            raise ConfigError(
                "PipelineConfig.require_word_segmenter needs words to mask: set PipelineConfig.masking_unit "
                f"to one of {WORD_UNITS} (got {self.masking_unit!r})"
            )
        if not 0 < self.span_geometric_p <= 1 or self.span_max_words < 1 or self.sbo_max_targets < 1:
            raise ConfigError(
                "PipelineConfig needs 0 < span_geometric_p <= 1, span_max_words >= 1 and sbo_max_targets "
                f">= 1, got {self.span_geometric_p}, {self.span_max_words}, {self.sbo_max_targets}"
            )
        if self.max_predictions_per_seq is None:
            if self.format == "xlnet_stream":
                derived = max(2, round(self.max_seq_length * _XLNET_PREDICT_RATE))
            else:
                derived = derived_max_predictions(self.max_seq_length, self.masked_lm_prob)
            object.__setattr__(self, "max_predictions_per_seq", derived)
        elif self.max_predictions_per_seq < 1:
            raise ConfigError(
                "PipelineConfig.max_predictions_per_seq must be >= 1 or None, "
                f"got {self.max_predictions_per_seq}"
            )
        if self.format == "xlnet_stream":
            self._check_xlnet_stream()

    def _check_xlnet_stream(self) -> None:
        if self.sentence_objective != "none":
            raise ConfigError(
                "PipelineConfig.format='xlnet_stream' has no sentence objective: set "
                "PipelineConfig.sentence_objective = 'none'"
            )
        if self.masking != "static" or self.masking_unit != "token" or self.replacement != "mask":
            raise ConfigError(
                "PipelineConfig.format='xlnet_stream' draws XLNet's own n-gram targets (plm_max_gram, "
                "plm_mask_alpha, plm_mask_beta): leave PipelineConfig.masking, masking_unit and "
                "replacement unset"
            )
        rest = self.max_seq_length - self.reuse_len - 3  # A and B
        if self.reuse_len < 1 or rest < 2:
            raise ConfigError(
                f"PipelineConfig.reuse_len = {self.reuse_len} must be in [1, {self.max_seq_length - 5}] "
                f"for rows of {self.max_seq_length} (the original: half the row)"
            )
        if not 1 <= self.plm_mask_beta <= self.plm_mask_alpha or self.plm_max_gram < 1:
            raise ConfigError(
                "PipelineConfig needs plm_max_gram >= 1 and 1 <= plm_mask_beta <= plm_mask_alpha, got "
                f"{self.plm_max_gram}, {self.plm_mask_beta}, {self.plm_mask_alpha}"
            )
        budget = self.max_predictions_per_seq
        if not 2 <= budget <= 2 * min(self.reuse_len, self.max_seq_length - self.reuse_len):
            raise ConfigError(
                f"PipelineConfig.max_predictions_per_seq = {budget} is XLNet's target budget, split "
                f"between the reused {self.reuse_len} tokens and the other "
                f"{self.max_seq_length - self.reuse_len}: it must be in [2, twice the smaller part]"
            )

    @property
    def packed(self) -> bool:
        """Rows hold several examples (DOC-SENTENCES with packing): batches carry example_ids."""
        return self.format == "doc_sentences" and self.pack_examples
