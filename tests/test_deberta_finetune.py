"""DeBERTa's fine-tuning and fill-mask: the "deberta" head (the original's ContextPooler: dense
-> GELU on the first token, then dropout and the classifier); v1/v2 MLM workdirs (the encoder
has the absolute position table the enhanced mask decoder reads, which fine-tuning leaves
out); `python -m finetune.glue` on the offline demo task from a DeBERTa-v3 workdir (the
discriminator's word table a GDES delta on the generator's) and from an imported
transformers DeBERTa-v3 folder; fill-mask through the decoder."""

import dataclasses
import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from data import tokenizers
from data.pipeline_config import PipelineConfig
from finetune import demo_task, glue
from finetune.tasks import TASKS, read_glue_dir
from interop import bundle
from models.classifier import ClassifierModel
from models.deberta_rtd import fold_gdes
from models.disentangled import DisentangledConfig
from models.encoder import EncoderConfig
from pretrain.objectives import DebertaMLM, DebertaRTD
from tests import cli_run, jitted

CONFIG = EncoderConfig(
    vocab_size=60,
    hidden_size=32,
    num_layers=4,
    num_heads=2,
    intermediate_size=64,
    max_position_embeddings=32,
    type_vocab_size=0,
    layer_norm_eps=1e-7,
    pooler=False,
    classifier_head="deberta",
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
    disentangled=DisentangledConfig(position_buckets=8, max_relative_positions=32),
)


@pytest.mark.slow
def test_deberta_head_is_dense_gelu_then_classifier_on_the_first_token():
    rs = np.random.RandomState(0)
    batch = {
        "input_ids": rs.randint(5, 60, (3, 12)).astype(np.int32),
        "input_mask": np.ones((3, 12), np.int32),
        "segment_ids": np.zeros((3, 12), np.int32),
    }
    model = ClassifierModel(CONFIG, num_outputs=3)
    params = nn.meta.unbox(jitted.init(model, jax.random.key(0), batch, deterministic=True)["params"])
    assert set(params) == {"encoder", "classifier_dense", "classifier"}
    assert "position_embeddings" not in params["encoder"]["embeddings"]
    logits = jitted.apply(model, {"params": params}, batch, deterministic=True)
    from models.backbone import encoder_module

    first = jitted.apply(
        encoder_module(CONFIG),
        {"params": params["encoder"]},
        batch["input_ids"],
        batch["input_mask"],
        batch["segment_ids"],
        deterministic=True,
    ).sequence_output[:, 0]
    dense = params["classifier_dense"]
    hidden = jax.nn.gelu(first @ dense["kernel"] + dense["bias"], approximate=False)
    expected = hidden @ params["classifier"]["kernel"] + params["classifier"]["bias"]
    np.testing.assert_allclose(logits, expected, atol=1e-5)


def _pretraining_tree(objective) -> dict:
    return jax.device_get(nn.meta.unbox(jax.jit(objective.init)(jax.random.key(0))))


def _glue_on_the_demo_task(workdir, glue_dir, out, capsys):
    """`python -m finetune.glue` from `workdir` on the demo task: one seed, one epoch."""
    result = cli_run.run(
        glue.main,
        [
            f"--init_from={workdir}",
            "--tasks=word_order",
            f"--glue_dir={glue_dir}",
            f"--workdir={out}",
            "--gin_bindings=Grid.seeds = (0,)",
            "--gin_bindings=Grid.num_epochs = (1,)",
            "--gin_bindings=Grid.batch_sizes = (16,)",
            "--gin_bindings=Grid.learning_rates = (1e-4,)",
            "--gin_bindings=Grid.max_seq_length = 32",
        ],
        capsys,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    entry = json.loads((out / "results.json").read_text())["tasks"]["word_order"]
    assert 0.0 <= entry["metrics"]["dev"]["accuracy"] <= 1.0


@pytest.mark.slow
@pytest.mark.extended
def test_fine_tuning_leaves_out_the_decoders_position_table():
    """A DeBERTa MLM pretraining tree has the absolute position table the enhanced mask
    decoder reads; the fine-tuning model has none, and load_encoder leaves it out."""
    from core import sharding
    from finetune.model import load_encoder

    config = dataclasses.replace(CONFIG, vocab_size=60)
    tree = _pretraining_tree(DebertaMLM(config, PipelineConfig(max_seq_length=32, sentence_objective="none")))
    assert "position_embeddings" in tree["encoder"]["embeddings"]
    batch = {k: np.zeros((1, 8), np.int32) for k in ("input_ids", "input_mask", "segment_ids")}
    model = ClassifierModel(config, num_outputs=2)
    fresh = nn.meta.unbox(jitted.init(model, jax.random.key(0), batch, deterministic=True)["params"])
    mesh = sharding.make_mesh(None, jax.devices()[:1])
    shardings = jax.tree.map(lambda _: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()), fresh)
    loaded = load_encoder(config, fresh, tree, shardings)
    assert "position_embeddings" not in loaded["encoder"]["embeddings"]
    np.testing.assert_array_equal(
        loaded["encoder"]["layer_0"]["attention"]["query"]["kernel"],
        tree["encoder"]["layer_0"]["attention"]["query"]["kernel"],
    )


