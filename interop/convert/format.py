"""`ModelFormat`: how one published model family is laid out and configured in transformers
folders (and TF1 checkpoints), and the conversion every family shares: config.json <->
EncoderConfig, their tensors <-> our parameter tree.

A family's module (bert.py, roberta.py, albert.py, electra.py, deberta.py, xlnet.py) builds its
format from its name table and overrides the hooks where its family differs: extra
config.json keys, arrays a file may lack, heads, the tokenizer files, a generator. The
code that reads and writes folders (hf.py, tf1.py) only calls the hooks.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import flax.linen as nn
import numpy as np
import tensorflow as tf
from flax import traverse_util

from data import tokenizers
from interop.convert.layout import ConversionError, Module, Param, expand
from models.encoder import EncoderConfig
from models.pretraining import abstract_params, resize_vocab_rows

log = logging.getLogger("convert")

# Optional parts of a published model, each all-or-nothing: BertModel has no heads,
# BertForMaskedLM no pooler and no NSP head, BertForPreTraining everything. ELECTRA's
# discriminator head comes with ElectraForPreTraining, its generator (the top-level
# `generator` and `generator_head`) from a second folder, an ElectraForMaskedLM.
# DeBERTa-v3's replaced-token-detection head (`rtd_head`) is in the original's checkpoints
# (mask_predictions.*) though no transformers class reads it. XLNet's `plm_head` (the query
# stream's start and the LM bias) comes with XLNetLMHeadModel.
OPTIONAL_GROUPS = (
    "pooler",
    "mlm_head",
    "sentence_head",
    "discriminator_head",
    "generator",
    "rtd_head",
    "plm_head",
)
# HF `hidden_act` -> ours. gelu_new / gelu_pytorch_tanh are the tanh approximation.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
OUR_ACTIVATIONS_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new"}


def read_json(path: str, where: str) -> dict:
    """A JSON object file (config.json, tokenizer_config.json, ...); one-line errors."""
    try:
        with tf.io.gfile.GFile(path) as f:
            value = json.load(f)
    except json.JSONDecodeError as e:
        raise ConversionError(f"{where}: {os.path.basename(path)} is not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise ConversionError(f"{where}: {os.path.basename(path)} is not a JSON object")
    return value


def encoder_config(
    fields: Mapping[str, Any], hidden_act: str, where: str, name: str, **extra
) -> EncoderConfig:
    """EncoderConfig from the keys that HF and TF configs share (HF's names)."""
    try:
        return EncoderConfig(
            vocab_size=fields["vocab_size"],
            hidden_size=fields["hidden_size"],
            num_layers=fields["num_hidden_layers"],
            num_heads=fields["num_attention_heads"],
            intermediate_size=fields["intermediate_size"],
            max_position_embeddings=fields.get("max_position_embeddings", 512),
            type_vocab_size=fields.get("type_vocab_size", 2),
            dropout_rate=fields.get("hidden_dropout_prob", 0.1),
            attention_dropout_rate=fields.get("attention_probs_dropout_prob", 0.1),
            hidden_act=hidden_act,
            initializer_range=fields.get("initializer_range", 0.02),
            **extra,
        )
    except KeyError as e:
        raise ConversionError(f"{where}: {name} has no {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise ConversionError(f"{where}: {name}: {e}") from None


def tree_shapes(tree: Any) -> dict[tuple[str, ...], tuple[int, ...]]:
    """{path: shape} of an abstract (or real) parameter tree, boxes removed."""
    return {path: tuple(x.shape) for path, x in traverse_util.flatten_dict(nn.meta.unbox(tree)).items()}


def present_groups(params: Mapping[str, Any]) -> list[str]:
    """The optional groups a parameter tree has, in OPTIONAL_GROUPS order (the pooler is
    under `encoder`, the others are top-level subtrees)."""
    return [g for g in OPTIONAL_GROUPS if g in params or g in params.get("encoder", {})]


def renamed(name: str, pairs: Sequence[tuple[str, str]]) -> str:
    """`name` with the prefix of the first (from, to) pair it starts with replaced."""
    return next((to + name[len(prefix) :] for prefix, to in pairs if name.startswith(prefix)), name)


@dataclasses.dataclass(frozen=True)
class ModelFormat:
    """How one published model family is laid out in HF folders and TF1 checkpoints.

    The base class is BERT's behaviour wherever a hook has one; families override hooks.
    """

    model_type: str  # HF config.json `model_type`
    hf_base: str  # the encoder prefix in HF models with heads
    table: tuple[Module, ...]
    # HF names that duplicate a tied parameter: stored copy -> the name it must equal.
    hf_tied: Mapping[str, str]
    # HF class for config.json's "architectures" by head, the class with the most heads
    # first; under None the bare model's. A None class: transformers has no such model.
    hf_classes: Mapping[str | None, str | None]
    # Older HF names of the table's arrays, (old prefix, the table's prefix), the most specific
    # first: imports read either (DeBERTa's legacy=True MLM head, `cls.predictions.*`).
    hf_renamed: tuple[tuple[str, str], ...] = ()
    # The config file of the family's original TF1 checkpoints (None: it has none).
    tf_config_file: str | None = None

    def hf_architecture(self, groups: Iterable[str]) -> str | None:
        """The HF class with exactly these heads (None: transformers has none, e.g. RoBERTa
        with a sentence head)."""
        groups = set(groups)
        return next(cls for head, cls in self.hf_classes.items() if head is None or head in groups)

    def expand(self, framework: str, num_layers: int, hf_base: str = "") -> list[Param]:
        """The name table as one `Param` per array, for "hf" or "tf"."""
        return expand(self.table, self.model_type, framework, num_layers, hf_base)

    # --- recognising a config (export) ---------------------------------------------------

    #: What a config needs to be of this family, for the error when none is (`describes`).
    layout: str = ""

    def describes(self, config: EncoderConfig) -> bool:
        """Whether `config` has this family's layout (export picks the format by it). Asked
        in the registry's order, the most specific family first (formats.py), so a family
        may take for granted that those before it declined."""
        return False

    # --- config.json -> EncoderConfig ----------------------------------------------------

    def untyped_config(self, hf: Mapping[str, Any]) -> bool:
        """Whether a config.json without model_type may be this family's (old folders that
        wrote none); the weights decide (`untyped_weights`)."""
        return False

    def untyped_weights(self, tensors: Mapping[str, np.ndarray], other_prefixes: Iterable[str]) -> bool:
        """Whether an untyped folder's weights are this family's, given the encoder prefixes
        of the other families."""
        return False

    def hf_refusals(self, hf: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
        """config.json keys whose other values we cannot reproduce: key -> (wanted, why)."""
        return {
            "position_embedding_type": ("absolute", "this encoder has learned absolute positions only"),
            "is_decoder": (False, "this is an encoder-only codebase"),
            "add_cross_attention": (False, "this is an encoder-only codebase"),
            "tie_word_embeddings": (True, "our MLM decoder is tied to the word embeddings"),
        }

    #: The family's transformers defaults for config.json keys a file may leave out.
    hf_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def hf_options(self, hf: Mapping[str, Any], where: str) -> dict[str, Any]:
        """The family's EncoderConfig fields beyond the shared ones (refusing what our
        encoder cannot express)."""
        return {}

    def config_from_hf(self, hf: Mapping[str, Any], where: str) -> EncoderConfig:
        """EncoderConfig of an HF config.json of this family."""
        act = self.checked_activation(hf, "hidden_act", where)
        hf = {**self.hf_defaults, **hf}
        extra = {"layer_norm_eps": hf.get("layer_norm_eps", 1e-12), **self.hf_options(hf, where)}
        return encoder_config(hf, act, where, "config.json", **extra)

    def checked_activation(self, hf: Mapping[str, Any], key: str, where: str) -> str:
        """Refuses config.json values we cannot reproduce (`hf_refusals`); returns our name of
        its activation (under `key`, "gelu" when absent)."""
        for name, (wanted, why) in self.hf_refusals(hf).items():
            if name in hf and hf[name] != wanted:
                raise ConversionError(f"{where}: config.json {name}={hf[name]!r} is not supported: {why}")
        act = hf.get(key, "gelu")
        if act not in HF_ACTIVATIONS:
            raise ConversionError(
                f"{where}: config.json {key}={act!r} is not supported: use one of {sorted(HF_ACTIVATIONS)}"
            )
        return HF_ACTIVATIONS[act]

    # --- TF1 config -> EncoderConfig -----------------------------------------------------

    #: The activation the original TF1 code applies for "gelu".
    tf_activation: str = "gelu"

    def tf_options(self, tf_config: Mapping[str, Any], where: str) -> dict[str, Any]:
        """The family's EncoderConfig fields from its TF1 config file."""
        return {}

    # --- their arrays -> our tree --------------------------------------------------------

    def our_shapes(self, config: EncoderConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
        """Shape of every array a file of this family may hold, in our tree (BERT: the full
        pretraining model, pooler and sentence head included). Allocates nothing."""
        return tree_shapes(abstract_params(config))

    def optional_arrays(self, config: EncoderConfig) -> set[tuple[str, ...]]:
        """Arrays of the encoder that a file may lack, in which case our tree lacks them too
        (absent rather than random)."""
        return set()

    def check_hf_tensors(self, tensors: Mapping[str, np.ndarray], where: str) -> None:
        """Refuses a folder of this model_type that is not the model a workdir holds."""

    def imported_config(self, config: EncoderConfig, groups: Sequence[str]) -> EncoderConfig:
        """The config recorded for an imported model with these optional groups."""
        return config

    def build_params(
        self,
        params_spec: list[Param],
        read: Callable[[str], np.ndarray],
        names: set[str],
        config: EncoderConfig,
        where: str,
        what: str,
        config_name: str,
    ) -> tuple[dict[str, Any], list[str], set[str]]:
        """Our parameter tree from a checkpoint's arrays.

        Args:
          params_spec: `expand(...)`; read: name -> array; names: every name in the source.
          where: the source in error messages ("hf:DIR"); what: "tensor" or "variable";
          config_name: the config file the shapes came from ("config.json").
        Returns:
          (nested params, optional groups present, the source names used).
        Raises:
          ConversionError: a required array is missing or has the wrong shape.
        """
        shapes = self.our_shapes(config)
        by_group: dict[str, list[Param]] = {}
        # Rows of arrays this config does not have (ELECTRA's embeddings_project when E = H).
        for p in (p for p in params_spec if p.ours in shapes):
            by_group.setdefault(p.group, []).append(p)
        flat, groups, used = {}, [], set()
        for group, members in by_group.items():
            present = [p for p in members if p.theirs in names]
            if group != "encoder" and not present:
                continue
            for p in members:
                if p.theirs not in names:
                    raise ConversionError(
                        f"{where}: the checkpoint has no {what} '{p.theirs}' (for our {'/'.join(p.ours)}): "
                        f"is {config_name} the config of this checkpoint?"
                    )
                array = read(p.theirs)
                expected = p.their_shape(shapes[p.ours])
                if tuple(array.shape) != expected:
                    raise ConversionError(
                        f"{where}: {what} '{p.theirs}' has shape {tuple(array.shape)} but {config_name} "
                        f"implies {expected}: the weights do not belong to this config"
                    )
                flat[p.ours] = p.to_ours(np.asarray(array), shapes[p.ours])
                used.add(p.theirs)
            if group != "encoder":
                groups.append(group)
        return traverse_util.unflatten_dict(flat), sorted(groups, key=OPTIONAL_GROUPS.index), used

    def params_from_hf(
        self, config: EncoderConfig, tensors: Mapping[str, np.ndarray], where: str
    ) -> tuple[dict[str, Any], list[str]]:
        """Our params and optional groups from an HF folder's tensors (by current HF names)."""
        # Models with heads prefix the encoder ("bert."), the bare model (BertModel) does not.
        base = self.hf_base if any(k.startswith(self.hf_base) for k in tensors) else ""
        stored, tensors = tensors, self._current_names(tensors, where)
        # Arrays the file may lack (DeBERTa's position table) are left out of the tree then.
        optional = self.optional_arrays(config)
        spec = [
            p
            for p in self.expand("hf", config.num_layers, hf_base=base)
            if p.ours not in optional or p.theirs in tensors
        ]
        params, groups, used = self.build_params(
            spec, tensors.__getitem__, set(tensors), config, where, "tensor", "config.json"
        )
        for copy, original in self.hf_tied.items():  # under the stored names (tied copies keep theirs)
            original = original.format(base=base)
            if copy in stored:
                if original in stored and not np.array_equal(stored[copy], stored[original]):
                    raise ConversionError(
                        f"{where}: {copy} differs from {original}: untied MLM decoders are not supported "
                        "(our decoder is the word embedding matrix)"
                    )
                used.add(copy)
        unread = [k for k in tensors if k not in used and not k.endswith("position_ids")]
        warn_ignored(where, "tensors", unread)
        return params, groups

    def _current_names(self, tensors: Mapping[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
        """`tensors` with older names (`hf_renamed`) replaced by the table's."""
        current: dict[str, np.ndarray] = {}
        for name, array in tensors.items():
            new = renamed(name, self.hf_renamed)
            if new in current:
                raise ConversionError(
                    f"{where}: holds '{new}' twice, under that name and an older one: which is the model's?"
                )
            current[new] = array
        return current

    # --- tokenizer files -----------------------------------------------------------------

    #: The tokenizer backend of the family's folders: what its files load as
    #: (`read_tokenizer`), and whose conventions (special token names, pair format,
    #: word-start rule) a folder's tokenizer.json is read with when it has no such files
    #: (tokenizer_files.py). BERT's: WordPiece.
    tokenizer_class: type = tokenizers.WordPieceTokenizer

    def has_tokenizer_files(self, directory: str) -> bool:
        """Whether a model folder has the family's own tokenizer files (`read_tokenizer`); a
        transformers 5 folder has only tokenizer.json. BERT's: vocab.txt."""
        return os.path.exists(os.path.join(directory, tokenizers.VOCAB_FILE))

    def read_tokenizer(self, directory: str, settings: Mapping[str, Any], where: str) -> tokenizers.Tokenizer:
        """The family's tokenizer files in a model folder; `settings`: its HF
        tokenizer_config.json ({} without one). BERT's: vocab.txt, casing from the settings,
        else inferred from the vocab."""
        vocab = os.path.join(directory, tokenizers.VOCAB_FILE)
        if not os.path.exists(vocab):
            raise ConversionError(
                f"{where}: no {tokenizers.VOCAB_FILE}: a BERT folder needs its WordPiece vocab"
            )
        return tokenizers.WordPieceTokenizer.from_vocab_file(
            vocab, lowercase=settings.get("do_lower_case"), strip_accents=settings.get("strip_accents")
        )

    # --- a second tower published as its own folder (ELECTRA's, DeBERTa-v3's generator) ---

    #: The family's name in messages about its generator; "" = the family has none.
    generator_family: str = ""

    def read_generator(
        self, directory: str, config: EncoderConfig, params: Mapping[str, Any], where: str
    ) -> dict[str, Any]:
        """The generator's top-level subtrees from its own HF folder, for the model of `config`
        with `params` read from `where`."""
        raise ConversionError(f"{where}: --generator_from is for ELECTRA, this is a {self.model_type} model")

    def generator_model(
        self, config: EncoderConfig, params: Mapping[str, Any]
    ) -> tuple[ModelFormat, EncoderConfig, dict[str, Any]]:
        """The generator of a workdir's tree as a model of its own: (its format, config, tree)."""
        raise ConversionError(f"a {self.model_type} model has no generator to write to --generator_to")

    # --- our tree -> their files ---------------------------------------------------------

    def check_export(self, config: EncoderConfig, groups: set[str], pad_id: int) -> None:
        """Refuses a model this family's transformers classes cannot express."""

    def hf_tensor_names(self, tensors: dict[str, np.ndarray], config: EncoderConfig) -> dict[str, np.ndarray]:
        """The exported tensors under the names this config's transformers class reads."""
        return tensors

    def hf_config_keys(self, config: EncoderConfig, groups: set[str]) -> dict[str, Any]:
        """The family's own config.json keys of an export."""
        return {"position_embedding_type": "absolute"}

    def hf_files(
        self, config: EncoderConfig, params: Mapping[str, Any], pad_id: int
    ) -> tuple[dict, dict[str, np.ndarray]]:
        """(config.json contents, tensors by HF name) of our config and parameters."""
        flat = traverse_util.flatten_dict(resize_vocab_rows(params, config.vocab_size))  # no padding rows
        spec = self.expand("hf", config.num_layers, hf_base=self.hf_base)
        known = {p.ours for p in spec}
        groups = set(present_groups(params))
        if self.hf_architecture(groups) is None:
            # RoBERTa has no sentence head in HF; the rest of the model is still exported.
            log.warning(
                "the sentence head has no %s counterpart in transformers: not exported", self.model_type
            )
            groups.discard("sentence_head")
            known |= {k for k in flat if k[0] == "sentence_head"}
        self.check_export(config, groups, pad_id)
        unknown = sorted("/".join(k) for k in flat if k not in known)
        if unknown:
            raise ConversionError(f"parameters with no HF {self.model_type} name: {unknown[:5]}")
        tensors: dict[str, np.ndarray] = {}
        for p in (p for p in spec if p.ours in flat):  # DeBERTa v1's in_proj: three parts, one tensor
            tensors[p.theirs] = p.to_theirs(np.asarray(flat[p.ours]), tensors.get(p.theirs))
        return self.hf_config(config, groups, pad_id), self.hf_tensor_names(tensors, config)

    def hf_config(self, config: EncoderConfig, groups: set[str], pad_id: int) -> dict[str, Any]:
        """config.json of an export with these optional groups: BERT's keys and the family's
        own (`hf_config_keys`); a family with keys of its own naming (XLNet) overrides it."""
        return {
            "architectures": [self.hf_architecture(groups)],
            "model_type": self.model_type,
            "vocab_size": config.vocab_size,
            "hidden_size": config.hidden_size,
            "num_hidden_layers": config.num_layers,
            "num_attention_heads": config.num_heads,
            "intermediate_size": config.intermediate_size,
            "max_position_embeddings": config.max_position_embeddings,
            "type_vocab_size": config.type_vocab_size,
            "hidden_dropout_prob": config.dropout_rate,
            "attention_probs_dropout_prob": config.attention_dropout_rate,
            "hidden_act": OUR_ACTIVATIONS_TO_HF[config.hidden_act],
            "layer_norm_eps": config.layer_norm_eps,
            "initializer_range": config.initializer_range,
            "pad_token_id": pad_id,
            "tie_word_embeddings": True,
            **self.hf_config_keys(config, groups),
        }


def warn_ignored(where: str, what: str, names: Iterable[str]) -> None:
    """One warning naming the first few checkpoint entries no parameter of ours reads."""
    ignored = sorted(names)
    if ignored:
        log.warning(
            "%s: ignoring %d %s that are not part of the pretraining model: %s",
            where,
            len(ignored),
            what,
            ", ".join(ignored[:6]),
        )
