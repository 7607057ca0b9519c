"""A pretraining tree as the code that reads it without training it sees it: fine-tuning,
export, feature extraction and fill-mask.

BERT's tree (models/pretraining.py: `encoder`, `mlm_head`, ...) is read as it is. A family
whose tree holds something elsewhere says how to read it in its own module, and this
module asks each in turn, so no reader asks which family it holds:

- `for_readers`: DeBERTa-v3's discriminator keeps a GDES delta instead of a word table;
  every reader gets the plain tree (models/deberta_rtd.py `fold_gdes`).
- `masked_lm`: XLNet's predicts through its query stream (models/xlnet.py `masked_lm`);
  the masked LM of ELECTRA and DeBERTa-v3 is the generator (models/electra.py,
  models/deberta_rtd.py `generator_masked_lm`); BERT's is `encoder` + `mlm_head`, through
  DeBERTa's enhanced mask decoder when its tree has the decoder's position table
  (models/deberta.py).
- `encoder_for_finetuning`: an encoder tree without the arrays only pretraining reads
  (DeBERTa's mask-decoder position table).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn

from models import deberta, deberta_rtd, electra, xlnet
from models.encoder import EncoderConfig
from models.heads import NoMaskedLMError
from models.pretraining import BertPretrainingModel

Tree = Mapping[str, Any]

# Each takes a tree and returns it as readers expect it (unchanged when not its family's).
_READER_FOLDS: tuple[Callable[[Tree], dict[str, Any]], ...] = (deberta_rtd.fold_gdes,)
# Families whose masked LM is a model of their own: each returns (module, its params) for its
# own trees and None for others.
_OWN_MASKED_LMS: tuple[Callable[[EncoderConfig, Tree], tuple[nn.Module, dict] | None], ...] = (
    xlnet.masked_lm,
)
# Families whose masked LM is not `encoder` + `mlm_head`, the most specific first: each
# returns (config, {encoder, mlm_head}) for its own trees and None for others.
_GENERATOR_MASKED_LMS: tuple[Callable[[EncoderConfig, Tree], tuple[EncoderConfig, dict] | None], ...] = (
    deberta_rtd.generator_masked_lm,
    electra.generator_masked_lm,
)


def for_readers(params: Tree) -> dict[str, Any]:
    """`params` (a pretraining tree of NumPy or jax arrays) as every reader expects it."""
    tree = dict(params)
    for fold in _READER_FOLDS:
        tree = fold(tree)
    return tree


def masked_lm(config: EncoderConfig, params: Tree) -> tuple[nn.Module, dict[str, Any]]:
    """The masked LM inside a pretraining tree: (module, its params). The module is a
    BertPretrainingModel without pooler or sentence head (XLNet's: its own, the same call):
    `module.apply({"params": p},
    batch, deterministic=True)["mlm_logits"]` is [B, P, V] float32 for a batch of int32
    `input_ids`, `input_mask`, `segment_ids` [B, L] and `masked_lm_positions` [B, P].

    Raises:
      NoMaskedLMError: the tree has no masked-LM head (e.g. imported from BertModel).
    """
    own = next((f for f in (view(config, params) for view in _OWN_MASKED_LMS) if f), None)
    if own is not None:
        return own
    found = next((f for f in (view(config, params) for view in _GENERATOR_MASKED_LMS) if f), None)
    if found is not None:
        config, params = found
    if "mlm_head" not in params:
        raise NoMaskedLMError(
            "the workdir has no MLM head (it was imported from a model without one, e.g. BertModel): "
            "fill-mask needs it"
        )
    # The MLM head does not read the pooler: left out, whether the model has one or not.
    encoder = {k: v for k, v in params["encoder"].items() if k != "pooler"}
    module = BertPretrainingModel(
        dataclasses.replace(config, pooler=False),
        sentence_head=False,
        enhanced_mask_decoder=deberta.has_mask_decoder_table(config, encoder),
    )
    return module, {"encoder": encoder, "mlm_head": params["mlm_head"]}


def encoder_for_finetuning(config: EncoderConfig, encoder: Tree) -> dict[str, Any]:
    """A pretrained `encoder` tree without the arrays that only pretraining reads."""
    return deberta.encoder_for_finetuning(config, encoder)
