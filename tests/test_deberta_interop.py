"""DeBERTa interop with transformers (PyTorch, CPU): HF DebertaForMaskedLM (v1, fused
in_proj) and DebertaV2ForMaskedLM (v2/v3) folders <-> models/deberta.py's tree.

Small random transformers models (every weight random, not their init) are saved with
save_pretrained and imported; our encoder and MLM head, run on the imported tree, give
their last hidden state and MLM logits at the real tokens of a padded and a full row, at
length 10 (inside the relative span) and 30 (beyond the v2 buckets' reach of 16 and v1's
span of 16). Exports load back in transformers with the same outputs, and trees initialised
here survive export -> import bit for bit. The enhanced mask decoder, which transformers
does not have, is checked against the last HF layer applied twice as the original's
EnhancedMaskDecoder does. Max abs diffs are printed (pytest -s) and asserted <= 1e-5.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch  # requirements-test.txt: the reference implementation, CPU
import transformers
from flax import traverse_util
from safetensors.numpy import load_file, save_file
from transformers.models.deberta.modeling_deberta import scaled_size_sqrt

from data import tokenizers
from interop import bundle, convert
from interop.convert import cli as convert_cli
from models.backbone import encoder_module
from models.disentangled import DisentangledConfig
from models.encoder import EncoderConfig
from models.pretraining import BertPretrainingModel, example_batch, resize_vocab_rows
from tests import hf_parity, jitted

transformers.utils.logging.disable_progress_bar()
TOLERANCE = 1e-5  # max abs diff in float32; measured values are printed with -s
# The EMD's masked positions in each row of `hf_parity.inputs()` (row 0 has 7 real tokens).
POSITIONS = np.array([[1, 3, 5], [2, 6, 8]], np.int32)

# Tiny models of hf_parity.SIZE. v2 buckets: 4 buckets reaching 16, so relative positions
# beyond +-2 are log-bucketed at length 10 and saturate at length 30.
_COMMON = dict(
    **hf_parity.SIZE,
    relative_attention=True,
    max_relative_positions=16,
    position_biased_input=False,
    type_vocab_size=0,
    pos_att_type="p2c|c2p",
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    legacy=False,
)
_V2 = dict(position_buckets=4, norm_rel_ebd="layer_norm", share_att_key=True)  # as every v2/v3
# name -> (v1?, config overrides)
VARIANTS = {
    "v1": (True, {}),
    "v1_p2c_only": (True, dict(pos_att_type=["p2c"])),
    "v2": (False, _V2),
    "v2_conv": (False, {**_V2, "conv_kernel_size": 3, "conv_act": "gelu"}),
    "v2_own_position_projections": (False, {**_V2, "share_att_key": False}),
    "v2_c2p_only": (False, {**_V2, "share_att_key": False, "pos_att_type": ["c2p"]}),
    "v2_p2c_only": (False, {**_V2, "share_att_key": False, "pos_att_type": ["p2c"]}),
    "v2_position_biased_token_types": (False, {**_V2, "position_biased_input": True, "type_vocab_size": 2}),
    # HF's legacy=False head is H -> H and crashes with E != H: the legacy=True head then.
    "v2_factorized_legacy_head": (False, {**_V2, "embedding_size": 16, "legacy": True}),
    "v2_legacy_head": (False, {**_V2, "legacy": True}),
}


def _hf_model(name: str, seed: int = 0, **overrides) -> torch.nn.Module:
    v1, settings = VARIANTS[name]
    config_class, model_class = (
        (transformers.DebertaConfig, transformers.DebertaForMaskedLM)
        if v1
        else (transformers.DebertaV2Config, transformers.DebertaV2ForMaskedLM)
    )
    return hf_parity.randomize(model_class(config_class(**{**_COMMON, **settings, **overrides})), seed=seed)


def _long_inputs() -> dict[str, np.ndarray]:
    """Two rows of length 30, one padded after 23 tokens, both with two segments."""
    ids = np.random.default_rng(0).integers(6, 64, size=(2, 30))
    ids[:, 0] = 3
    ids[0, 23:] = 0
    mask = (ids != 0).astype(np.int64)
    segments = (np.arange(30)[None, :] >= 12).astype(np.int64) * mask
    return {"input_ids": ids.astype(np.int64), "attention_mask": mask, "token_type_ids": segments}


def _torch(inputs: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v.astype(np.int64)) for k, v in inputs.items()}


def _hf_outputs(model: torch.nn.Module, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Their last hidden state [B, L, H] and MLM logits [B, L, V]."""
    with torch.no_grad():
        out = model(**_torch(inputs), output_hidden_states=True)
    return {"last_hidden_state": out.hidden_states[-1].numpy(), "mlm_logits": out.logits.numpy()}


