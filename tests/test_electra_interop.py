"""ELECTRA interop with transformers (PyTorch, CPU): a discriminator (ElectraForPreTraining)
and a generator (ElectraForMaskedLM) folder <-> one workdir with models/electra.py's tree.

Small random transformers models (every weight random) are saved with save_pretrained and
imported; our ElectraPretrainingModel, run on the imported tree, gives their discriminator
logits and generator MLM logits. Exports load back in transformers with the same outputs,
and a tree initialised here survives export -> import bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import NamedTuple

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch  # requirements-test.txt: the reference implementation, CPU
import transformers
from flax import traverse_util

from data import tokenizers
from finetune import glue
from interop import bundle, convert, encode, predict
from interop.convert import cli as convert_cli
from models.electra import ElectraPretrainingModel, generator_config, generator_masked_lm
from models.encoder import EncoderConfig
from models.pretraining import resize_vocab_rows
from tests import cli_run, hf_parity, jitted
from tests.glue_folders import write_glue_dir

transformers.utils.logging.disable_progress_bar()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOLERANCE = 1e-5  # max abs diff in float32; measured values are printed with -s
MASK_ID = 5  # [MASK] in tests.test_convert's vocab
# Where the generator predicts in each row of `hf_parity.inputs()` (row 0 has 7 real tokens).
POSITIONS = np.array([[1, 3, 5], [2, 6, 8]], np.int32)


def _hf_config(embedding_size: int, hidden_size: int, num_heads: int, intermediate_size: int):
    return transformers.ElectraConfig(
        vocab_size=64,
        embedding_size=embedding_size,
        hidden_size=hidden_size,
        num_hidden_layers=2,
        num_attention_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=40,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


class Electra(NamedTuple):
    discriminator: transformers.ElectraForPreTraining
    generator: transformers.ElectraForMaskedLM
    discriminator_dir: str
    generator_dir: str
    workdir: str  # both imported
    ratio: float  # generator width / discriminator width


def _electra(root, embedding_size: int, ratio: float) -> Electra:
    """A random discriminator (H = 32, 4 heads) and a generator of models.electra's shape for
    `ratio` (generator_config: max(1, H_g // 64) heads, FFN 4 H_g) sharing its embeddings,
    saved and imported together through the command line."""
    discriminator = hf_parity.randomize(
        transformers.ElectraForPreTraining(_hf_config(embedding_size, 32, 4, 48)), seed=0
    )
    hidden = int(32 * ratio)
    generator = hf_parity.randomize(
        transformers.ElectraForMaskedLM(_hf_config(embedding_size, hidden, 1, 4 * hidden)), seed=1
    )
    with torch.no_grad():  # one shared block, as ELECTRA trains it (the tied decoder follows)
        generator.electra.embeddings.load_state_dict(discriminator.electra.embeddings.state_dict())
    discriminator_dir = hf_parity.save_hf(discriminator, str(root / "discriminator"))
    generator_dir = hf_parity.save_hf(generator, str(root / "generator"))
    workdir = str(root / "imported")
    argv = ["import", f"--from=hf:{discriminator_dir}", f"--generator_from=hf:{generator_dir}"]
    assert convert_cli.main([*argv, f"--workdir={workdir}"]) == 0
    return Electra(discriminator, generator, discriminator_dir, generator_dir, workdir, ratio)


@pytest.fixture(scope="module")
def electra(tmp_path_factory):
    """E = 16 != H = 32 != H_g = 8: both embedding projections exist."""
    return _electra(tmp_path_factory.mktemp("electra"), embedding_size=16, ratio=0.25)


def _torch(inputs: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v.astype(np.int64)) for k, v in inputs.items()}


def _generator_inputs() -> dict[str, np.ndarray]:
    inputs = hf_parity.inputs()
    ids = inputs["input_ids"].copy()
    np.put_along_axis(ids, POSITIONS, MASK_ID, axis=1)
    return {**inputs, "input_ids": ids}


def _hf_logits(e: Electra) -> dict[str, np.ndarray]:
    """Discriminator logits [B, L] on `hf_parity.inputs()`; generator logits [B, P, V] at POSITIONS of
    `_generator_inputs()`; the discriminator's last hidden state [B, L, H]."""
    with torch.no_grad():
        disc = e.discriminator(**_torch(hf_parity.inputs()), output_hidden_states=True)
        gen = e.generator(**_torch(_generator_inputs())).logits.numpy()
    return {
        "disc_logits": disc.logits.numpy(),
        "mlm_logits": np.take_along_axis(gen, POSITIONS[:, :, None], axis=1),
        "last_hidden_state": disc.hidden_states[-1].numpy(),
    }


def _our_logits(config: EncoderConfig, params, ratio: float) -> dict[str, np.ndarray]:
    """ElectraPretrainingModel's disc_logits and mlm_logits on the inputs of `_hf_logits`, and
    interop.encode's features. No masked position has weight: no sample is written, so the
    discriminator reads `hf_parity.inputs()` as it is."""
    inputs, masked = hf_parity.inputs(), _generator_inputs()
    batch = {
        "input_ids": inputs["input_ids"].astype(np.int32),
        "generator_input_ids": masked["input_ids"].astype(np.int32),
        "input_mask": inputs["attention_mask"].astype(np.int32),
        "segment_ids": inputs["token_type_ids"].astype(np.int32),
        "masked_lm_positions": POSITIONS,
        "masked_lm_weights": np.zeros(POSITIONS.shape, np.float32),
    }
    model = ElectraPretrainingModel(config, generator_config(config, ratio))
    rngs = {"sampling": jax.random.key(0)}
    out = jitted.apply(model, {"params": params}, batch, deterministic=True, rngs=rngs)
    assert not np.asarray(out["replaced"]).any()
    pretrained = bundle.Pretrained(config, params, tokenizer=None, step=0)
    features = encode.encode(pretrained, {k: v.astype(np.int32) for k, v in inputs.items()}, batch_size=2)
    assert "pooled_output" not in features
    return {
        "disc_logits": np.asarray(out["disc_logits"]),
        "mlm_logits": np.asarray(out["mlm_logits"]),
        "last_hidden_state": features["last_hidden_state"],
    }


def _max_diffs(ours: dict, theirs: dict) -> dict[str, float]:
    assert set(ours) == set(theirs)
    return {k: float(np.abs(ours[k] - theirs[k]).max()) for k in sorted(ours)}


def _flat(params) -> dict:
    return traverse_util.flatten_dict(params)


def _assert_same_params(a, b) -> None:
    a, b = _flat(a), _flat(b)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg="/".join(key))


def _error(capsys, argv, main=convert_cli.main) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


@pytest.mark.slow
@pytest.mark.parametrize("embedding_size, ratio", [(16, 0.25), (32, 1.0)], ids=["factorized", "E=H"])
@pytest.mark.extended(keep=["E=H"])
def test_import_matches_transformers(electra, tmp_path, embedding_size, ratio):
    """Factorized: E = 16, H = 32, H_g = 8 (both embeddings_project). E = H = H_g = 32: neither."""
    e = electra if embedding_size == 16 else _electra(tmp_path, embedding_size, ratio)
    pretrained = bundle.load_pretrained(e.workdir)
    config = pretrained.config
    assert (config.pooler, config.classifier_head, config.hidden_act) == (False, "electra", "gelu")
    assert config.embedding_size == (None if embedding_size == 32 else 16)
    assert ("embedding_projection" in pretrained.params["encoder"]) == (embedding_size != 32)
    assert ("embedding_projection" in pretrained.params["generator"]) == (embedding_size != 32 * ratio)
    assert convert.present_groups(pretrained.params) == ["discriminator_head", "generator"]
    info = json.load(open(os.path.join(e.workdir, convert.CONVERTED_FROM)))
    assert info["model_type"] == "electra" and info["groups"] == ["discriminator_head", "generator"]
    # The generator's shape, read back from its parameters, is models.electra's for the ratio.
    generator, _ = generator_masked_lm(config, pretrained.params)
    assert generator == generator_config(config, ratio)
    diffs = _max_diffs(_our_logits(config, pretrained.params, ratio), _hf_logits(e))
    print(f"ELECTRA import ({embedding_size=}) max abs diff:", diffs)
    assert max(diffs.values()) < TOLERANCE, diffs


def test_export_loads_in_transformers_and_reimports_exactly(electra, tmp_path, capsys, caplog):
    e = electra
    with caplog.at_level(logging.WARNING, logger="convert"):  # the generator needs its own flag
        assert convert.export_hf(e.workdir, str(tmp_path / "alone")) == "ElectraForPreTraining"
    assert "the ELECTRA generator is not exported: pass --generator_to=hf:DIR" in caplog.text
    disc_out, gen_out = tmp_path / "discriminator", tmp_path / "generator"
    argv = ["export", f"--workdir={e.workdir}", f"--to=hf:{disc_out}", f"--generator_to=hf:{gen_out}"]
    assert convert_cli.main(argv) == 0
    assert "(ElectraForPreTraining, model.safetensors); generator ->" in capsys.readouterr().out
    loaded = e._replace(
        discriminator=transformers.ElectraForPreTraining.from_pretrained(str(disc_out)).eval(),
        generator=transformers.ElectraForMaskedLM.from_pretrained(str(gen_out)).eval(),
    )
    diffs = _max_diffs(_hf_logits(loaded), _hf_logits(e))
    print("ELECTRA export -> transformers vs the original max abs diff:", diffs)
    assert max(diffs.values()) == 0.0, diffs  # the same weights: the same program's outputs
    for out in (disc_out, gen_out):
        hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
        assert hf_tokenizer("paris is the capital", add_special_tokens=False)["input_ids"] == [6, 7, 8, 9]
    again = str(tmp_path / "reimported")
    convert_cli.run_import(f"hf:{disc_out}", again, f"hf:{gen_out}")
    original, reloaded = bundle.load_pretrained(e.workdir), bundle.load_pretrained(again)
    assert reloaded.config == original.config
    _assert_same_params(reloaded.params, original.params)


@pytest.mark.slow
@pytest.mark.extended
def test_our_tree_exports_and_reimports_exactly(tmp_path):
    """A tree initialised by ElectraPretrainingModel (vocab padded to 128 rows) -> export ->
    transformers gives our logits -> import gives the same arrays, padding rows dropped."""
    config = EncoderConfig(
        vocab_size=64,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        intermediate_size=48,
        max_position_embeddings=40,
        embedding_size=16,
        vocab_pad_multiple=128,
        pooler=False,
        classifier_head="electra",
    )
    model = ElectraPretrainingModel(config, generator_config(config, 0.25))
    batch = {
        "input_ids": np.zeros((1, 4), np.int32),
        "generator_input_ids": np.zeros((1, 4), np.int32),
        "input_mask": np.ones((1, 4), np.int32),
        "segment_ids": np.zeros((1, 4), np.int32),
        "masked_lm_positions": np.zeros((1, 2), np.int32),
        "masked_lm_weights": np.ones((1, 2), np.float32),
    }
    rngs = {"params": jax.random.key(1), "sampling": jax.random.key(2)}
    params = jax.device_get(nn.meta.unbox(jitted.init(model, rngs, batch, deterministic=True)["params"]))
    assert params["generator_head"]["output_bias"].shape == (128,)
    # Init leaves biases at 0 and LayerNorm scales at 1, which would hide a swapped or transposed one.
    noise = np.random.default_rng(0)
    params = jax.tree.map(lambda x: x + 0.1 * noise.standard_normal(x.shape, np.float32), params)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(t + "\n" for t in hf_parity.vocab(64)))
    tokenizer = tokenizers.WordPieceTokenizer.from_vocab_file(str(vocab), lowercase=True)
    workdir = str(tmp_path / "ours")
    bundle.save_pretrained(workdir, config, params, tokenizer)
    disc_out, gen_out = str(tmp_path / "discriminator"), str(tmp_path / "generator")
    assert convert.export_hf(workdir, disc_out, generator_output=gen_out) == "ElectraForPreTraining"
    exported = Electra(
        discriminator=transformers.ElectraForPreTraining.from_pretrained(disc_out).eval(),
        generator=transformers.ElectraForMaskedLM.from_pretrained(gen_out).eval(),
        discriminator_dir=disc_out,
        generator_dir=gen_out,
        workdir=workdir,
        ratio=0.25,
    )
    diffs = _max_diffs(_our_logits(config, params, 0.25), _hf_logits(exported))
    print("our ELECTRA tree -> transformers max abs diff:", diffs)
    assert max(diffs.values()) < TOLERANCE, diffs
    _, reimported_config, reimported, groups = convert.read_hf_model(disc_out)
    assert reimported_config == dataclasses.replace(config, vocab_pad_multiple=1)
    reimported.update(
        convert.FORMATS["electra"].read_generator(gen_out, reimported_config, reimported, disc_out)
    )
    _assert_same_params(reimported, resize_vocab_rows(params, 64))


