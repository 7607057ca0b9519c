"""SpanBERT interop with transformers (PyTorch, CPU).

Published SpanBERT checkpoints (facebookresearch/SpanBERT: spanbert_hf_base.tar.gz,
spanbert_hf.tar.gz; on the hub SpanBERT/spanbert-{base,large}-cased) are cased BERT folders
in the old pytorch-pretrained-bert layout: a config.json without "model_type", a
pytorch_model.bin of the encoder only (no MLM head, no SBO head; SpanBERT trains without
NSP, so no pooler either) and the cased vocab. They import as BERT. Our SpanBERT tree is
BERT's plus a top-level `sbo_head`, which transformers has no class for: it exports as
BertForMaskedLM with the SBO head left out (a warning says so).
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

from core import sharding
from data import tokenizers
from finetune import trainer
from finetune.tasks import TASKS
from interop import bundle, convert, predict
from interop.convert import cli as convert_cli
from models.encoder import EncoderConfig
from models.pretraining import BertPretrainingModel, example_batch, resize_vocab_rows
from tests import hf_parity, jitted

transformers.utils.logging.disable_progress_bar()
TOLERANCE = 1e-5  # max abs diff in float32; measured values are printed with -s
# A cased WordPiece vocab (as SpanBERT's, BERT-base-cased's 28996 entries): the casing is
# inferred from it, there is no tokenizer_config.json in the release.
CASED_WORDS = ["Paris", "is", "the", "capital", "of", "France", ".", "Berlin", "Germany", "##s", "a", "city"]
GLUE_LENGTH = 16


def _cased_vocab(size: int) -> list[str]:
    specials = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    return specials + CASED_WORDS + [f"w{i}" for i in range(size - len(specials) - len(CASED_WORDS))]


def _legacy_name(name: str) -> str:
    """pytorch-pretrained-bert's LayerNorm parameter names (SpanBERT's pretraining code,
    pretraining/fairseq/models/pair_bert.py BertLayerNorm: gamma, beta)."""
    if ".LayerNorm." in name:
        return name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
    return name


def _write_published_folder(model: transformers.BertModel, directory: str) -> None:
    """A folder laid out as SpanBERT's release: config.json with BertConfig's keys of 2019
    (no model_type, layer_norm_eps, pad_token_id), pytorch_model.bin (torch.save of a state
    dict: bert.* encoder tensors with gamma/beta LayerNorms, no pooler, no cls.*), vocab.txt."""
    os.makedirs(directory)
    c = model.config
    config = {
        "attention_probs_dropout_prob": 0.1,
        "directionality": "bidi",
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": c.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": c.intermediate_size,
        "max_position_embeddings": c.max_position_embeddings,
        "num_attention_heads": c.num_attention_heads,
        "num_hidden_layers": c.num_hidden_layers,
        "type_vocab_size": c.type_vocab_size,
        "vocab_size": c.vocab_size,
    }
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    state = {
        f"bert.{_legacy_name(name)}": tensor.clone()
        for name, tensor in model.state_dict().items()
        if not name.startswith("pooler.") and not name.endswith("position_ids")
    }
    assert any(k.endswith("LayerNorm.gamma") for k in state) and not any(k.startswith("cls.") for k in state)
    torch.save(state, os.path.join(directory, "pytorch_model.bin"))
    with open(os.path.join(directory, "vocab.txt"), "w") as f:
        f.write("".join(t + "\n" for t in _cased_vocab(c.vocab_size)))


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A random BertModel written as SpanBERT's release, its import through the command
    line, and the transformers model read back from that folder."""
    root = tmp_path_factory.mktemp("spanbert")
    config = hf_parity.bert_config()
    source = hf_parity.randomize(transformers.BertModel(config), seed=7)
    directory = str(root / "spanbert_hf")
    _write_published_folder(source, directory)
    workdir = str(root / "imported")
    assert convert_cli.main(["import", f"--from=hf:{directory}", f"--workdir={workdir}"]) == 0
    # What users of the release do: transformers' BertModel on the folder.
    theirs, info = transformers.BertModel.from_pretrained(directory, output_loading_info=True)
    # Everything but the pooler (which the release does not have) comes from the file.
    assert {k.removeprefix("bert.") for k in info["missing_keys"]} == {
        "pooler.dense.weight",
        "pooler.dense.bias",
    }
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    return directory, workdir, theirs.eval(), root