def _batch(inputs: dict[str, np.ndarray], positions: np.ndarray | None = None) -> dict[str, np.ndarray]:
    length = inputs["input_ids"].shape[1]
    if positions is None:  # the MLM head at every position
        positions = np.tile(np.arange(length, dtype=np.int32), (len(inputs["input_ids"]), 1))
    return {
        "input_ids": inputs["input_ids"].astype(np.int32),
        "input_mask": inputs["attention_mask"].astype(np.int32),
        "segment_ids": inputs["token_type_ids"].astype(np.int32),
        "masked_lm_positions": positions,
    }


def _our_outputs(config: EncoderConfig, params, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Our encoder's last hidden state (models.backbone.encoder_module) and the MLM logits of
    BertPretrainingModel at every position (sentence_head=False: DeBERTa has none)."""

    def run(params, batch):
        hidden = encoder_module(config).apply(
            {"params": params["encoder"]},
            batch["input_ids"],
            batch["input_mask"],
            batch["segment_ids"],
            deterministic=True,
        )
        logits = BertPretrainingModel(config, sentence_head=False).apply(
            {"params": params}, batch, deterministic=True
        )
        return hidden.sequence_output, logits["mlm_logits"]

    hidden, logits = jax.jit(run)(params, _batch(inputs))
    return {"last_hidden_state": np.asarray(hidden), "mlm_logits": np.asarray(logits)}


def _max_diffs(ours: dict, theirs: dict, mask: np.ndarray) -> dict[str, float]:
    """Max abs difference per output at the real tokens (HF's padding queries attend
    uniformly, ours not at all: nothing reads them)."""
    assert set(ours) == set(theirs)
    return {k: float(np.abs(ours[k] - theirs[k])[mask.astype(bool)].max()) for k in sorted(ours)}


def _parity(config, params, model, label: str) -> dict[str, float]:
    """Max diffs of ours vs `model` on the length-10 and length-30 inputs, printed."""
    diffs = {}
    for length, inputs in (("L10", hf_parity.inputs()), ("L30", _long_inputs())):
        for key, diff in _max_diffs(
            _our_outputs(config, params, inputs), _hf_outputs(model, inputs), inputs["attention_mask"]
        ).items():
            diffs[f"{key}@{length}"] = diff
    print(f"{label} max abs diff:", diffs)
    return diffs


def _flat(params) -> dict:
    return traverse_util.flatten_dict(params)


def _assert_same_params(a, b) -> None:
    a, b = _flat(a), _flat(b)
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg="/".join(key))


def _error(capsys, argv) -> str:
    assert convert_cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


# --- import, export, round trips ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.extended(keep=["v1", "v2"])
def test_import_matches_transformers_and_exports_back(variant, tmp_path):
    """HF -> ours: our outputs are theirs. Ours -> HF: transformers loads the export as the
    same class with the same outputs. HF -> ours -> HF -> ours: the same arrays and config."""
    v1, settings = VARIANTS[variant]
    model = _hf_model(variant)
    model.save_pretrained(str(tmp_path / "hf"))
    fmt, config, params, groups = convert.read_hf_model(str(tmp_path / "hf"))
    assert fmt is (convert.FORMATS["deberta"] if v1 else convert.FORMATS["deberta-v2"]) and groups == [
        "mlm_head"
    ]
    opts = config.disentangled
    assert (opts.version, config.pooler, config.classifier_head) == (1 if v1 else 2, False, "deberta")
    assert opts.pos_att_type == tuple(model.config.pos_att_type)
    assert config.type_vocab_size == settings.get("type_vocab_size", 0)
    assert config.embedding_width == settings.get("embedding_size", 32)
    # The position table is imported when the file has it (HF keeps it only when position-biased).
    biased = settings.get("position_biased_input", False)
    assert ("position_embeddings" in params["encoder"]["embeddings"]) == biased
    if not v1:
        assert (opts.position_buckets, opts.max_relative_positions) == (4, 16)
        assert opts.conv_kernel_size == settings.get("conv_kernel_size", 0)
    diffs = _parity(config, params, model, f"DeBERTa {variant} import")
    assert max(diffs.values()) <= TOLERANCE, diffs

    out = str(tmp_path / "exported")
    architecture = "DebertaForMaskedLM" if v1 else "DebertaV2ForMaskedLM"
    assert convert.write_hf_model(out, config, params, pad_id=0) == architecture
    exported_config = json.load(open(os.path.join(out, "config.json")))
    # legacy=False when it can be, then with tie_word_embeddings=False (`_deberta_hf_config`).
    legacy = config.embedding_width != 32
    assert (exported_config["legacy"], exported_config["tie_word_embeddings"]) == (legacy, legacy)
    loaded = getattr(transformers, architecture).from_pretrained(out).eval()
    diffs = _parity(config, params, loaded, f"DeBERTa {variant} export -> transformers")
    assert max(diffs.values()) <= TOLERANCE, diffs
    _, config_again, params_again, groups_again = convert.read_hf_model(out)
    assert config_again == config and groups_again == groups
    _assert_same_params(params_again, params)


def _config(**overrides) -> EncoderConfig:
    """A DeBERTa-v2 EncoderConfig of the tiny models' shape."""
    settings = dict(
        vocab_size=64,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        intermediate_size=48,
        max_position_embeddings=40,
        type_vocab_size=0,
        layer_norm_eps=1e-7,
        pooler=False,
        classifier_head="deberta",
        disentangled=DisentangledConfig(position_buckets=4, max_relative_positions=16),
    )
    return EncoderConfig(**{**settings, **overrides})


def _init(config: EncoderConfig, seed: int, emd: bool = False) -> dict:
    """BertPretrainingModel's tree with every array perturbed (init leaves biases at 0 and
    LayerNorm scales at 1, which would hide a swapped or transposed one)."""
    model = BertPretrainingModel(config, sentence_head=False, enhanced_mask_decoder=emd)
    variables = jitted.init(model, jax.random.key(seed), example_batch(1, 4, 2), deterministic=True)
    noise = np.random.default_rng(seed)
    params = jax.device_get(nn.meta.unbox(variables["params"]))
    return jax.tree.map(lambda x: x + 0.1 * noise.standard_normal(x.shape, np.float32), params)


def _rtd_head(seed: int) -> dict:
    """Random arrays of DeBERTa-v3's RTD head (models/deberta_rtd.py RTDHead, H = 32)."""
    rng = np.random.default_rng(seed)
    head = {
        "layer_norm": {"scale": 1.0 + 0.1 * rng.standard_normal(32), "bias": rng.standard_normal(32)},
        "dense": {"kernel": rng.standard_normal((32, 32)), "bias": rng.standard_normal(32)},
        "classifier": {"kernel": rng.standard_normal((32, 1)), "bias": rng.standard_normal(1)},
    }
    return jax.tree.map(lambda x: (0.2 * x).astype(np.float32), head)


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.extended
def test_our_tree_exports_and_reimports_exactly(version, tmp_path, caplog):
    """A pretraining tree initialised here (the EMD's position table, vocab padded to 128
    rows, DeBERTa-v3's RTD head) -> export -> transformers gives our MLM logits -> import
    gives the same arrays (v1's in_proj interleave, v2's conv transpose, the position table,
    which transformers does not read), the padding rows left out."""
    disentangled = (
        DisentangledConfig(version=1, position_buckets=0, share_att_key=False, norm_rel_ebd=False)
        if version == 1
        else DisentangledConfig(position_buckets=4, max_relative_positions=16, conv_kernel_size=3)
    )
    config = _config(vocab_pad_multiple=128, disentangled=disentangled)
    params = _init(config, seed=1, emd=True)
    assert params["mlm_head"]["output_bias"].shape == (128,)
    assert "position_embeddings" in params["encoder"]["embeddings"]
    assert ("bias" in params["encoder"]["layer_0"]["attention"]["key"]) == (version == 2)
    params["rtd_head"] = _rtd_head(seed=1)
    out = str(tmp_path / "hf")
    with caplog.at_level(logging.WARNING, logger="convert"):
        architecture = convert.write_hf_model(out, config, params, pad_id=0)
    assert architecture == ("DebertaForMaskedLM" if version == 1 else "DebertaV2ForMaskedLM")
    assert "deberta.embeddings.position_embeddings.weight" in load_file(
        os.path.join(out, "model.safetensors")
    )
    tensors = load_file(os.path.join(out, "model.safetensors"))
    layer = params["encoder"]["layer_1"]["attention"]
    if version == 1:  # in_proj rows: [q_n; k_n; v_n] for each head n, as HF's view [B, L, N, 3D]
        fused = tensors["deberta.encoder.layer.1.attention.self.in_proj.weight"].reshape(4, 3, 8, 32)
        for part, name in enumerate(("query", "key", "value")):
            np.testing.assert_array_equal(fused[:, part], layer[name]["kernel"].transpose(1, 2, 0))
        np.testing.assert_array_equal(
            tensors["deberta.encoder.layer.1.attention.self.q_bias"], layer["query"]["bias"].reshape(-1)
        )
    else:  # torch's Conv1d weight [H_out, H_in, K]
        np.testing.assert_array_equal(
            tensors["deberta.encoder.conv.conv.weight"],
            params["encoder"]["conv"]["kernel"].transpose(2, 1, 0),
        )
    np.testing.assert_array_equal(
        tensors["mask_predictions.classifier.weight"], params["rtd_head"]["classifier"]["kernel"].T
    )
    hf_class = transformers.DebertaForMaskedLM if version == 1 else transformers.DebertaV2ForMaskedLM
    loaded = hf_class.from_pretrained(out).eval()  # ignores mask_predictions.*
    trimmed = resize_vocab_rows(params, config.vocab_size)
    diffs = _parity(config, params, loaded, f"our DeBERTa v{version} tree -> transformers")
    assert max(diffs.values()) <= TOLERANCE, diffs
    _, config_again, params_again, groups = convert.read_hf_model(out)
    assert config_again == dataclasses.replace(config, vocab_pad_multiple=1)
    assert groups == ["mlm_head", "rtd_head"]
    _assert_same_params(params_again, trimmed)  # the position table included


@pytest.mark.slow
@pytest.mark.extended
def test_deberta_v3_workdir_exports_discriminator_and_generator(tmp_path, capsys, caplog):
    """A DeBERTa-v3 pretraining workdir (models/deberta_rtd.py's tree: the generator with the
    EMD's position table, the discriminator's GDES delta, the RTD head) -> the discriminator
    as DebertaV2Model (word table = generator's + delta, mask_predictions.*) and, with
    --generator_to, the generator as DebertaV2ForMaskedLM; transformers gives our outputs."""
    config = _config(num_layers=3)
    generator_config = dataclasses.replace(config, num_layers=2)
    generator = _init(generator_config, seed=1, emd=True)
    discriminator = _init(config, seed=2)
    rng = np.random.default_rng(3)
    embeddings = dict(discriminator["encoder"]["embeddings"])
    delta = 0.1 * rng.standard_normal(embeddings.pop("word_embeddings")["embedding"].shape)
    embeddings["word_embeddings_delta"] = {"embedding": delta.astype(np.float32)}
    tree = {
        "generator": generator["encoder"],
        "generator_head": generator["mlm_head"],
        "encoder": {**discriminator["encoder"], "embeddings": embeddings},
        "rtd_head": _rtd_head(seed=3),
    }
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(t + "\n" for t in hf_parity.vocab(64)))
    tokenizer = tokenizers.WordPieceTokenizer.from_vocab_file(str(vocab), lowercase=True)
    workdir = str(tmp_path / "v3")
    bundle.save_pretrained(workdir, config, tree, tokenizer)

    with caplog.at_level(logging.WARNING, logger="convert"):
        assert convert.export_hf(workdir, str(tmp_path / "alone")) == "DebertaV2Model"
    assert "the DeBERTa-v3 generator is not exported: pass --generator_to=hf:DIR" in caplog.text
    disc_out, gen_out = tmp_path / "discriminator", tmp_path / "generator"
    argv = ["export", f"--workdir={workdir}", f"--to=hf:{disc_out}", f"--generator_to=hf:{gen_out}"]
    assert convert_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "(DebertaV2Model, model.safetensors); generator ->" in out and "(DebertaV2ForMaskedLM)" in out

    folded = dict(tree["encoder"]["embeddings"])
    table = (
        tree["generator"]["embeddings"]["word_embeddings"]["embedding"]
        + folded.pop("word_embeddings_delta")["embedding"]
    )
    folded["word_embeddings"] = {"embedding": table}
    encoder = {**tree["encoder"], "embeddings": folded}
    stored = load_file(str(disc_out / "model.safetensors"))
    np.testing.assert_array_equal(stored["deberta.embeddings.word_embeddings.weight"], table)
    np.testing.assert_array_equal(
        stored["mask_predictions.dense.weight"], tree["rtd_head"]["dense"]["kernel"].T
    )
    inputs = hf_parity.inputs()
    loaded = transformers.DebertaV2Model.from_pretrained(str(disc_out)).eval()
    with torch.no_grad():
        theirs = loaded(**_torch(inputs)).last_hidden_state.numpy()
    batch = _batch(inputs)
    hidden = jitted.apply(
        encoder_module(config),
        {"params": encoder},
        *(batch[k] for k in ("input_ids", "input_mask", "segment_ids")),
        deterministic=True,
    )
    diff = float(
        np.abs(np.asarray(hidden.sequence_output) - theirs)[inputs["attention_mask"].astype(bool)].max()
    )
    print("DeBERTa-v3 discriminator export max abs diff:", diff)
    assert diff <= TOLERANCE, diff
    loaded = transformers.DebertaV2ForMaskedLM.from_pretrained(str(gen_out)).eval()
    generator_tree = {"encoder": tree["generator"], "mlm_head": tree["generator_head"]}
    diffs = _parity(generator_config, generator_tree, loaded, "DeBERTa-v3 generator export")
    assert max(diffs.values()) <= TOLERANCE, diffs