@pytest.mark.slow(30)
@pytest.mark.extended
def test_glue_on_the_demo_task_from_a_deberta_v3_workdir(tmp_path, capsys):
    """A DeBERTa-v3 pretraining workdir (GDES delta, generator) fine-tunes through its folded
    discriminator."""
    glue_dir = str(tmp_path / "glue")
    demo_task.make_task(glue_dir, train=64, dev=32, test=16)
    sentences = [example.text_a for example in read_glue_dir(glue_dir, TASKS["word_order"]).train]
    tokenizer = tokenizers.train_wordpiece([sentences], 300)
    config = dataclasses.replace(CONFIG, vocab_size=tokenizer.vocab_size)
    data = PipelineConfig(max_seq_length=32, sentence_objective="none", masking="in_step")
    tree = _pretraining_tree(DebertaRTD(config, data))
    delta = tree["encoder"]["embeddings"]["word_embeddings_delta"]["embedding"]
    tree["encoder"]["embeddings"]["word_embeddings_delta"]["embedding"] = delta + 0.5
    workdir = str(tmp_path / "deberta")
    bundle.save_pretrained(workdir, config, tree, tokenizer, step=5)
    loaded = bundle.load_pretrained(workdir)
    np.testing.assert_array_equal(
        loaded.params["encoder"]["embeddings"]["word_embeddings"]["embedding"],
        fold_gdes(tree)["encoder"]["embeddings"]["word_embeddings"]["embedding"],
    )
    _glue_on_the_demo_task(workdir, glue_dir, tmp_path / "out", capsys)


@pytest.mark.slow(40)
@pytest.mark.extended
def test_glue_from_an_imported_deberta_v3_folder(tmp_path, capsys):
    """A transformers DebertaV2ForMaskedLM folder laid out as the published DeBERTa-v3 ones
    (an spm.model with [MASK] appended, more embedding rows than tokens, legacy=False head)
    -> `interop.convert import` -> `finetune.glue` on the demo task through the ContextPooler
    head; the imported workdir's config is DeBERTa-v3's."""
    import torch
    import transformers

    from interop import convert
    from interop.convert import cli as convert_cli
    from tests import spm_files

    spm_dir = tmp_path / "hf"
    spm_dir.mkdir()
    (spm_dir / "spm.model").write_bytes(spm_files.train_spm(vocab_size=400))
    tokenizer = tokenizers.load_tokenizer(str(spm_dir / "spm.model"))
    assert tokenizer.vocab_size == 401 and tokenizer.mask_id == 400
    torch.manual_seed(0)
    model = transformers.DebertaV2ForMaskedLM(
        transformers.DebertaV2Config(
            vocab_size=tokenizer.vocab_size + 27,  # spare rows, as 128100 for 128001 tokens
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
            type_vocab_size=0,
            relative_attention=True,
            position_buckets=8,
            max_relative_positions=-1,
            pos_att_type="p2c|c2p",
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            position_biased_input=False,
            layer_norm_eps=1e-7,
            legacy=False,
            tie_word_embeddings=False,
        )
    )
    model.save_pretrained(str(spm_dir))
    convert.write_hf_tokenizer(tokenizer, EncoderConfig(vocab_size=tokenizer.vocab_size + 27), str(spm_dir))
    workdir = str(tmp_path / "imported")
    convert_cli.run_import(f"hf:{spm_dir}", workdir)
    imported = bundle.load_pretrained(workdir)
    assert imported.config.disentangled == DisentangledConfig(position_buckets=8, max_relative_positions=-1)
    assert (
        imported.config.classifier_head == "deberta"
        and imported.tokenizer.identity()["kind"] == "deberta_spm"
    )

    glue_dir = str(tmp_path / "glue")
    demo_task.make_task(glue_dir, train=64, dev=32, test=16)
    _glue_on_the_demo_task(workdir, glue_dir, tmp_path / "out", capsys)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mlm", "rtd"])
@pytest.mark.extended
def test_fill_mask_reads_through_the_enhanced_mask_decoder(tmp_path, family):
    """interop.predict on a DeBERTa workdir: the MLM model (v1/v2) or the generator (v3), with
    the decoder its head was trained on: the probabilities of the pretraining model itself."""
    from interop import predict
    from models.pretraining import BertPretrainingModel

    tokenizer = tokenizers.train_wordpiece([["the cat sat on the mat", "a dog ran in the park"]], 80)
    config = dataclasses.replace(CONFIG, vocab_size=tokenizer.vocab_size)
    data = PipelineConfig(max_seq_length=32, sentence_objective="none")
    if family == "mlm":
        tree = _pretraining_tree(DebertaMLM(config, data))
        model_config, mlm_tree = config, tree
    else:
        objective = DebertaRTD(config, dataclasses.replace(data, masking="in_step"))
        tree = _pretraining_tree(objective)
        model_config = objective.generator_config
        mlm_tree = {"encoder": tree["generator"], "mlm_head": tree["generator_head"]}
    workdir = str(tmp_path / "w")
    bundle.save_pretrained(workdir, config, tree, tokenizer, step=1)
    mask = tokenizer.mask_id
    row = [
        tokenizer.cls_id,
        *tokenizer.encode("the cat sat"),
        mask,
        *tokenizer.encode("the"),
        mask,
        tokenizer.sep_id,
    ]
    (found,) = predict.fill_mask_ids(bundle.load_pretrained(workdir), [row], top_k=3)
    batch = {
        "input_ids": np.array([row], np.int32),
        "input_mask": np.ones((1, len(row)), np.int32),
        "segment_ids": np.zeros((1, len(row)), np.int32),
        "masked_lm_positions": np.array([[i for i, t in enumerate(row) if t == mask]], np.int32),
    }
    model = BertPretrainingModel(model_config, sentence_head=False, enhanced_mask_decoder=True)
    probs = jax.nn.softmax(
        jitted.apply(model, {"params": mlm_tree}, batch, deterministic=True)["mlm_logits"]
    )[0]
    for slot, candidates in enumerate(found):
        best = np.argsort(-np.asarray(probs[slot]))[:3]
        assert [token for token, _ in candidates] == [tokenizer.id_to_token(int(t)) for t in best]
        np.testing.assert_allclose([p for _, p in candidates], np.asarray(probs[slot])[best], rtol=1e-5)
