"""XLNet's transformers folders (interop/convert/xlnet.py): import equals transformers'
XLNetLMHeadModel, export loads back into transformers with the same outputs and reimports
bit-identical; an XLNetModel folder gives the encoder; the fine-tuning model equals
`XLNetForSequenceClassification` on left-padded pairs; a workdir's tokenizer exports to
what transformers' AutoTokenizer reads with our ids; feature extraction (left padded) and
fill-mask through the query stream equal transformers'."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from data import tokenizers
from interop import bundle, convert, predict
from interop import encode as encode_lib
from interop.convert import cli as convert_cli
from interop.convert.layout import ConversionError
from models.classifier import ClassifierModel
from tests import test_xlnet as reference
from tests.test_deberta_interop import _assert_same_params
from tests.test_xlnet_tokenizer import _topic_documents

TOLERANCE = 1e-5


@pytest.mark.slow
def test_import_matches_transformers_and_exports_back(tmp_path):
    """HF -> ours: the same logits, loss and memories as XLNetLMHeadModel. Ours -> HF:
    transformers loads the export with the same outputs. HF -> ours -> HF -> ours: the same
    arrays and config."""
    model = reference._hf_model(bi_data=False, clamp_len=-1)
    model.save_pretrained(str(tmp_path / "hf"))
    fmt, config, params, groups = convert.read_hf_model(str(tmp_path / "hf"))
    assert fmt is convert.FORMATS["xlnet"] and groups == ["plm_head"]
    assert (config.hidden_act, config.classifier_head, config.pooler) == ("gelu_tanh", "xlnet", False)
    assert (config.xlnet.mem_len, config.xlnet.reuse_len) == (reference.MEM, reference.REUSE)
    x = reference._inputs()
    direction = [1] * reference.B
    ours = reference._ours(config, {"params": params}, x, direction)
    theirs = reference._theirs(model, x)
    real = x["target_weights"] > 0
    np.testing.assert_allclose(ours[0][real], theirs[0][real], atol=TOLERANCE, rtol=TOLERANCE)
    np.testing.assert_allclose(ours[1], theirs[1], rtol=TOLERANCE)
    np.testing.assert_allclose(ours[2], theirs[2], atol=TOLERANCE, rtol=TOLERANCE)

    out = str(tmp_path / "exported")
    assert convert.write_hf_model(out, config, params, pad_id=5) == "XLNetLMHeadModel"
    exported = json.load(open(os.path.join(out, "config.json")))
    assert (exported["d_model"], exported["ff_activation"], exported["untie_r"]) == (32, "gelu_new", True)
    loaded = transformers.XLNetLMHeadModel.from_pretrained(out).eval()
    again = reference._theirs(loaded, x)
    np.testing.assert_allclose(again[0][real], theirs[0][real], atol=TOLERANCE, rtol=TOLERANCE)
    np.testing.assert_allclose(again[2], theirs[2], atol=TOLERANCE, rtol=TOLERANCE)
    _, config_again, params_again, groups_again = convert.read_hf_model(out)
    assert config_again == config and groups_again == groups
    _assert_same_params(params_again, params)


def test_an_xlnet_model_folder_gives_the_encoder(tmp_path, caplog):
    """XLNetModel has no LM head: the encoder is imported, its mask_emb (the query stream's
    start, which only pretraining reads) left out."""
    caplog.set_level("INFO")
    model = transformers.XLNetModel(reference._hf_model(False, -1).config)
    model.save_pretrained(str(tmp_path))
    _, config, params, groups = convert.read_hf_model(str(tmp_path))
    assert groups == [] and set(params) == {"encoder"}
    assert "no LM head (lm_loss.bias): its query-stream start mask_emb is left out" in caplog.text
    hf = model.config.to_dict()
    assert convert.hf_config_to_ours({**hf, "mem_len": 0, "reuse_len": 0}, "hf:X")[1].xlnet.mem_len == 0
    assert convert.hf_config_to_ours({**hf, "mem_len": None}, "hf:X")[1].xlnet.mem_len == 384
    with pytest.raises(ConversionError, match="config.json untie_r=False is not supported"):
        convert.hf_config_to_ours({**model.config.to_dict(), "untie_r": False}, "hf:X")
    with pytest.raises(ConversionError, match="config.json attn_type='uni' is not supported"):
        convert.hf_config_to_ours({**model.config.to_dict(), "attn_type": "uni"}, "hf:X")


@pytest.mark.slow
def test_fine_tuning_model_equals_transformers_sequence_classification(tmp_path):
    """Our classifier (the encoder, `classifier_dense`, `classifier`) with the weights of a
    random XLNetForSequenceClassification gives its logits on pairs padded on the LEFT (pad
    segment 4), rows of different lengths in one batch."""
    hf_config = reference._hf_model(False, -1).config
    hf_config.num_labels = 3
    torch.manual_seed(0)
    model = transformers.XLNetForSequenceClassification(hf_config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape))
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    bare = transformers.XLNetModel(hf_config)
    base = "transformer."
    bare.load_state_dict({k[len(base) :]: v for k, v in model.state_dict().items() if k.startswith(base)})
    bare.save_pretrained(str(tmp_path))
    _, config, params, _ = convert.read_hf_model(str(tmp_path))
    params = {
        "encoder": params["encoder"],
        "classifier_dense": {
            "kernel": state["sequence_summary.summary.weight"].T,
            "bias": state["sequence_summary.summary.bias"],
        },
        "classifier": {"kernel": state["logits_proj.weight"].T, "bias": state["logits_proj.bias"]},
    }
    rows = [[11, 12, 13, 4, 21, 22, 4, 3], [30, 31, 4, 40, 4, 3], [50, 4, 60, 61, 62, 63, 64, 4, 3]]
    length = 12
    ids = np.full((3, length), 5, np.int32)
    mask = np.zeros((3, length), np.int32)
    segments = np.full((3, length), 4, np.int32)
    for i, row in enumerate(rows):
        sep = row.index(4)
        ids[i, length - len(row) :] = row
        mask[i, length - len(row) :] = 1
        segments[i, length - len(row) :] = [0] * (sep + 1) + [1] * (len(row) - sep - 2) + [2]
    ours = ClassifierModel(config, num_outputs=3).apply(
        {"params": params},
        {
            "input_ids": jnp.asarray(ids),
            "input_mask": jnp.asarray(mask),
            "segment_ids": jnp.asarray(segments),
        },
        deterministic=True,
    )
    with torch.no_grad():
        theirs = model(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.float32),
            token_type_ids=torch.tensor(segments, dtype=torch.long),
        ).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=TOLERANCE, rtol=TOLERANCE)


@pytest.mark.slow
def test_a_workdir_round_trips_through_a_transformers_folder_with_its_tokenizer(tmp_path, capsys):
    """import (model + spiece.model) -> workdir -> export: AutoTokenizer reads the exported
    folder and gives our ids, AutoModel the same hidden states as the folder imported."""
    tokenizer = tokenizers.train_xlnet_sentencepiece(_topic_documents(300), 300, lowercase=False)
    hf_config = reference._hf_model(False, -1).config
    hf_config.vocab_size = tokenizer.vocab_size
    model = transformers.XLNetLMHeadModel(hf_config).eval()
    model.save_pretrained(str(tmp_path / "hf"))
    (tmp_path / "hf" / "spiece.model").write_bytes(tokenizer._proto)
    argv = ["import", f"--from=hf:{tmp_path / 'hf'}", f"--workdir={tmp_path / 'work'}"]
    assert convert_cli.main(argv) == 0
    assert convert_cli.main(["export", f"--workdir={tmp_path / 'work'}", f"--to=hf:{tmp_path / 'out'}"]) == 0
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    text = "Sentences of Python's documentation, 3,000 of them."
    assert theirs.encode(text, add_special_tokens=False) == tokenizer.encode(text)
    assert theirs.padding_side == "left"
    exported = transformers.AutoModel.from_pretrained(str(tmp_path / "out")).eval()
    ids = torch.tensor([tokenizer.encode(text)])
    with torch.no_grad():
        a = exported(input_ids=ids).last_hidden_state.numpy()
        b = model.transformer(input_ids=ids).last_hidden_state.numpy()
    np.testing.assert_allclose(a, b, atol=TOLERANCE, rtol=TOLERANCE)

    # Feature extraction: rows padded on the left, the hidden states of transformers' model at
    # the real tokens.
    pretrained = bundle.load_pretrained(str(tmp_path / "work"))
    lines = [text, "Short one.\tA pair, with its second text."]
    features = encode_lib.encode(pretrained, encode_lib.build_inputs(tokenizer, lines, 64), batch_size=2)
    assert "pooled_output" not in features and (features["attention_mask"][:, -1] == 1).all()
    with torch.no_grad():
        hf = model.transformer(
            input_ids=torch.tensor(features["input_ids"], dtype=torch.long),
            attention_mask=torch.tensor(features["attention_mask"], dtype=torch.float32),
            token_type_ids=torch.tensor(features["token_type_ids"], dtype=torch.long),
        ).last_hidden_state.numpy()
    real = features["attention_mask"] == 1
    np.testing.assert_allclose(features["last_hidden_state"][real], hf[real], atol=TOLERANCE, rtol=TOLERANCE)

    # Fill-mask through the query stream: each <mask> predicted from every other token and no
    # other mask, as XLNetLMHeadModel with a perm_mask hiding the masks from every position.
    text = "Sentences <mask> Python's <mask>, 3,000 of them."
    [masks] = predict.fill_mask(pretrained, [text], top_k=3)
    ids = predict.masked_inputs(tokenizer, text, 64)
    assert ids[-2:] == [tokenizer.sep_id, tokenizer.cls_id]
    where = [i for i, t in enumerate(ids) if t == tokenizer.mask_id]
    perm_mask = torch.zeros(1, len(ids), len(ids))
    perm_mask[:, :, where] = 1.0
    target_mapping = torch.zeros(1, len(where), len(ids))
    target_mapping[0, range(len(where)), where] = 1.0
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor([ids]),
            token_type_ids=torch.tensor([[0] * (len(ids) - 1) + [2]]),
            perm_mask=perm_mask,
            target_mapping=target_mapping,
        ).logits[0]
    probs = torch.softmax(logits, -1).numpy()
    for found, p in zip(masks, probs):
        best = np.argsort(-p)[:3]
        assert [token for token, _ in found] == [tokenizer.id_to_token(int(t)) for t in best]
        np.testing.assert_allclose([q for _, q in found], p[best], atol=TOLERANCE)