@pytest.mark.slow
def test_legacy_names_and_tied_aliases(tmp_path, capsys):
    """A legacy=True folder (cls.predictions.*, decoder tied to the word table and to
    cls.predictions.bias) imports to the same arrays as its legacy=False form; a stored
    copy of the tied decoder (lm_predictions.lm_head.weight, as the original's checkpoints
    have) must equal the word table; a head under both names is refused."""
    legacy = _hf_model("v2_legacy_head")
    legacy.save_pretrained(str(tmp_path / "legacy"))
    stored = load_file(str(tmp_path / "legacy" / "model.safetensors"))
    assert "cls.predictions.transform.dense.weight" in stored
    _, _, legacy_params, groups = convert.read_hf_model(str(tmp_path / "legacy"))
    assert groups == ["mlm_head"]
    state = {k: v.numpy() for k, v in legacy.state_dict().items()}
    head = legacy_params["mlm_head"]
    np.testing.assert_array_equal(
        head["transform"]["kernel"], state["cls.predictions.transform.dense.weight"].T
    )
    np.testing.assert_array_equal(head["output_bias"], state["cls.predictions.bias"])

    def folder(name: str, tensors: dict[str, np.ndarray]) -> str:
        directory = tmp_path / name
        directory.mkdir()
        (directory / "config.json").write_text((tmp_path / "legacy" / "config.json").read_text())
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        return str(directory)

    # The decoder stored under its legacy names (equal to the table and the bias: accepted).
    word = state["deberta.embeddings.word_embeddings.weight"]
    with_decoder = {
        **stored,
        "cls.predictions.decoder.weight": word,
        "cls.predictions.decoder.bias": state["cls.predictions.bias"],
    }
    _assert_same_params(convert.read_hf_model(folder("decoder", with_decoder))[2], legacy_params)
    # The legacy=False form with the tied alias stored.
    current = {
        k.replace("cls.predictions.transform.", "lm_predictions.lm_head.").replace(
            "cls.predictions.bias", "lm_predictions.lm_head.bias"
        ): v
        for k, v in stored.items()
    }
    _assert_same_params(
        convert.read_hf_model(folder("current", {**current, "lm_predictions.lm_head.weight": word}))[2],
        legacy_params,
    )
    untied = folder("untied", {**current, "lm_predictions.lm_head.weight": word + 1.0})
    err = _error(capsys, ["import", f"--from=hf:{untied}", f"--workdir={tmp_path / 'w'}"])
    assert "lm_predictions.lm_head.weight differs from deberta.embeddings.word_embeddings.weight" in err
    both = folder("both", {**stored, **current})
    err = _error(capsys, ["import", f"--from=hf:{both}", f"--workdir={tmp_path / 'w'}"])
    assert "twice, under that name and an older one" in err