def test_published_folder_imports_as_bert(published, tmp_path, caplog):
    directory, workdir, theirs, _ = published
    with caplog.at_level(logging.INFO, logger="convert"):
        fmt, config, params, groups = convert.read_hf_model(directory)
    assert "config.json has no model_type; its keys and weight names are BERT's: read as BERT" in caplog.text
    assert fmt is convert.FORMATS["bert"] and groups == []  # the encoder only: no pooler, no MLM head
    assert (config.hidden_act, config.layer_norm_eps, config.vocab_size) == ("gelu", 1e-12, 64)
    info = json.load(open(os.path.join(workdir, convert.CONVERTED_FROM)))
    assert info["model_type"] == "bert" and info["groups"] == []
    pretrained = bundle.load_pretrained(workdir)
    assert set(pretrained.params) == {"encoder"} and "pooler" not in pretrained.params["encoder"]
    # Cased: inferred from the vocab (no tokenizer_config.json), as transformers' cased tokenizer.
    assert pretrained.tokenizer.identity()["lowercase"] is False
    hf_tokenizer = transformers.BertTokenizer(os.path.join(directory, "vocab.txt"), do_lower_case=False)
    text = "Paris is the capital of France. Berlin is a city of Germany."
    ids = pretrained.tokenizer.encode(text)
    assert ids == hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert pretrained.tokenizer.unk_id not in ids
    assert pretrained.tokenizer.encode("paris") == [pretrained.tokenizer.unk_id]  # no lowercasing
    # Our encoder gives transformers' last hidden state (its pooler is random: not compared).
    inputs = hf_parity.inputs()
    ours = hf_parity.our_outputs(pretrained, inputs)
    assert set(ours) == {"last_hidden_state"}
    diff = float(
        np.abs(ours["last_hidden_state"] - hf_parity.hf_outputs(theirs, inputs)["last_hidden_state"]).max()
    )
    print("SpanBERT release import: last hidden state max abs diff:", diff)
    assert diff < TOLERANCE


