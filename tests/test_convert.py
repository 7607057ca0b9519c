"""Checkpoint interop: import / export against HF transformers (PyTorch, CPU) and TF1 checkpoints.

Small random-initialised transformers models are saved with save_pretrained, imported, and
our forward pass is compared with theirs on the same inputs (padding and sentence pairs
included); exports are loaded back by transformers and compared again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import torch  # requirements-test.txt: the reference implementation, CPU
import transformers
from flax import traverse_util
from safetensors.numpy import load_file

from core import workdir as workdir_files
from data import tokenizers
from interop import bundle, convert, encode, predict
from interop.convert import cli as convert_cli
from models.classifier import ClassifierModel
from tests import hf_parity, jitted

transformers.utils.logging.disable_progress_bar()  # keeps stderr to the CLI's own lines
TOLERANCE = 1e-4  # max abs diff in float32 (issue 5); measured values are printed with -s


def _flat(params) -> dict:
    return traverse_util.flatten_dict(params)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A random BertForPreTraining saved by transformers, and its import."""
    root = tmp_path_factory.mktemp("bert")
    model = hf_parity.randomize(transformers.BertForPreTraining(hf_parity.bert_config()), seed=0)
    hf_dir = hf_parity.save_hf(model, str(root / "hf"))
    workdir = str(root / "imported")
    assert convert_cli.main(["import", f"--from=hf:{hf_dir}", f"--workdir={workdir}"]) == 0
    return model, hf_dir, workdir, root


@pytest.mark.slow
def test_bert_import_matches_transformers(bert):
    model, _, workdir, _ = bert
    pretrained = bundle.load_pretrained(workdir)
    assert pretrained.config.num_layers == 2 and pretrained.config.hidden_act == "gelu"
    assert convert.present_groups(pretrained.params) == ["pooler", "mlm_head", "sentence_head"]
    inputs = hf_parity.inputs()
    diffs = hf_parity.max_diffs(
        hf_parity.our_outputs(pretrained, inputs), hf_parity.hf_outputs(model, inputs)
    )
    print("bert import max abs diff:", diffs)
    assert set(diffs) == {"last_hidden_state", "pooled_output", "mlm_logits", "sentence_logits"}
    assert max(diffs.values()) < TOLERANCE, diffs


@pytest.mark.slow
def test_bert_export_loads_in_transformers_and_reimports_exactly(bert):
    model, _, workdir, root = bert
    out = str(root / "exported")
    assert convert_cli.main(["export", f"--workdir={workdir}", f"--to=hf:{out}"]) == 0
    pretrained = bundle.load_pretrained(workdir)
    inputs = hf_parity.inputs()
    ours = hf_parity.our_outputs(pretrained, inputs)
    loaded = transformers.BertForPreTraining.from_pretrained(out).eval()
    diffs = hf_parity.max_diffs(ours, hf_parity.hf_outputs(loaded, inputs))
    print("bert export -> BertForPreTraining max abs diff:", diffs)
    assert max(diffs.values()) < TOLERANCE, diffs
    bare = transformers.BertModel.from_pretrained(out).eval()
    bare_out = hf_parity.hf_outputs(bare, inputs)
    for key in ("last_hidden_state", "pooled_output"):
        assert np.abs(bare_out[key] - ours[key]).max() < TOLERANCE, key
    # transformers reads our tokenizer files and tokenizes as we do
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    text = "Paris is the capital of Germany."
    assert hf_tokenizer(text, add_special_tokens=False)["input_ids"] == pretrained.tokenizer.encode(text)
    # import(export(x)) == x exactly
    again = str(root / "reimported")
    assert convert_cli.main(["import", f"--from=hf:{out}", f"--workdir={again}"]) == 0
    reloaded = bundle.load_pretrained(again)
    assert reloaded.config == pretrained.config
    assert reloaded.tokenizer.identity() == pretrained.tokenizer.identity()
    a, b = _flat(pretrained.params), _flat(reloaded.params)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg="/".join(key))


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["BertModel", "BertForMaskedLM"])
@pytest.mark.extended
def test_bert_import_without_pretraining_heads(bert, architecture):
    model, hf_dir, full_workdir, root = bert
    partial = getattr(transformers, architecture).from_pretrained(hf_dir).eval()
    directory = hf_parity.save_hf(partial, str(root / f"hf_{architecture}"))
    workdir = str(root / f"imported_{architecture}")
    imported = convert_cli.run_import(f"hf:{directory}", workdir)
    expected = {"BertModel": ["pooler"], "BertForMaskedLM": ["mlm_head"]}[architecture]
    assert imported.groups == expected
    pretrained = bundle.load_pretrained(workdir)
    assert convert.present_groups(pretrained.params) == expected
    full = _flat(bundle.load_pretrained(full_workdir).params)
    for key, value in _flat(pretrained.params).items():
        np.testing.assert_array_equal(value, full[key], err_msg="/".join(key))
    inputs = hf_parity.inputs()
    diffs = hf_parity.max_diffs(
        hf_parity.our_outputs(pretrained, inputs), hf_parity.hf_outputs(partial, inputs)
    )
    print(f"{architecture} import max abs diff:", diffs)
    assert max(diffs.values()) < TOLERANCE, diffs
    # the export names the class that has exactly these parts, and transformers loads it
    out = str(root / f"exported_{architecture}")
    assert convert.export_hf(workdir, out) == architecture
    loaded = getattr(transformers, architecture).from_pretrained(out).eval()
    assert (
        max(
            hf_parity.max_diffs(
                hf_parity.our_outputs(pretrained, inputs), hf_parity.hf_outputs(loaded, inputs)
            ).values()
        )
        < TOLERANCE
    )