def test_rtd_head_imports_from_mask_predictions_and_exports_back(tmp_path):
    """DeBERTa-v3's discriminator head: mask_predictions.{LayerNorm, dense, classifier} in the
    file (transformers has no class for it and ignores them) <-> our rtd_head."""
    model = _hf_model("v2")
    model.save_pretrained(str(tmp_path / "hf"))
    path = str(tmp_path / "hf" / "model.safetensors")
    rng = np.random.default_rng(1)
    head = {
        "mask_predictions.LayerNorm.weight": 1.0 + 0.1 * rng.standard_normal(32),
        "mask_predictions.LayerNorm.bias": rng.standard_normal(32),
        "mask_predictions.dense.weight": rng.standard_normal((32, 32)),
        "mask_predictions.dense.bias": rng.standard_normal(32),
        "mask_predictions.classifier.weight": rng.standard_normal((1, 32)),
        "mask_predictions.classifier.bias": rng.standard_normal(1),
    }
    head = {k: v.astype(np.float32) for k, v in head.items()}
    save_file({**load_file(path), **head}, path, metadata={"format": "pt"})
    _, config, params, groups = convert.read_hf_model(str(tmp_path / "hf"))
    assert groups == ["mlm_head", "rtd_head"]
    rtd = params["rtd_head"]
    np.testing.assert_array_equal(rtd["layer_norm"]["scale"], head["mask_predictions.LayerNorm.weight"])
    np.testing.assert_array_equal(rtd["dense"]["kernel"], head["mask_predictions.dense.weight"].T)
    np.testing.assert_array_equal(rtd["classifier"]["kernel"], head["mask_predictions.classifier.weight"].T)
    assert rtd["classifier"]["bias"].shape == (1,)
    out = str(tmp_path / "exported")
    convert.write_hf_model(out, config, params, pad_id=0)
    exported = load_file(os.path.join(out, "model.safetensors"))
    for name, array in head.items():
        np.testing.assert_array_equal(exported[name], array, err_msg=name)
    transformers.DebertaV2ForMaskedLM.from_pretrained(out)  # loads: the head is ignored