@pytest.mark.slow
@pytest.mark.extended
def test_encode_cli_and_glue_take_the_import(published, tmp_path):
    directory, workdir, theirs, _ = published
    features = hf_parity.encode_lines(
        workdir, tmp_path, "Paris is the capital of France .\nBerlin is a city\tthe capital of Germany .\n"
    )
    assert "pooled_output" not in features  # no pooler in the release
    inputs = {k: features[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
    diff = float(
        np.abs(
            features["last_hidden_state"] - hf_parity.hf_outputs(theirs, inputs)["last_hidden_state"]
        ).max()
    )
    print("SpanBERT release encode CLI max abs diff:", diff)
    assert diff < TOLERANCE
    # GLUE fine-tuning starts from the imported encoder (the pooler from a fresh init).
    pretrained = bundle.load_pretrained(workdir)
    _assert_glue_loads_the_encoder(pretrained.config, pretrained.params)


def _assert_glue_loads_the_encoder(config: EncoderConfig, params) -> None:
    steps = trainer.TaskSteps(
        config,
        TASKS["rte"],
        trainer.OptimizerConfig(weight_decay=0.0),
        GLUE_LENGTH,
        sharding.Partitioner.create(None),
        classifier_dropout_rate=0.0,
    )
    state = steps.init(0, params, learning_rate=1e-3, warmup_steps=1, total_steps=10)
    loaded = traverse_util.flatten_dict(jax.device_get(state.params)["encoder"])
    source = traverse_util.flatten_dict(params["encoder"])
    for key, value in source.items():
        np.testing.assert_array_equal(loaded[key], value, err_msg="/".join(key))
    assert {k for k in loaded if k not in source} <= {("pooler", "kernel"), ("pooler", "bias")}


def test_fill_mask_without_the_mlm_head_is_one_line(published, capsys):
    _, workdir, _, _ = published
    assert predict.main([f"--workdir={workdir}", "--text=Paris is the [MASK] of France ."]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert "has no MLM head" in err


def test_bare_model_names_without_model_type_read_the_same(published, tmp_path):
    """The same release with a bare BertModel's names (embeddings.*, no bert. prefix)."""
    directory, _, _, _ = published
    folder = tmp_path / "bare"
    folder.mkdir()
    for name in ("config.json", "vocab.txt"):
        (folder / name).write_text(open(os.path.join(directory, name)).read())
    state = torch.load(os.path.join(directory, "pytorch_model.bin"), weights_only=True)
    torch.save({k.removeprefix("bert."): v for k, v in state.items()}, folder / "pytorch_model.bin")
    fmt, config, params, groups = convert.read_hf_model(str(folder))
    _, want_config, want, want_groups = convert.read_hf_model(directory)
    assert (fmt, config, groups) == (convert.FORMATS["bert"], want_config, want_groups)
    got, want = traverse_util.flatten_dict(params), traverse_util.flatten_dict(want)
    assert got.keys() == want.keys()
    for key in got:
        np.testing.assert_array_equal(got[key], want[key], err_msg="/".join(key))


def test_config_without_model_type_of_another_model_is_refused(published, tmp_path, capsys):
    directory, _, _, _ = published
    config = json.load(open(os.path.join(directory, "config.json")))
    state = torch.load(os.path.join(directory, "pytorch_model.bin"), weights_only=True)
    cases = {
        # BERT's keys, RoBERTa's weight names
        "roberta_weights": (config, {k.replace("bert.", "roberta.", 1): v for k, v in state.items()}),
        # an ALBERT config's keys
        "albert_keys": ({**config, "embedding_size": 16, "num_hidden_groups": 1}, state),
    }
    for name, (hf_config, tensors) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(hf_config))
        torch.save(tensors, folder / "pytorch_model.bin")
        (folder / "vocab.txt").write_text(open(os.path.join(directory, "vocab.txt")).read())
        assert convert_cli.main(["import", f"--from=hf:{folder}", f"--workdir={tmp_path / 'w'}"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err, err
        assert "model_type None is not supported: this converter reads bert" in err, (name, err)
    assert not (tmp_path / "w").exists()


# --- export of our SpanBERT tree ---------------------------------------------------------


def _spanbert_tree(config: EncoderConfig, seed: int) -> dict:
    """The tree of our SpanBERT model: BertPretrainingModel without sentence head (SpanBERT
    has no NSP) with the span boundary head (15 targets per span), every array then moved
    off its init (zero biases and unit scales would hide a swapped one)."""
    model = BertPretrainingModel(config, sentence_head=False, sbo_max_targets=15)
    batch = example_batch(1, 8, 2)
    batch.update({k: np.zeros((1, 2), np.int32) for k in ("sbo_left", "sbo_right", "sbo_offset")})
    params = jax.device_get(
        nn.meta.unbox(jitted.init(model, jax.random.key(seed), batch, deterministic=True))["params"]
    )
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: x + 0.1 * rng.standard_normal(x.shape).astype(np.float32), params)


@pytest.mark.slow
@pytest.mark.extended
def test_spanbert_tree_exports_as_bert_for_masked_lm(tmp_path, caplog):
    """Our SpanBERT workdir (vocab padded to 128 rows) -> export: BertForMaskedLM with our
    MLM logits, no SBO head (a warning); import(export) gives the BERT parts bit for bit."""
    bert = convert.hf_config_to_ours(hf_parity.bert_config().to_dict(), "test")[1]
    config = dataclasses.replace(bert, vocab_pad_multiple=128, pooler=False)
    params = _spanbert_tree(config, seed=3)
    shapes = {"/".join(k): v.shape for k, v in traverse_util.flatten_dict(params["sbo_head"]).items()}
    assert shapes == {
        "position_embeddings/embedding": (15, 200),
        "dense_1/kernel": (2 * 32 + 200, 32),
        "dense_1/bias": (32,),
        "layer_norm_1/scale": (32,),
        "layer_norm_1/bias": (32,),
        "dense_2/kernel": (32, 32),
        "dense_2/bias": (32,),
        "layer_norm_2/scale": (32,),
        "layer_norm_2/bias": (32,),
        "output_bias": (128,),  # the padded vocab
    }
    assert set(params) == {"encoder", "mlm_head", "sbo_head"}
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(t + "\n" for t in _cased_vocab(64)))
    tokenizer = tokenizers.WordPieceTokenizer.from_vocab_file(str(vocab))
    workdir = str(tmp_path / "spanbert")
    bundle.save_pretrained(workdir, config, params, tokenizer)

    # The rest of the codebase reads `encoder` (+ `mlm_head`) and ignores the SBO head.
    pretrained = bundle.load_pretrained(workdir)
    assert set(pretrained.params) == {"encoder", "mlm_head", "sbo_head"}
    _assert_glue_loads_the_encoder(config, pretrained.params)
    [masks] = predict.fill_mask(pretrained, ["Paris is the [MASK] of France ."], top_k=2)
    assert len(masks) == 1 and len(masks[0]) == 2

    out = str(tmp_path / "exported")
    with caplog.at_level(logging.WARNING, logger="convert"):
        assert convert.export_hf(workdir, out) == "BertForMaskedLM"
    assert "the span boundary (SBO) head has no transformers counterpart: not exported" in caplog.text
    loaded = transformers.BertForMaskedLM.from_pretrained(out).eval()
    inputs = hf_parity.inputs()
    bert_parts = {k: v for k, v in params.items() if k != "sbo_head"}
    ours = hf_parity.our_outputs(bundle.Pretrained(config, bert_parts, tokenizer, 0), inputs)
    diffs = hf_parity.max_diffs(ours, hf_parity.hf_outputs(loaded, inputs))
    print("SpanBERT tree -> BertForMaskedLM max abs diff:", diffs)
    assert set(diffs) == {"last_hidden_state", "mlm_logits"}
    assert max(diffs.values()) < TOLERANCE, diffs
    # transformers tokenizes the exported files as we do (cased)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    text = "Paris is the capital of Germany."
    assert hf_tokenizer(text, add_special_tokens=False)["input_ids"] == tokenizer.encode(text)
    # import(export(x)) == x without the SBO head and the padding rows
    _, config_again, params_again, groups = convert.read_hf_model(out)
    assert groups == ["mlm_head"] and config_again.vocab_size == 64
    a = traverse_util.flatten_dict(resize_vocab_rows(bert_parts, 64))
    b = traverse_util.flatten_dict(params_again)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg="/".join(key))