def _write_tf1_checkpoint(model: torch.nn.Module, directory: str, num_layers: int) -> None:
    """A google-research/bert style checkpoint of `model`'s weights, names written out by hand
    from modeling.py / run_pretraining.py (kernels [in, out]; output_weights [2, H])."""
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    variables = {
        "bert/embeddings/word_embeddings": state["bert.embeddings.word_embeddings.weight"],
        "bert/embeddings/position_embeddings": state["bert.embeddings.position_embeddings.weight"],
        "bert/embeddings/token_type_embeddings": state["bert.embeddings.token_type_embeddings.weight"],
        "bert/embeddings/LayerNorm/gamma": state["bert.embeddings.LayerNorm.weight"],
        "bert/embeddings/LayerNorm/beta": state["bert.embeddings.LayerNorm.bias"],
        "bert/pooler/dense/kernel": state["bert.pooler.dense.weight"].T,
        "bert/pooler/dense/bias": state["bert.pooler.dense.bias"],
        "cls/predictions/transform/dense/kernel": state["cls.predictions.transform.dense.weight"].T,
        "cls/predictions/transform/dense/bias": state["cls.predictions.transform.dense.bias"],
        "cls/predictions/transform/LayerNorm/gamma": state["cls.predictions.transform.LayerNorm.weight"],
        "cls/predictions/transform/LayerNorm/beta": state["cls.predictions.transform.LayerNorm.bias"],
        "cls/predictions/output_bias": state["cls.predictions.bias"],
        "cls/seq_relationship/output_weights": state["cls.seq_relationship.weight"],
        "cls/seq_relationship/output_bias": state["cls.seq_relationship.bias"],
    }
    for i in range(num_layers):
        hf, ours = f"bert.encoder.layer.{i}.", f"bert/encoder/layer_{i}/"
        for tf_name, hf_name in [
            ("attention/self/query", "attention.self.query"),
            ("attention/self/key", "attention.self.key"),
            ("attention/self/value", "attention.self.value"),
            ("attention/output/dense", "attention.output.dense"),
            ("intermediate/dense", "intermediate.dense"),
            ("output/dense", "output.dense"),
        ]:
            variables[f"{ours}{tf_name}/kernel"] = state[f"{hf}{hf_name}.weight"].T
            variables[f"{ours}{tf_name}/bias"] = state[f"{hf}{hf_name}.bias"]
        for tf_name, hf_name in [
            ("attention/output/LayerNorm", "attention.output.LayerNorm"),
            ("output/LayerNorm", "output.LayerNorm"),
        ]:
            variables[f"{ours}{tf_name}/gamma"] = state[f"{hf}{hf_name}.weight"]
            variables[f"{ours}{tf_name}/beta"] = state[f"{hf}{hf_name}.bias"]
    # Training state the importer must skip.
    variables["bert/embeddings/word_embeddings/adam_m"] = np.zeros_like(
        variables["bert/embeddings/word_embeddings"]
    )
    _save_tf1(variables, directory)
    config = model.config
    with open(os.path.join(directory, "bert_config.json"), "w") as f:
        json.dump(
            {
                "attention_probs_dropout_prob": 0.1,
                "hidden_act": "gelu",
                "hidden_dropout_prob": 0.1,
                "hidden_size": config.hidden_size,
                "initializer_range": 0.02,
                "intermediate_size": config.intermediate_size,
                "max_position_embeddings": config.max_position_embeddings,
                "num_attention_heads": config.num_attention_heads,
                "num_hidden_layers": num_layers,
                "type_vocab_size": config.type_vocab_size,
                "vocab_size": config.vocab_size,
            },
            f,
        )
    with open(os.path.join(directory, "vocab.txt"), "w") as f:
        f.write("".join(t + "\n" for t in hf_parity.vocab(config.vocab_size)))


def test_sharded_safetensors_and_torch_bin_read_the_same(bert, tmp_path):
    model, hf_dir, _, _ = bert
    _, _, expected, _ = convert.read_hf_model(hf_dir)
    sharded = tmp_path / "sharded"
    model.save_pretrained(str(sharded), max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").exists() and not (
        sharded / "model.safetensors"
    ).exists()
    binary = tmp_path / "binary"
    binary.mkdir()
    (binary / "config.json").write_text(open(os.path.join(hf_dir, "config.json")).read())
    torch.save(model.state_dict(), binary / "pytorch_model.bin")
    for directory in (sharded, binary):
        _, _, params, groups = convert.read_hf_model(str(directory))
        assert groups == ["pooler", "mlm_head", "sentence_head"]
        got, want = _flat(params), _flat(expected)
        assert got.keys() == want.keys()
        for key in got:
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"{directory.name}: {'/'.join(key)}")