@pytest.mark.slow
def test_mapping_table_covers_every_parameter():
    """Every array a DeBERTa file may hold has one HF name (in_proj: three arrays, one name)."""
    for variant, (v1, _) in VARIANTS.items():
        config = convert.hf_config_to_ours(_hf_model(variant).config.to_dict(), "test")[1]
        fmt = convert.format_of(config)
        assert fmt is (convert.FORMATS["deberta"] if v1 else convert.FORMATS["deberta-v2"])
        shapes = fmt.our_shapes(config)
        spec = [p for p in fmt.expand("hf", config.num_layers, fmt.hf_base) if p.ours in shapes]
        assert sorted(p.ours for p in spec) == sorted(shapes), variant
        unfused = [p.theirs for p in spec if p.layout != "fused_qkv"]
        assert len(set(unfused)) == len(unfused), variant


# --- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model_type, key, value, message",
    [
        ("deberta", "talking_head", True, "talking_head=True is not supported: talking-head attention"),
        ("deberta-v2", "pos_att_type", ["p2c", "p2p"], "pos_att_type=['p2c', 'p2p'] is not supported"),
        ("deberta-v2", "pos_att_type", "c2p|p2p", "only distinct 'c2p' and 'p2c' terms"),
        ("deberta-v2", "attention_head_size", 16, "attention_head_size=16 is not supported: our heads are"),
        (
            "deberta",
            "relative_attention",
            False,
            "relative_attention=False is not supported: without relative",
        ),
        ("deberta-v2", "norm_rel_ebd", "rms", "norm_rel_ebd='rms' is not supported: use one of"),
        ("deberta-v2", "conv_groups", 2, "conv_groups=2 is not supported"),
        ("deberta-v2", "conv_act", "relu", "conv_act='relu' is not supported"),
        ("deberta-v2", "hidden_act", "relu", "hidden_act='relu' is not supported"),
    ],
)
def test_unsupported_options_are_one_line(model_type, key, value, message, tmp_path, capsys):
    v1 = model_type == "deberta"
    settings = {**_COMMON, **({} if v1 else {**_V2, "conv_kernel_size": 3}), key: value}
    config_class = transformers.DebertaConfig if v1 else transformers.DebertaV2Config
    hf = {**config_class(**_COMMON).to_dict(), **settings, "model_type": model_type}
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(hf))
    err = _error(capsys, ["import", f"--from=hf:{tmp_path / 'hf'}", f"--workdir={tmp_path / 'w'}"])
    assert message in err, err
    assert not (tmp_path / "w").exists()


