"""A pretrained model as the rest of the codebase sees it: config, parameters, tokenizer.

Reads and writes model workdirs (the layout is core/workdir.py): GLUE fine-tuning
(`--init_checkpoint`), checkpoint export, feature extraction, fill-mask and continued
pretraining (`run.init_from`) all go through `load_pretrained`, so they never need the
gin files of the run. The parameters are those of the pretraining tree; its `encoder`
subtree is the model every later stage uses (every objective keeps the encoder to
fine-tune there).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import tensorflow as tf
from flax import traverse_util

from core import workdir as workdir_lib
from core.workdir import TOKENIZER_DIR, WorkdirError
from data import shards, tokenizers
from models.deberta_rtd import fold_gdes
from models.encoder import EncoderConfig
from models.pretraining import VOCAB_ROWS, resize_vocab_rows

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Pretrained:
    """A pretrained model as plain host data.

    params: the PretrainingModel parameter tree ({'encoder', 'mlm_head', ['sentence_head']},
      or ELECTRA's {'encoder', 'discriminator_head', ['generator', 'generator_head']}) as
      float NumPy arrays, whatever mesh it was trained on.
    """

    config: EncoderConfig
    params: dict[str, Any]
    tokenizer: tokenizers.Tokenizer
    step: int


def write_model_info(workdir: str, config: EncoderConfig, data_dir: str) -> None:
    """Records the model config and copies the shards' tokenizer into the workdir."""
    workdir_lib.write_config(workdir, config)
    source = os.path.join(data_dir, shards.TOKENIZER_DIR)
    if tf.io.gfile.isdir(source):
        tokenizers.load_tokenizer(source).save(os.path.join(workdir, TOKENIZER_DIR))


def save_pretrained(
    workdir: str,
    config: EncoderConfig,
    params: dict[str, Any],
    tokenizer: tokenizers.Tokenizer,
    step: int = 0,
) -> None:
    """Writes a workdir that `load_pretrained` reads: config, tokenizer and params only.

    Used by checkpoint import and by tests; pretraining writes the full train state
    through core/checkpointing.py, whose `params` subtree is read the same way.
    """
    workdir_lib.write_config(workdir, config)
    tokenizer.save(os.path.join(workdir, TOKENIZER_DIR))
    workdir_lib.save_params(workdir, params, step)


def load_model_config(workdir: str) -> EncoderConfig:
    return workdir_lib.read_config(workdir, EncoderConfig)


def load_pretrained(workdir: str, step: int | None = None) -> Pretrained:
    """Config, parameters and tokenizer of a pretraining (or imported) workdir."""
    config = load_model_config(workdir)
    tokenizer_dir = os.path.join(workdir, TOKENIZER_DIR)
    if not tf.io.gfile.isdir(tokenizer_dir):
        raise WorkdirError(
            f"no {TOKENIZER_DIR}/ in '{workdir}': the workdir was not written by pretrain.train"
        )
    tokenizer = tokenizers.load_tokenizer(tokenizer_dir)
    if not vocab_fits(tokenizer, config.vocab_size):
        raise WorkdirError(
            f"'{workdir}': tokenizer has {tokenizer.vocab_size} entries but the model {config.vocab_size}"
        )
    params, step = workdir_lib.load_params(workdir, step)
    # A DeBERTa-v3 workdir's discriminator holds a GDES delta: every reader gets the plain
    # encoder tree (its word table = the generator's + the delta).
    return Pretrained(config=config, params=fold_gdes(params), tokenizer=tokenizer, step=step)


def vocab_fits(tokenizer: tokenizers.Tokenizer, vocab_size: int) -> bool:
    """Whether a tokenizer belongs to a model with `vocab_size` rows: the same size, or for
    DeBERTa's tokenizers no more (the published DeBERTa-v2/v3 tables have 128100 rows for
    128001 tokens: spare rows that no id reaches)."""
    if isinstance(tokenizer, tokenizers.DEBERTA_TOKENIZERS):  # not identity(): it hashes the vocab
        return tokenizer.vocab_size <= vocab_size
    return tokenizer.vocab_size == vocab_size


def electra_generator(
    config: EncoderConfig, params: Mapping[str, Any]
) -> tuple[EncoderConfig, dict[str, Any]]:
    """ELECTRA's generator (models/electra.py) as a masked-LM model of its own, the form of
    transformers' ElectraForMaskedLM: its EncoderConfig and a BertPretrainingModel tree
    {encoder: the shared embeddings + the generator's projection and layers, mlm_head:
    generator_head}, for the ELECTRA tree `params` of the discriminator's `config`.

    BertPretrainingModel(that config, sentence_head=False) computes what
    ElectraPretrainingModel's generator does: the same embedding block (its config keeps the
    discriminator's embedding width, vocab, positions and types), then the generator's own
    E -> H_g projection (when E != H_g), layers and head. The workdir records only the
    discriminator's config, so the generator's shape is read from its layer_0: H_g and N
    from the query kernel [H_g, N, D], F from the intermediate kernel [H_g, F].
    """
    generator = params["generator"]
    hidden, heads, _ = np.shape(generator["layer_0"]["attention"]["query"]["kernel"])
    generator_config = dataclasses.replace(
        config,
        hidden_size=hidden,
        num_heads=heads,
        intermediate_size=np.shape(generator["layer_0"]["intermediate"]["kernel"])[1],
        num_layers=sum(name.startswith("layer_") for name in generator),
        embedding_size=config.embedding_width,
        pooler=False,
    )
    tree = {
        "encoder": {"embeddings": params["encoder"]["embeddings"], **generator},
        "mlm_head": params["generator_head"],
    }
    return generator_config, tree


def deberta_generator(
    config: EncoderConfig, params: Mapping[str, Any]
) -> tuple[EncoderConfig, dict[str, Any]]:
    """DeBERTa-v3's generator (models/deberta_rtd.py) as a DeBERTa masked-LM model of its own,
    the form of transformers' DebertaV2ForMaskedLM: its EncoderConfig (the discriminator's,
    with the generator's depth, read from the tree) and a BertPretrainingModel tree {encoder:
    `generator` (its own word and position tables), mlm_head: `generator_head`}, to run with
    the enhanced mask decoder."""
    generator = params["generator"]
    layers = sum(1 for name in generator if name.startswith("layer_"))
    generator_config = dataclasses.replace(config, num_layers=layers, pooler=False)
    return generator_config, {"encoder": generator, "mlm_head": params["generator_head"]}


def warm_start_params(init_from: str, params: Any, shardings: Any, manifest: shards.Manifest) -> Any:
    """`params` (the fresh, sharded pretraining tree) with every parameter `init_from` has:
    continued pretraining from one of our workdirs or an imported published model.

    A parameter the source lacks (an imported `BertModel` has no MLM or NSP head, RoBERTa no
    sentence head) keeps its fresh init, with a log line; a parameter of another shape, or
    one the model does not have, is an error, as is a tokenizer other than the shards'.
    Returns the tree with each array placed with its sharding.
    """
    source_identity = _tokenizer_identity(init_from)
    shards_identity = manifest.tokenizer or None
    if shards_identity is not None and source_identity != shards_identity:
        raise WorkdirError(
            f"run.init_from '{init_from}' has another tokenizer than the shards "
            f"({source_identity.get('kind')} {source_identity.get('vocab_size')} vs "
            f"{shards_identity.get('kind')} {shards_identity.get('vocab_size')}): preprocess the "
            f"corpus with --tokenizer={os.path.join(init_from, TOKENIZER_DIR)}"
        )
    source, step = workdir_lib.load_params(init_from)
    target = traverse_util.flatten_dict(params)
    # Another vocab_pad_multiple only adds or drops rows that are never used.
    rows = {target[p].shape[0] for p in VOCAB_ROWS if p in target}
    table = traverse_util.flatten_dict(source).get(VOCAB_ROWS[0])
    if len(rows) == 1 and table is not None and table.shape[0] >= manifest.vocab_size:
        source = resize_vocab_rows(source, rows.pop())
    source = traverse_util.flatten_dict(source)
    target_shardings = traverse_util.flatten_dict(shardings)
    unused = sorted("/".join(p) for p in source if p not in target)
    if unused:
        raise WorkdirError(
            f"run.init_from '{init_from}' has parameters the model does not: {unused[:3]}: "
            "use its model_config.json (the same EncoderConfig) for this run"
        )
    loaded, fresh = {}, []
    for path, value in target.items():
        if path not in source:
            fresh.append("/".join(path))
            loaded[path] = value
            continue
        stored = np.asarray(source[path])
        if stored.shape != value.shape:
            raise WorkdirError(
                f"run.init_from '{init_from}': {'/'.join(path)} has shape {stored.shape}, the model "
                f"wants {value.shape}: use its model_config.json (the same EncoderConfig) for this run"
            )
        loaded[path] = jax.device_put(stored.astype(value.dtype), target_shardings[path])
    if fresh:
        log.info(
            "run.init_from %s (step %d) has no %s: these start from a fresh init", init_from, step, fresh
        )
    return traverse_util.unflatten_dict(loaded)


def _tokenizer_identity(workdir: str) -> dict:
    """The identity() of a workdir's tokenizer (WorkdirError when it has none)."""
    tokenizer_dir = os.path.join(workdir, TOKENIZER_DIR)
    if not tf.io.gfile.isdir(tokenizer_dir):
        raise WorkdirError(
            f"no {TOKENIZER_DIR}/ in '{workdir}': pass a workdir of pretrain.train or models.convert"
        )
    return tokenizers.load_tokenizer(tokenizer_dir).identity()