def test_torch_bin_without_torch_is_one_line(bert, tmp_path, monkeypatch):
    """Only pytorch_model.bin and no torch installed: a one-line error saying how to fix it."""
    model, hf_dir, _, _ = bert
    binary = tmp_path / "binary"
    binary.mkdir()
    (binary / "config.json").write_text(open(os.path.join(hf_dir, "config.json")).read())
    torch.save(model.state_dict(), binary / "pytorch_model.bin")
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(
        convert.ConversionError, match=r"has only pytorch_model.bin, which needs torch to read"
    ):
        convert.read_hf_weights(str(binary), "hf:binary")


def _save_tf1(variables: dict[str, np.ndarray], directory: str) -> None:
    """Writes `variables` (plus global_step) with a TF1 Saver, as model.ckpt-7."""
    os.makedirs(directory)
    with tf.Graph().as_default():
        tf_vars = [tf.compat.v1.get_variable(name, initializer=value) for name, value in variables.items()]
        step = tf.compat.v1.train.get_or_create_global_step()
        saver = tf.compat.v1.train.Saver([*tf_vars, step])
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, os.path.join(directory, "model.ckpt"), global_step=7)


def test_tf1_checkpoint_imports_to_the_same_values(bert):
    model, _, hf_workdir, root = bert
    directory = str(root / "tf1")
    _write_tf1_checkpoint(model, directory, num_layers=2)
    workdir = str(root / "imported_tf")
    assert convert_cli.main(["import", f"--from=tf:{directory}", f"--workdir={workdir}"]) == 0
    from_tf = bundle.load_pretrained(workdir)
    # BERT's released checkpoints were trained with the exact erf GELU (as HF's "gelu").
    assert from_tf.config.hidden_act == "gelu"
    expected = _flat(bundle.load_pretrained(hf_workdir).params)
    got = _flat(from_tf.params)
    assert got.keys() == expected.keys()
    for key in got:
        np.testing.assert_array_equal(got[key], expected[key], err_msg="/".join(key))


def test_encode_cli_writes_transformers_outputs(bert, tmp_path):
    model, _, workdir, _ = bert
    features = hf_parity.encode_lines(
        workdir, tmp_path, "paris is the capital of france .\nberlin is a city\tthe capital of germany .\n"
    )
    tokenizer = bundle.load_pretrained(workdir).tokenizer
    first = [tokenizer.cls_id, *tokenizer.encode("paris is the capital of france ."), tokenizer.sep_id]
    assert features["input_ids"][0, : len(first)].tolist() == first
    assert features["token_type_ids"][1].max() == 1 and features["token_type_ids"][0].max() == 0
    inputs = {k: features[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        theirs = model.bert(**{k: torch.from_numpy(v) for k, v in inputs.items()})
    assert features["last_hidden_state"].dtype == np.float32
    assert np.abs(features["last_hidden_state"] - theirs.last_hidden_state.numpy()).max() < TOLERANCE
    assert np.abs(features["pooled_output"] - theirs.pooler_output.numpy()).max() < TOLERANCE


def test_encode_inputs_bert_pair_format(bert):
    tokenizer = bundle.load_pretrained(bert[2]).tokenizer
    a, b = tokenizer.encode("paris is"), tokenizer.encode("a city")
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    bert_inputs = encode.build_inputs(tokenizer, ["paris is\ta city"], 16)
    assert bert_inputs["input_ids"][0].tolist() == [cls, *a, sep, *b, sep]
    assert bert_inputs["token_type_ids"][0].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    # truncation keeps the specials: the longer side loses its last tokens
    short = encode.build_inputs(tokenizer, ["paris is the capital of france\ta city"], 8)
    assert short["input_ids"][0].tolist() == [cls, *tokenizer.encode("paris is the"), sep, *b, sep]


@pytest.mark.slow
def test_predict_agrees_with_transformers(bert, capsys):
    model, _, workdir, _ = bert
    pretrained = bundle.load_pretrained(workdir)
    text = "paris is the [MASK] of [MASK] ."
    [masks] = predict.fill_mask(pretrained, [text], top_k=3)
    ids = predict.masked_inputs(pretrained.tokenizer, text, 40)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).prediction_logits[0].numpy()
    positions = [i for i, t in enumerate(ids) if t == pretrained.tokenizer.mask_id]
    assert len(masks) == len(positions) == 2
    for candidates, position in zip(masks, positions):
        expected = [pretrained.tokenizer.id_to_token(int(t)) for t in np.argsort(-logits[position])[:3]]
        assert [token for token, _ in candidates] == expected
    assert predict.main([f"--workdir={workdir}", f"--text={text}", "--top_k=2"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"paris is the [{masks[0][0][0]}] of [{masks[1][0][0]}] ."
    assert printed[1].startswith("  mask 1: ") and len(printed) == 3


# --- bad input: one `error:` line, exit status 2 ------------------------------------------


def _error(capsys, argv, main=convert_cli.main) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def test_unsupported_model_type_is_one_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "funnel", "vocab_size": 10}))
    err = _error(capsys, ["import", f"--from=hf:{tmp_path}", f"--workdir={tmp_path / 'w'}"])
    assert "model_type 'funnel' is not supported" in err and "bert" in err and "xlnet" in err