def test_export_refuses_a_pooler(tmp_path):
    model = _hf_model("v2")
    model.save_pretrained(str(tmp_path / "hf"))
    _, config, params, _ = convert.read_hf_model(str(tmp_path / "hf"))
    pooler = {"kernel": np.zeros((32, 32), np.float32), "bias": np.zeros(32, np.float32)}
    params = {**params, "encoder": {**params["encoder"], "pooler": pooler}}
    with pytest.raises(
        convert.ConversionError, match="has a pooler .*transformers' DeBERTa models have none"
    ):
        convert.hf_model_files(dataclasses.replace(config, pooler=True), params, pad_id=0)


# --- the enhanced mask decoder -----------------------------------------------------------------


def _v1_layer_with_queries(layer, hidden, queries, mask, relative_pos, rel_embeddings):
    """HF DebertaLayer.forward with query_states, whose v1 code path fails in transformers
    5.18 (it calls .t() on a 3-D tensor): the same lines, the projections through HF's
    own in_proj and head split. hidden, queries: [B, L, H]; mask: [B, 1, L, L]."""
    attn = layer.attention.self
    _, key, value = attn.transpose_for_scores(attn.in_proj(hidden)).chunk(3, dim=-1)
    query = attn.transpose_for_scores(attn.in_proj(queries)).chunk(3, dim=-1)[0]
    query = query + attn.transpose_for_scores(attn.q_bias[None, None, :])
    value = value + attn.transpose_for_scores(attn.v_bias[None, None, :])
    scale_factor = 1 + len(attn.pos_att_type)
    query = query / scaled_size_sqrt(query, scale_factor).to(dtype=query.dtype)
    scores = query @ key.transpose(-1, -2)
    scores = scores + attn.disentangled_att_bias(query, key, relative_pos, rel_embeddings, scale_factor)
    scores = scores.masked_fill(~mask.bool(), torch.finfo(scores.dtype).min)
    context = (torch.softmax(scores, dim=-1) @ value).permute(0, 2, 1, 3)
    context = context.reshape(*context.shape[:2], -1)
    attended = layer.attention.output(context, queries)
    return layer.output(layer.intermediate(attended), attended)