def test_encode_cli_writes_the_discriminator_features(electra, tmp_path):
    e = electra
    lines = tmp_path / "lines.txt"
    lines.write_text("paris is the capital of france .\nberlin is a city\tthe capital of germany .\n")
    out = tmp_path / "features.npz"
    assert encode.main([f"--workdir={e.workdir}", f"--input={lines}", f"--output={out}"]) == 0
    features = dict(np.load(out))
    assert "pooled_output" not in features  # ELECTRA's discriminator has no pooler
    inputs = {k: features[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        theirs = e.discriminator.electra(**_torch(inputs)).last_hidden_state.numpy()
    diff = float(np.abs(features["last_hidden_state"] - theirs).max())
    print("ELECTRA encode CLI max abs diff:", diff)
    assert diff < TOLERANCE


@pytest.mark.slow
def test_predict_fills_masks_with_the_generator(electra, tmp_path, capsys):
    e = electra
    pretrained = bundle.load_pretrained(e.workdir)
    text = "paris is the [MASK] of [MASK] ."
    [masks] = predict.fill_mask(pretrained, [text], top_k=3)
    ids = predict.masked_inputs(pretrained.tokenizer, text, 40)
    with torch.no_grad():
        logits = e.generator(input_ids=torch.tensor([ids])).logits[0].numpy()
    positions = [i for i, t in enumerate(ids) if t == MASK_ID]
    for candidates, position in zip(masks, positions, strict=True):
        expected = [pretrained.tokenizer.id_to_token(int(t)) for t in np.argsort(-logits[position])[:3]]
        assert [token for token, _ in candidates] == expected
    # Without the generator: no MLM head, one line.
    discriminator_only = str(tmp_path / "discriminator_only")
    convert_cli.run_import(f"hf:{e.discriminator_dir}", discriminator_only)
    err = _error(capsys, [f"--workdir={discriminator_only}", f"--text={text}"], main=predict.main)
    assert "ELECTRA discriminator without its generator" in err and "--generator_from" in err
    # ... nor can its export write a generator.
    argv = ["export", f"--workdir={discriminator_only}", f"--to=hf:{tmp_path / 'd'}"]
    err = _error(capsys, [*argv, f"--generator_to=hf:{tmp_path / 'g'}"])
    assert "has no ELECTRA generator to write to --generator_to" in err


def test_generator_embeddings_that_differ_warn_and_the_discriminators_are_kept(electra, tmp_path, caplog):
    e = electra
    generator = transformers.ElectraForMaskedLM.from_pretrained(e.generator_dir).eval()
    with torch.no_grad():
        generator.electra.embeddings.position_embeddings.weight.add_(0.5)
    generator_dir = hf_parity.save_hf(generator, str(tmp_path / "generator"))
    workdir = str(tmp_path / "imported")
    with caplog.at_level(logging.WARNING, logger="convert"):
        convert_cli.run_import(f"hf:{e.discriminator_dir}", workdir, f"hf:{generator_dir}")
    assert "the generator's embeddings differ from the discriminator's (max abs diff 0.5" in caplog.text
    assert "embeddings/position_embeddings/embedding" in caplog.text
    _assert_same_params(bundle.load_pretrained(workdir).params, bundle.load_pretrained(e.workdir).params)


def test_generator_folder_errors_are_one_line(electra, tmp_path, capsys):
    e = electra
    # The generator alone: its encoder is not the discriminator.
    err = _error(capsys, ["import", f"--from=hf:{e.generator_dir}", f"--workdir={tmp_path / 'w'}"])
    assert "is an ELECTRA generator (ElectraForMaskedLM): import the discriminator" in err
    # A generator with another embedding width cannot share the discriminator's block.
    other = hf_parity.randomize(transformers.ElectraForMaskedLM(_hf_config(24, 8, 1, 32)), seed=3)
    other_dir = hf_parity.save_hf(other, str(tmp_path / "other"))
    argv = ["import", f"--from=hf:{e.discriminator_dir}", f"--generator_from=hf:{other_dir}"]
    err = _error(capsys, [*argv, f"--workdir={tmp_path / 'w'}"])
    assert "the generator's embedding_width is 24, the discriminator's 16" in err
    # Two discriminators: the second has no generator head.
    argv = ["import", f"--from=hf:{e.discriminator_dir}", f"--generator_from=hf:{e.discriminator_dir}"]
    err = _error(capsys, [*argv, f"--workdir={tmp_path / 'w'}"])
    assert "no generator head (generator_predictions.*)" in err
    assert not (tmp_path / "w").exists()


@pytest.mark.slow(15)
@pytest.mark.extended
def test_glue_fine_tunes_an_imported_discriminator(electra, tmp_path, monkeypatch, capsys):
    """finetune.glue from the imported workdir with ELECTRA's GLUE recipe (first-token head,
    layer-wise lr decay over the imported layers), one short run."""
    glue_dir = str(tmp_path / "glue")
    write_glue_dir(glue_dir, rows=9)
    monkeypatch.chdir(ROOT)  # configs/glue/electra.gin's include is relative to the repository
    out = tmp_path / "out"
    result = cli_run.run(
        glue.main,
        [
            f"--init_from={electra.workdir}",
            "--tasks=sst2",
            f"--glue_dir={glue_dir}",
            f"--workdir={out}",
            "--gin_file=configs/glue/electra.gin",
            "--gin_bindings=Grid.batch_sizes = (8,)",
            "--gin_bindings=Grid.num_epochs = (1,)",
            "--gin_bindings=Grid.seeds = (0,)",
            "--gin_bindings=Grid.max_seq_length = 32",
        ],
        capsys,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sst2 = json.loads((out / "results.json").read_text())["tasks"]["sst2"]
    assert sst2["runs_trained"] == 1 and 0.0 <= sst2["metrics"]["dev"]["accuracy"] <= 1.0