def test_unsupported_option_is_named(bert, tmp_path, capsys):
    _, hf_dir, _, _ = bert
    config = json.load(open(os.path.join(hf_dir, "config.json")))
    (tmp_path / "config.json").write_text(json.dumps({**config, "position_embedding_type": "relative_key"}))
    err = _error(capsys, ["import", f"--from=hf:{tmp_path}", f"--workdir={tmp_path / 'w'}"])
    assert "position_embedding_type='relative_key' is not supported" in err


def test_vocab_mismatch(bert, tmp_path, capsys):
    _, hf_dir, _, _ = bert
    directory = tmp_path / "hf"
    directory.mkdir()
    for name in ("config.json", "model.safetensors"):
        (directory / name).write_bytes(open(os.path.join(hf_dir, name), "rb").read())
    (directory / "vocab.txt").write_text("".join(t + "\n" for t in hf_parity.vocab(60)))
    err = _error(capsys, ["import", f"--from=hf:{directory}", f"--workdir={tmp_path / 'w'}"])
    assert "vocab_size=64 but the tokenizer has 60 tokens" in err
    assert not (tmp_path / "w").exists()


def test_weights_not_matching_config(bert, tmp_path, capsys):
    _, hf_dir, _, _ = bert
    directory = tmp_path / "hf"
    directory.mkdir()
    config = json.load(open(os.path.join(hf_dir, "config.json")))
    (directory / "config.json").write_text(json.dumps({**config, "intermediate_size": 50}))
    (directory / "model.safetensors").write_bytes(
        open(os.path.join(hf_dir, "model.safetensors"), "rb").read()
    )
    err = _error(capsys, ["import", f"--from=hf:{directory}", f"--workdir={tmp_path / 'w'}"])
    assert "'bert.encoder.layer.0.intermediate.dense.weight' has shape (48, 32)" in err
    assert "implies (50, 32)" in err


def test_tf1_checkpoint_missing_a_variable(bert, tmp_path, capsys):
    model, _, _, _ = bert
    directory = tmp_path / "tf1"
    _write_tf1_checkpoint(model, str(directory), num_layers=1)
    config = json.load(open(directory / "bert_config.json"))
    (directory / "bert_config.json").write_text(json.dumps({**config, "num_hidden_layers": 2}))
    err = _error(capsys, ["import", f"--from=tf:{directory}", f"--workdir={tmp_path / 'w'}"])
    assert "no variable 'bert/encoder/layer_1/attention/self/query/kernel'" in err


def test_import_refuses_an_existing_workdir(bert, capsys):
    _, hf_dir, workdir, _ = bert
    err = _error(capsys, ["import", f"--from=hf:{hf_dir}", f"--workdir={workdir}"])
    assert "already holds a model" in err


def test_export_never_writes_over_a_users_folder(bert, tmp_path, capsys):
    _, _, workdir, _ = bert
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"mine": true}')
    err = _error(capsys, ["export", f"--workdir={workdir}", f"--to=hf:{mine}"])
    assert err == f"error: '{mine}' is not empty (it holds config.json): export to a new or empty folder"
    assert os.listdir(mine) == ["config.json"] and (mine / "config.json").read_text() == '{"mine": true}'


def _damaged_copy(workdir, tmp_path):
    """A copy of the workdir whose checkpoint chunks (array data and metadata) are cut short."""
    damaged = tmp_path / "damaged"
    shutil.copytree(workdir, damaged)
    for root, _, files in os.walk(damaged / "checkpoints"):
        for name in files:
            if os.path.basename(root) == "d":
                with open(os.path.join(root, name), "r+b") as f:
                    f.truncate(10)
    return damaged


def test_predict_on_a_damaged_checkpoint_is_one_line(bert, tmp_path, capsys):
    _, _, workdir, _ = bert
    damaged = _damaged_copy(workdir, tmp_path)
    err = _error(capsys, [f"--workdir={damaged}", "--text=the [MASK]"], main=predict.main)
    assert err.startswith(f"error: cannot read the parameters of checkpoint 0 in '{damaged}'")
    assert err.endswith("damaged or incomplete; pick another with --step, or import or train it again")
    err = _error(capsys, [f"--workdir={workdir}", "--text=the [MASK]", "--step=7"], main=predict.main)
    assert err == f"error: no checkpoint step 7 in '{workdir}' (it has steps [0]): pick one of those"


