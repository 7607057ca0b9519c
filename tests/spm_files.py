"""SentencePiece models the tests train on Python's own documentation."""

from __future__ import annotations

import io

import sentencepiece as spm


def sentences(n):
    """Sentences of Python's own documentation (`pydoc_data.topics`)."""
    import pydoc_data.topics

    text = " ".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
    return [s.strip() for s in " ".join(text.split()).split(". ") if len(s.strip()) > 10][:n]


def train_spm(vocab_size=800, **settings):
    """A unigram spm model's bytes, by default laid out as DeBERTa-v2/v3's spm.model:
    [PAD]=0 [CLS]=1 [SEP]=2 (control pieces: pad, bos, eos) and [UNK]=3 (its unk piece)."""
    layout = dict(
        pad_id=0,
        pad_piece="[PAD]",
        bos_id=1,
        bos_piece="[CLS]",
        eos_id=2,
        eos_piece="[SEP]",
        unk_id=3,
        unk_piece="[UNK]",
    )
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences(800)),
        model_writer=model,
        model_type="unigram",
        vocab_size=vocab_size,
        minloglevel=2,
        **{**layout, **settings},
    )
    return model.getvalue()