def _emd_oracle(model: torch.nn.Module, position_table: np.ndarray, inputs, v1: bool) -> np.ndarray:
    """The original's EnhancedMaskDecoder (apps/models/masked_language_model.py) with HF's
    pieces: H_prev = the last layer's input, queries H_prev + position_table[positions],
    then twice the last layer (keys and values H_prev, the encoder's mask, relative
    positions and relative table), then HF's MLM head; logits [B, P, V] at POSITIONS."""
    tensors = _torch(inputs)
    encoder = model.deberta.encoder
    with torch.no_grad():
        states = model.deberta(**tensors, output_hidden_states=True).hidden_states
        previous = states[-2]
        length = previous.shape[1]
        queries = previous + torch.from_numpy(position_table[:length])[None]
        mask = encoder.get_attention_mask(tensors["attention_mask"])
        relative_pos = encoder.get_rel_pos(previous)
        rel_embeddings = encoder.get_rel_embedding()
        for _ in range(2):
            if v1:
                queries = _v1_layer_with_queries(
                    encoder.layer[-1], previous, queries, mask, relative_pos, rel_embeddings
                )
            else:
                queries = encoder.layer[-1](
                    previous,
                    mask,
                    query_states=queries,
                    relative_pos=relative_pos,
                    rel_embeddings=rel_embeddings,
                )[0]
        logits = model.lm_predictions(queries, model.deberta.embeddings.word_embeddings).numpy()
    return np.take_along_axis(logits, POSITIONS[:, :, None], axis=1)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["v1", "v2", "v2_conv"])
