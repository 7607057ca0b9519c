"""Learning a new vocab from documents, streaming: BERT's WordPiece (`train_wordpiece`),
RoBERTa's byte-level BPE (`train_bpe`), ALBERT's SentencePiece unigram model
(`train_sentencepiece`) and XLNet's (`train_xlnet_sentencepiece`). `TRAINABLE_KINDS` says
how `python -m data.tokenizers train` makes each kind.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Callable, Iterable, Iterator, Sequence

import sentencepiece as spm
import tokenizers as hf_tokenizers
from tokenizers import models, pre_tokenizers, trainers

from data.tokenizers.base import SPECIAL_TOKENS, Tokenizer, TokenizerError
from data.tokenizers.bpe import BPE_SPECIAL_TOKENS, BPE_VOCAB_FILE, ByteLevelBPETokenizer
from data.tokenizers.sentencepiece import (
    SP_CONTROL_SYMBOLS,
    SP_MODEL_FILE,
    SentencePieceTokenizer,
    albert_preprocess,
)
from data.tokenizers.wordpiece import VOCAB_FILE, WordPieceTokenizer, bert_pipeline
from data.tokenizers.xlnet import XLNET_CONTROL_SYMBOLS, XLNET_USER_SYMBOLS, XLNetTokenizer

# ALBERT's spm_train flags for 30k-clean.model (google-research/albert README).
SP_USER_SYMBOLS = ("(", ")", '"', "-", ".", "\u2013", "\u00a3", "\u20ac")


class _SentenceCounter:
    """Feeds documents to a trainer as batches of sentences, counting them."""

    def __init__(self, documents: Iterable[Sequence[str]]):
        self._documents = documents
        self.sentences = 0

    def batches(self) -> Iterator[list[str]]:
        # Batches, not single sentences: the library tokenizes a batch in parallel.
        batch: list[str] = []
        for document in self._documents:
            batch.extend(document)
            if len(batch) >= 1000:
                self.sentences += len(batch)
                yield batch
                batch = []
        if batch:
            self.sentences += len(batch)
            yield batch


def train_wordpiece(
    documents: Iterable[Sequence[str]],
    vocab_size: int,
    *,
    lowercase: bool = True,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
) -> WordPieceTokenizer:
    """Learns a WordPiece vocab from documents (each a sequence of sentences), streaming.

    Args:
      documents: iterable of documents; read once.
      vocab_size: the most tokens the vocab may have, specials included (fewer when the
        corpus runs out of merges).
      lowercase: uncased (lowercase, strip accents) or cased (keep both).
      min_frequency: a merge must occur at least this often.
      limit_alphabet: the most distinct characters kept (the rarest become [UNK]).

    Returns:
      A tokenizer with [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4, then the alphabet, its "##"
      continuations and the learned pieces.

    Raises:
      TokenizerError: vocab_size too small, or no sentences.
    """
    if vocab_size <= len(SPECIAL_TOKENS):
        raise TokenizerError(
            f"vocab_size {vocab_size} is too small: it must exceed the {len(SPECIAL_TOKENS)} special tokens"
        )
    counter = _SentenceCounter(documents)
    tokenizer = bert_pipeline({}, lowercase, lowercase)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        limit_alphabet=limit_alphabet,
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tokenizer.train_from_iterator(counter.batches(), trainer=trainer)
    if not counter.sentences:
        raise TokenizerError("no sentences to train the vocab on: the corpus is empty")
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.__getitem__)
    # The trained pipeline registers the specials as "added tokens", matched in raw text;
    # rebuilding from the plain vocab keeps BERT's behaviour, identical to a reloaded vocab.
    return WordPieceTokenizer(tokens, lowercase=lowercase, source="the trained vocab")


def train_bpe(
    documents: Iterable[Sequence[str]], vocab_size: int, *, min_frequency: int = 2
) -> ByteLevelBPETokenizer:
    """Learns a byte-level BPE vocab (GPT-2 style) from documents, streaming.

    Returns:
      A tokenizer with <s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4 (RoBERTa's published vocab puts
      <mask> last, at 50264; ids are always looked up), then the 256 byte symbols and merges.

    Raises:
      TokenizerError: vocab_size cannot hold the specials and the 256 byte symbols, or no sentences.
    """
    smallest = len(BPE_SPECIAL_TOKENS) + 256
    if vocab_size <= smallest:
        raise TokenizerError(
            f"vocab_size {vocab_size} is too small: byte-level BPE needs more than {smallest} "
            "(5 specials + 256 bytes)"
        )
    # Trained on the texts `encode_documents` encodes, so "ĠThe" is counted where it will occur.
    counter = _SentenceCounter(ByteLevelBPETokenizer.sentence_texts(doc) for doc in documents)
    tokenizer = hf_tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(BPE_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(counter.batches(), trainer=trainer)
    if not counter.sentences:
        raise TokenizerError("no sentences to train the vocab on: the corpus is empty")
    model = json.loads(tokenizer.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return ByteLevelBPETokenizer(model["vocab"], merges, source="the trained vocab")


def train_sentencepiece(
    documents: Iterable[Sequence[str]],
    vocab_size: int = 30000,
    *,
    lowercase: bool = True,
    character_coverage: float = 0.99995,
) -> SentencePieceTokenizer:
    """Learns a unigram SentencePiece model with ALBERT's spm_train flags, on text normalised by
    `albert_preprocess` (so training and encoding see the same text).

    Returns:
      A tokenizer with <pad>=0 <unk>=1 [CLS]=2 [SEP]=3 [MASK]=4, the user symbols
      ( ) " - . – £ € next, then the learned pieces.

    Raises:
      TokenizerError: no sentences, or vocab_size larger than the corpus supports.
    """
    model = _train_unigram(
        documents,
        lowercase,
        vocab_size=vocab_size,
        pad_id=0,
        unk_id=1,
        bos_id=-1,
        eos_id=-1,
        control_symbols=list(SP_CONTROL_SYMBOLS),
        user_defined_symbols=list(SP_USER_SYMBOLS),
        character_coverage=character_coverage,
    )
    return SentencePieceTokenizer(model, lowercase=lowercase, source="the trained model")


def train_xlnet_sentencepiece(
    documents: Iterable[Sequence[str]],
    vocab_size: int = 32000,
    *,
    lowercase: bool = False,
    character_coverage: float = 0.99995,
) -> XLNetTokenizer:
    """Learns a unigram SentencePiece model with XLNet's spm_train flags (zihangdai/xlnet
    README), on text prepared as XLNet prepares it (the same as ALBERT's `albert_preprocess`).

    Returns:
      A tokenizer with <unk>=0 <s>=1 </s>=2 <cls>=3 <sep>=4 <pad>=5 <mask>=6 <eod>=7 <eop>=8,
      the user symbols . ( ) " - – £ € next, then the learned pieces (cased by default, as
      the published XLNets).

    Raises:
      TokenizerError: no sentences, or vocab_size larger than the corpus supports.
    """
    model = _train_unigram(
        documents,
        lowercase,
        vocab_size=vocab_size,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        control_symbols=list(XLNET_CONTROL_SYMBOLS),
        user_defined_symbols=list(XLNET_USER_SYMBOLS),
        character_coverage=character_coverage,
    )
    return XLNetTokenizer(model, lowercase=lowercase, source="the trained model")


def _train_unigram(documents: Iterable[Sequence[str]], lowercase: bool, **flags) -> bytes:
    """A unigram spm model (serialized) trained on the documents' sentences, each prepared by
    `albert_preprocess`, with spm_train `flags`."""
    sentences = 0

    def normalised() -> Iterator[str]:
        nonlocal sentences
        for document in documents:
            for sentence in document:
                sentences += 1
                yield albert_preprocess(sentence, lowercase)

    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=normalised(),
            model_writer=model,
            model_type="unigram",
            shuffle_input_sentence=True,
            input_sentence_size=10_000_000,
            minloglevel=2,
            **flags,
        )
    except RuntimeError as e:
        if not sentences:
            raise TokenizerError("no sentences to train the vocab on: the corpus is empty") from None
        raise TokenizerError(f"SentencePiece training failed: {str(e).strip().splitlines()[-1]}") from None
    return model.getvalue()


@dataclasses.dataclass(frozen=True)
class TrainableKind:
    """How `python -m data.tokenizers train --kind=KIND` makes one kind of vocab."""

    trainer: Callable[..., Tokenizer]  # trainer(documents, vocab_size, **options)
    # The command's options (lowercase, min_frequency, limit_alphabet) that the trainer takes.
    options: tuple[str, ...]
    written: str  # the file the command's output line names
    default_vocab_size: int  # the published vocab's size
    name: str  # the kind in messages

    @property
    def cased_applies(self) -> bool:
        """Whether --cased applies: the trainer makes uncased or cased vocabs (else the kind
        always keeps case)."""
        return "lowercase" in self.options

    def train(self, documents: Iterable[Sequence[str]], vocab_size: int, **options) -> Tokenizer:
        """The trainer on `documents`, given those of the command's `options` it takes."""
        return self.trainer(documents, vocab_size, **{name: options[name] for name in self.options})


TRAINABLE_KINDS = {
    "wordpiece": TrainableKind(
        train_wordpiece,
        options=("lowercase", "min_frequency", "limit_alphabet"),
        written=VOCAB_FILE,
        default_vocab_size=30522,
        name="WordPiece",
    ),
    "bpe": TrainableKind(
        train_bpe,
        options=("min_frequency",),
        written=BPE_VOCAB_FILE,
        default_vocab_size=50265,
        name="byte-level BPE",
    ),
    "sentencepiece": TrainableKind(
        train_sentencepiece,
        options=("lowercase",),
        written=SP_MODEL_FILE,
        default_vocab_size=30000,
        name="SentencePiece",
    ),
    "xlnet_spm": TrainableKind(
        train_xlnet_sentencepiece,
        options=("lowercase",),
        written=SP_MODEL_FILE,
        default_vocab_size=32000,
        name="XLNet SentencePiece",
    ),
}
KINDS = tuple(TRAINABLE_KINDS)  # the kinds `train` makes