@pytest.mark.slow(20)
@pytest.mark.extended
def test_predict_on_a_damaged_checkpoint_prints_nothing_else(bert, tmp_path):
    """In its own process: tensorstore's "Event loop is closed" reports of the failed reads
    (at exit) stay off the console; the one error line is all there is."""
    _, _, workdir, _ = bert
    damaged = _damaged_copy(workdir, tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "interop.predict", f"--workdir={damaged}", "--text=the [MASK]"],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        env={**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout=300,
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: cannot read the parameters"), result.stderr[-3000:]


def test_predict_without_mask_and_without_head(bert, capsys):
    _, _, workdir, root = bert
    err = _error(capsys, [f"--workdir={workdir}", "--text=no mask here"], main=predict.main)
    assert "has no [MASK] token" in err
    headless = root / "imported_BertModel"
    if not headless.exists():  # the without-heads test made it; build it when run alone
        model = transformers.BertModel.from_pretrained(bert[1]).eval()
        convert_cli.run_import(f"hf:{hf_parity.save_hf(model, str(root / 'hf_BertModel'))}", str(headless))
    err = _error(capsys, [f"--workdir={headless}", "--text=the [MASK]"], main=predict.main)
    assert "no MLM head" in err


@pytest.mark.slow
def test_cli_entry_point_prints_one_error_line(tmp_path):
    """The real command line: `python -m interop.convert import ...` exits 2 with one line."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "interop.convert",
            "import",
            f"--from=tf:{tmp_path}",
            f"--workdir={tmp_path}/w",
        ],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: tf:{tmp_path}: no albert_config.json or bert_config.json: pass the folder of a "
        "google-research/bert or /albert checkpoint"
    )


def test_mapping_table_covers_every_parameter():
    """Every array of each family's PretrainingModel has exactly one HF (and TF) name."""
    cases = [
        (convert.FORMATS["bert"], hf_parity.bert_config(), ("hf", "tf")),
        (convert.FORMATS["roberta"], _roberta_config(), ("hf",)),
        (convert.FORMATS["albert"], _albert_config(), ("hf", "tf")),
    ]
    for fmt, hf_config, frameworks in cases:
        config = convert.hf_config_to_ours(hf_config.to_dict(), "test")[1]
        ours = set(fmt.our_shapes(config))
        for framework in frameworks:
            spec = fmt.expand(framework, config.num_layers, hf_base=fmt.hf_base)
            # RoBERTa has no sentence head in HF: ours is the one array left without a name.
            expected = {
                k for k in ours if not (fmt is convert.FORMATS["roberta"] and k[0] == "sentence_head")
            }
            assert sorted(p.ours for p in spec) == sorted(expected), fmt.model_type
            assert len({p.theirs for p in spec}) == len(spec)


# --- RoBERTa and ALBERT: weights (their tokenizers need backends data/tokenizers/ lacks) ------


def _roberta_config(**overrides) -> transformers.RobertaConfig:
    # As published: one token type, pad id 1 (positions count from 2), LayerNorm eps 1e-5.
    return transformers.RobertaConfig(
        **overrides,
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=42,
        type_vocab_size=1,
        pad_token_id=1,
        layer_norm_eps=1e-5,
    )


def _albert_config() -> transformers.AlbertConfig:
    return transformers.AlbertConfig(
        vocab_size=64,
        embedding_size=16,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=40,
        hidden_act="gelu_new",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def _family_inputs(model_type: str) -> dict[str, np.ndarray]:
    inputs = hf_parity.inputs()
    if model_type == "roberta":  # pad id 1, no segment B
        inputs["input_ids"] = np.where(inputs["attention_mask"] == 1, inputs["input_ids"], 1)
        inputs["token_type_ids"] = np.zeros_like(inputs["token_type_ids"])
    return inputs


FAMILIES = {
    "roberta": (_roberta_config, ["RobertaForMaskedLM", "RobertaModel"]),
    "albert": (_albert_config, ["AlbertForPreTraining", "AlbertForMaskedLM", "AlbertModel"]),
}


@pytest.mark.parametrize(
    "model_type, architecture", [(t, a) for t, (_, architectures) in FAMILIES.items() for a in architectures]
)
@pytest.mark.slow
@pytest.mark.extended(keep=["albert-AlbertForPreTraining", "roberta-RobertaForMaskedLM"])
def test_family_weights_match_transformers_and_round_trip(model_type, architecture, tmp_path):
    make_config, _ = FAMILIES[model_type]
    model = hf_parity.randomize(getattr(transformers, architecture)(make_config()), seed=1)
    model.save_pretrained(str(tmp_path / "hf"))
    fmt, config, params, groups = convert.read_hf_model(str(tmp_path / "hf"))
    assert fmt.model_type == model_type and fmt.hf_architecture(set(groups)) == architecture
    if model_type == "roberta":
        assert config.position_offset == 2 and config.type_vocab_size == 1 and config.layer_norm_eps == 1e-5
    else:
        assert config.sharing == "all" and config.embedding_size == 16 and config.hidden_act == "gelu_tanh"
    pretrained = bundle.Pretrained(config=config, params=params, tokenizer=None, step=0)
    inputs = _family_inputs(model_type)
    # RoBERTa gives pad tokens position padding_idx, we count on: compare at real tokens
    # (what any user of the outputs reads; pad keys are masked in both).
    diffs = hf_parity.max_diffs(
        hf_parity.our_outputs(pretrained, inputs),
        hf_parity.hf_outputs(model, inputs),
        inputs["attention_mask"],
    )
    print(f"{architecture} import max abs diff:", diffs)
    assert max(diffs.values()) < TOLERANCE, diffs
    # export: transformers loads it as the same class and gives the same outputs
    out = str(tmp_path / "exported")
    assert (
        convert.write_hf_model(out, config, params, pad_id=1 if model_type == "roberta" else 0)
        == architecture
    )
    loaded = getattr(transformers, architecture).from_pretrained(out).eval()
    diffs = hf_parity.max_diffs(
        hf_parity.our_outputs(pretrained, inputs),
        hf_parity.hf_outputs(loaded, inputs),
        inputs["attention_mask"],
    )
    print(f"{architecture} export max abs diff:", diffs)
    assert max(diffs.values()) < TOLERANCE, diffs
    bare = transformers.AutoModel.from_pretrained(out).eval()  # RobertaModel / AlbertModel
    bare_state = hf_parity.hf_outputs(bare, inputs)["last_hidden_state"]
    real = inputs["attention_mask"].astype(bool)
    assert (
        np.abs(bare_state - hf_parity.our_outputs(pretrained, inputs)["last_hidden_state"])[real].max()
        < TOLERANCE
    )
    # import(export(x)) == x exactly
    _, config_again, params_again, groups_again = convert.read_hf_model(out)
    assert config_again == config and groups_again == groups
    a, b = _flat(params), _flat(params_again)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg="/".join(key))


def test_roberta_classification_head_matches_transformers(tmp_path):
    """A RoBERTa import fine-tunes with fairseq's head (dropout, dense, tanh, dropout,
    out_proj on <s>), not BERT's pooler: with the weights of a random
    RobertaForSequenceClassification our ClassifierModel gives its logits."""
    model = hf_parity.randomize(
        transformers.RobertaForSequenceClassification(_roberta_config(num_labels=3)), seed=4
    )
    model.save_pretrained(str(tmp_path / "hf"))
    _, config, params, groups = convert.read_hf_model(str(tmp_path / "hf"))
    assert config.classifier_head == "roberta" and not config.pooler and "pooler" not in groups
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    head = {
        name: {"kernel": state[f"classifier.{theirs}.weight"].T, "bias": state[f"classifier.{theirs}.bias"]}
        for name, theirs in (("classifier_dense", "dense"), ("classifier", "out_proj"))
    }
    inputs = _family_inputs("roberta")
    batch = {
        "input_ids": inputs["input_ids"].astype(np.int32),
        "input_mask": inputs["attention_mask"].astype(np.int32),
        "segment_ids": inputs["token_type_ids"].astype(np.int32),
    }
    ours = jitted.apply(
        ClassifierModel(config, num_outputs=3),
        {"params": {"encoder": params["encoder"], **head}},
        batch,
        deterministic=True,
    )
    with torch.no_grad():
        theirs = model(**{k: torch.from_numpy(v) for k, v in inputs.items()}).logits.numpy()
    diff = float(np.abs(np.asarray(ours) - theirs).max())
    print("RobertaForSequenceClassification logits max abs diff:", diff)
    assert diff < 1e-5


def _write_albert_tf1_checkpoint(model: torch.nn.Module, directory: str, prefix: str = "") -> None:
    """A google-research/albert style checkpoint of an AlbertForPreTraining, names by hand
    (modeling.py: transformer/group_0/inner_group_0/{attention_1, LayerNorm, ffn_1, LayerNorm_1});
    `prefix` "module/" as in the TF-Hub exports."""
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    layer_hf, layer_tf = (
        "albert.encoder.albert_layer_groups.0.albert_layers.0.",
        "bert/encoder/transformer/group_0/inner_group_0/",
    )
    variables = {
        "bert/embeddings/word_embeddings": state["albert.embeddings.word_embeddings.weight"],
        "bert/embeddings/position_embeddings": state["albert.embeddings.position_embeddings.weight"],
        "bert/embeddings/token_type_embeddings": state["albert.embeddings.token_type_embeddings.weight"],
        "bert/embeddings/LayerNorm/gamma": state["albert.embeddings.LayerNorm.weight"],
        "bert/embeddings/LayerNorm/beta": state["albert.embeddings.LayerNorm.bias"],
        "bert/pooler/dense/kernel": state["albert.pooler.weight"].T,
        "bert/pooler/dense/bias": state["albert.pooler.bias"],
        "cls/predictions/transform/dense/kernel": state["predictions.dense.weight"].T,
        "cls/predictions/transform/dense/bias": state["predictions.dense.bias"],
        "cls/predictions/transform/LayerNorm/gamma": state["predictions.LayerNorm.weight"],
        "cls/predictions/transform/LayerNorm/beta": state["predictions.LayerNorm.bias"],
        "cls/predictions/output_bias": state["predictions.bias"],
        "cls/seq_relationship/output_weights": state["sop_classifier.classifier.weight"],
        "cls/seq_relationship/output_bias": state["sop_classifier.classifier.bias"],
    }
    dense = [
        ("bert/encoder/embedding_hidden_mapping_in", "albert.encoder.embedding_hidden_mapping_in"),
        (layer_tf + "attention_1/self/query", layer_hf + "attention.query"),
        (layer_tf + "attention_1/self/key", layer_hf + "attention.key"),
        (layer_tf + "attention_1/self/value", layer_hf + "attention.value"),
        (layer_tf + "attention_1/output/dense", layer_hf + "attention.dense"),
        (layer_tf + "ffn_1/intermediate/dense", layer_hf + "ffn"),
        (layer_tf + "ffn_1/intermediate/output/dense", layer_hf + "ffn_output"),
    ]
    for tf_name, hf_name in dense:
        variables[f"{tf_name}/kernel"] = state[f"{hf_name}.weight"].T
        variables[f"{tf_name}/bias"] = state[f"{hf_name}.bias"]
    for tf_name, hf_name in [("LayerNorm", "attention.LayerNorm"), ("LayerNorm_1", "full_layer_layer_norm")]:
        variables[f"{layer_tf}{tf_name}/gamma"] = state[f"{layer_hf}{hf_name}.weight"]
        variables[f"{layer_tf}{tf_name}/beta"] = state[f"{layer_hf}{hf_name}.bias"]
    _save_tf1({prefix + name: value for name, value in variables.items()}, directory)
    c = model.config
    with open(os.path.join(directory, "albert_config.json"), "w") as f:
        json.dump(
            {
                "attention_probs_dropout_prob": 0,
                "hidden_act": "gelu",
                "hidden_dropout_prob": 0,
                "embedding_size": c.embedding_size,
                "hidden_size": c.hidden_size,
                "initializer_range": 0.02,
                "intermediate_size": c.intermediate_size,
                "max_position_embeddings": c.max_position_embeddings,
                "num_attention_heads": c.num_attention_heads,
                "num_hidden_layers": c.num_hidden_layers,
                "num_hidden_groups": 1,
                "inner_group_num": 1,
                "type_vocab_size": c.type_vocab_size,
                "vocab_size": c.vocab_size,
            },
            f,
        )


@pytest.mark.parametrize("prefix", ["", "module/"])
def test_albert_tf1_checkpoint_imports_to_the_same_values(tmp_path, prefix):
    model = hf_parity.randomize(transformers.AlbertForPreTraining(_albert_config()), seed=2)
    model.save_pretrained(str(tmp_path / "hf"))
    _write_albert_tf1_checkpoint(model, str(tmp_path / "tf1"), prefix)
    fmt, config, params, groups = convert.read_tf_model(str(tmp_path / "tf1"))
    assert fmt is convert.FORMATS["albert"] and groups == ["pooler", "mlm_head", "sentence_head"]
    _, hf_config, expected, _ = convert.read_hf_model(str(tmp_path / "hf"))
    assert config == hf_config  # both gelu_tanh: ALBERT's TF "gelu" and HF's "gelu_new"
    got, expected = _flat(params), _flat(expected)
    assert got.keys() == expected.keys()
    for key in got:
        np.testing.assert_array_equal(got[key], expected[key], err_msg="/".join(key))


_CORPUS = [
    ["Paris is the capital of France.", "Berlin is the capital of Germany."],
    ["The city is large and old.", "A river runs through the city."],
    ["Many people live in the capital.", "The old city has a large river."],
] * 20


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["roberta", "albert"])
@pytest.mark.extended
def test_family_cli_import_encode_export(model_type, tmp_path, capsys):
    """A folder with the family's own tokenizer files -> workdir -> encode -> export -> transformers."""
    if model_type == "roberta":
        tokenizer = tokenizers.train_bpe(_CORPUS, 300, min_frequency=1)
        hf_config = _roberta_config()
        hf_config.vocab_size, hf_config.pad_token_id = tokenizer.vocab_size, tokenizer.pad_id
        architecture = "RobertaForMaskedLM"
    else:
        tokenizer = tokenizers.train_sentencepiece(_CORPUS, 45)
        hf_config = _albert_config()
        hf_config.vocab_size, hf_config.pad_token_id = tokenizer.vocab_size, tokenizer.pad_id
        architecture = "AlbertForPreTraining"
    model = hf_parity.randomize(getattr(transformers, architecture)(hf_config), seed=3)
    hf_dir = tmp_path / "hf"
    model.save_pretrained(str(hf_dir))
    tokenizer.save(str(hf_dir))
    workdir = tmp_path / "w"
    assert convert_cli.main(["import", f"--from=hf:{hf_dir}", f"--workdir={workdir}"]) == 0
    pretrained = bundle.load_pretrained(str(workdir))
    assert pretrained.tokenizer.identity() == tokenizer.identity()
    lines = tmp_path / "lines.txt"
    lines.write_text("Paris is the capital.\nThe city is old.\tA river runs.\n")
    out = tmp_path / "features.npz"
    assert encode.main([f"--workdir={workdir}", f"--input={lines}", f"--output={out}"]) == 0
    features = dict(np.load(out))
    if model_type == "roberta":  # <s> A </s></s> B </s>, one token type
        sep = tokenizer.sep_id
        row = features["input_ids"][1][features["attention_mask"][1] == 1].tolist()
        assert [sep, sep] == row[row.index(sep) : row.index(sep) + 2] and not features["token_type_ids"].any()
    inputs = {k: features[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
    theirs = hf_parity.hf_outputs(model, inputs)
    real = inputs["attention_mask"].astype(bool)
    assert np.abs(features["last_hidden_state"] - theirs["last_hidden_state"])[real].max() < TOLERANCE
    exported = tmp_path / "exported"
    assert convert_cli.main(["export", f"--workdir={workdir}", f"--to=hf:{exported}"]) == 0
    loaded = getattr(transformers, architecture).from_pretrained(str(exported)).eval()
    diffs = hf_parity.max_diffs(
        hf_parity.our_outputs(pretrained, inputs),
        hf_parity.hf_outputs(loaded, inputs),
        inputs["attention_mask"],
    )
    assert max(diffs.values()) < TOLERANCE, diffs
    assert tokenizers.load_tokenizer(str(exported)).identity() == tokenizer.identity()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(exported))
    for text in ("Paris is the capital of France.", "The old city has a river."):
        assert hf_tokenizer(text, add_special_tokens=False)["input_ids"] == tokenizer.encode(text)


def test_albert_options_we_cannot_express(tmp_path, capsys):
    for overrides, message in [
        ({"num_hidden_groups": 2}, "num_hidden_groups=2, inner_group_num=1 is not supported"),
        ({"embedding_size": 32}, "embedding_size = hidden_size = 32 is not supported"),
    ]:
        config = {**_albert_config().to_dict(), **overrides}
        with pytest.raises(convert.ConversionError, match=message):
            convert.hf_config_to_ours(config, "hf:x")


def _shards_for(tokenizer_dir: str, directory) -> str:
    """Shards of a small corpus written in the test vocab's words."""
    from data import preprocess

    rng = np.random.default_rng(0)
    words = [w for w in hf_parity.WORDS if not w.startswith("##") and w != "."]
    documents = [
        "\n".join(" ".join(rng.choice(words, size=rng.integers(3, 8))) + " ." for _ in range(6))
        for _ in range(40)
    ]
    directory.mkdir(exist_ok=True)
    corpus = directory / "corpus.txt"
    corpus.write_text("\n\n".join(documents) + "\n")
    output = str(directory / "shards")
    preprocess.preprocess(
        str(corpus), tokenizer_dir, output, num_shards=2, num_workers=1, eval_fraction=0.2, log=lambda m: None
    )
    return output


@pytest.mark.slow(90)
@pytest.mark.extended
def test_continued_pretraining_starts_from_the_imported_model(tmp_path):
    """run.init_from: an imported model's parameters start the run (lr 0 keeps them exactly);
    heads the HF model lacks (a BertModel has neither MLM nor NSP head) start from init;
    shards of another tokenizer are refused."""
    from core import optim
    from data.pipeline_config import PipelineConfig
    from pretrain import trainer

    model = hf_parity.randomize(transformers.BertModel(hf_parity.bert_config()), seed=5)
    imported = str(tmp_path / "imported")
    assert (
        convert_cli.main(
            ["import", f"--from=hf:{hf_parity.save_hf(model, str(tmp_path / 'hf'))}", f"--workdir={imported}"]
        )
        == 0
    )
    data_dir = _shards_for(os.path.join(imported, "tokenizer"), tmp_path)
    settings = trainer.RunSettings(
        data_dir=data_dir,
        model_config=bundle.load_model_config(imported),
        pipeline_config=PipelineConfig(
            max_seq_length=32, document_shuffle_buffer=10, instance_shuffle_buffer=10
        ),
        steps=1,
        batch_size=8,
        optimizer_fn=lambda total_steps: optim.adamw(total_steps, learning_rate=0.0, warmup_steps=0),
        eval_batches=1,
        init_from=imported,
    )
    trainer.run(str(tmp_path / "continued"), settings)
    source, _ = workdir_files.load_params(imported)
    continued, step = workdir_files.load_params(str(tmp_path / "continued"))
    assert step == 1
    source, continued = _flat(source), _flat(continued)
    assert set(source) <= set(continued)
    for key in source:
        np.testing.assert_array_equal(continued[key], source[key], err_msg="/".join(key))
    heads = {key[0] for key in continued if key not in source}
    assert heads == {"mlm_head", "sentence_head"} and ("encoder", "pooler", "kernel") in source

    # The recipes pad the vocab (vocab_pad_multiple): the 64-entry import fills the first 64
    # of 128 rows, and the export drops the padding again, giving the unpadded run's files.
    padded_config = dataclasses.replace(settings.model_config, vocab_pad_multiple=128)
    trainer.run(str(tmp_path / "padded"), dataclasses.replace(settings, model_config=padded_config))
    padded, _ = workdir_files.load_params(str(tmp_path / "padded"))
    padded = _flat(padded)
    table = ("encoder", "embeddings", "word_embeddings", "embedding")
    assert padded[table].shape == (128, 32) and padded[("mlm_head", "output_bias")].shape == (128,)
    np.testing.assert_array_equal(padded[table][:64], source[table])
    exported = {}
    for name in ("continued", "padded"):
        out = str(tmp_path / f"{name}_hf")
        assert convert_cli.main(["export", f"--workdir={tmp_path / name}", f"--to=hf:{out}"]) == 0
        exported[name] = load_file(os.path.join(out, "model.safetensors"))
    assert exported["padded"].keys() == exported["continued"].keys()
    for key, value in exported["continued"].items():
        np.testing.assert_array_equal(exported["padded"][key], value, err_msg=key)

    other = tokenizers.WordPieceTokenizer.from_vocab_file  # a different vocab: the test words reversed
    other_dir = tmp_path / "other_tokenizer"
    other_dir.mkdir()
    vocab = hf_parity.vocab(model.config.vocab_size)
    (other_dir / "vocab.txt").write_text("".join(t + "\n" for t in vocab[:6] + vocab[6:][::-1]))
    other(str(other_dir / "vocab.txt")).save(str(other_dir))
    other_data = _shards_for(str(other_dir), tmp_path / "other")
    with pytest.raises(workdir_files.WorkdirError, match="has another tokenizer than the shards"):
        trainer.run(str(tmp_path / "refused"), dataclasses.replace(settings, data_dir=other_data))