@pytest.mark.extended(keep=["v2"])
def test_enhanced_mask_decoder_matches_the_last_hf_layer_applied_twice(variant, tmp_path):
    """BertPretrainingModel(enhanced_mask_decoder=True) on an imported tree plus a position
    table of the test's own vs `_emd_oracle`, at the masked positions of a padded and a full
    row (all of them real tokens)."""
    v1, _ = VARIANTS[variant]
    model = _hf_model(variant)
    if v1:  # the transcription above must be HF's layer: check it without query_states
        previous = torch.randn(2, 10, 32, generator=torch.Generator().manual_seed(0))
        encoder, mask = model.deberta.encoder, torch.from_numpy(hf_parity.inputs()["attention_mask"])
        args = (encoder.get_attention_mask(mask), encoder.get_rel_pos(previous), encoder.get_rel_embedding())
        with torch.no_grad():
            theirs = encoder.layer[-1](previous, args[0], relative_pos=args[1], rel_embeddings=args[2])[0]
            ours = _v1_layer_with_queries(encoder.layer[-1], previous, previous, *args)
        assert float((theirs - ours).abs().max()) == 0.0
    model.save_pretrained(str(tmp_path / "hf"))
    _, config, params, _ = convert.read_hf_model(str(tmp_path / "hf"))
    table = (0.2 * np.random.default_rng(2).standard_normal((40, 32))).astype(np.float32)
    params["encoder"]["embeddings"]["position_embeddings"] = {"embedding": table}
    inputs = hf_parity.inputs()
    emd = BertPretrainingModel(config, sentence_head=False, enhanced_mask_decoder=True)
    ours = np.asarray(
        jitted.apply(emd, {"params": params}, _batch(inputs, POSITIONS), deterministic=True)["mlm_logits"]
    )
    diff = float(np.abs(ours - _emd_oracle(model, table, inputs, v1)).max())
    print(f"DeBERTa {variant} enhanced mask decoder max abs diff:", diff)
    assert diff <= TOLERANCE, diff
    # Not the plain head on the last layer (which HF's MaskedLM runs).
    plain = np.take_along_axis(_hf_outputs(model, inputs)["mlm_logits"], POSITIONS[:, :, None], axis=1)
    assert np.abs(ours - plain).max() > 1e-2
