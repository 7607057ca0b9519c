"""The recipes end to end at tiny size: each recipe file with its own tokenizer kind
(BERT + WordPiece, RoBERTa + byte-level BPE, ALBERT + SentencePiece, ELECTRA and SpanBERT +
WordPiece) on
real English text, preprocessed to shards, trained for a few steps through `pretrain.trainer.run`; and every
ablation arm file builds on its base."""

import glob
import os

import gin
import jax
import numpy as np
import pytest

from data import corpora, preprocess, tokenizers
from data.pipeline_config import PipelineConfig
from models.encoder import EncoderConfig
from models.pretraining import abstract_params
from pretrain import trainer  # noqa: F401  (registers run, adamw, lamb)
from pretrain.objectives import make_objective

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# recipe -> (model size file, tokenizer trainer, vocab size)
RECIPES = {
    "bert": ("bert_base.gin", tokenizers.train_wordpiece, 400),
    "roberta": ("roberta_base.gin", tokenizers.train_bpe, 400),
    "albert": ("albert_base.gin", tokenizers.train_sentencepiece, 300),
    "electra": ("electra_small.gin", tokenizers.train_wordpiece, 400),
    "spanbert": ("spanbert_base.gin", tokenizers.train_wordpiece, 400),
}
# The recipes' model shapes, shrunk: what stays is the recipe's (E, sharing, offsets, objectives).
TINY = """
EncoderConfig.num_layers = 2
EncoderConfig.hidden_size = 32
EncoderConfig.num_heads = 2
EncoderConfig.intermediate_size = 64
PipelineConfig.max_seq_length = 64
PipelineConfig.dupe_factor = 2
PipelineConfig.document_shuffle_buffer = 10
PipelineConfig.instance_shuffle_buffer = 20
run.batch_size = 8
run.steps = 3
run.log_every = 1
run.eval_every = 3
run.eval_batches = 1
run.checkpoint_every = 3
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """60 documents of the demo corpus as a BERT-format text file."""
    documents = corpora.demo_documents()[:60]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join("\n".join(d.sentences) for d in documents) + "\n")
    return str(path), [d.sentences for d in documents]


@pytest.fixture(scope="module", params=sorted(RECIPES))
def recipe_data(request, corpus, tmp_path_factory):
    name = request.param
    _, train, vocab_size = RECIPES[name]
    path, documents = corpus
    root = tmp_path_factory.mktemp(name)
    train(documents, vocab_size).save(str(root / "tokenizer"))
    preprocess.preprocess(
        path,
        str(root / "tokenizer"),
        str(root / "shards"),
        num_shards=2,
        num_workers=1,
        eval_fraction=0.1,
        log=lambda m: None,
    )
    return name, str(root / "shards"), root


@pytest.mark.slow(30)
@pytest.mark.extended
def test_recipe_trains_with_its_tokenizer(recipe_data):
    name, data_dir, root = recipe_data
    model_file = RECIPES[name][0]
    vocab_size = tokenizers.load_tokenizer(str(root / "tokenizer")).vocab_size
    gin.clear_config()
    try:
        gin.parse_config_files_and_bindings(
            [
                os.path.join(ROOT, "configs/models", model_file),
                os.path.join(ROOT, f"configs/recipes/{name}.gin"),
            ],
            [*TINY.strip().splitlines(), f"EncoderConfig.vocab_size = {vocab_size}"]
            + (["EncoderConfig.embedding_size = 16"] if name == "albert" else []),
        )
        data = PipelineConfig()
        config = EncoderConfig()
        summary = trainer.run(str(root / "run"), trainer.RunSettings(data_dir=data_dir))
    finally:
        gin.clear_config()
    assert summary["step"] == 3 and np.isfinite(summary["loss"])
    # The recipe's choices reached the model and the data.
    expected = {
        "bert": ("segment_pair", "nsp", "token"),
        "roberta": ("full_sentences", "none", "token"),
        "albert": ("segment_pair", "sop", "ngram"),
        "electra": ("segment_pair", "none", "token"),
        "spanbert": ("doc_sentences", "none", "span"),
    }[name]
    assert (data.format, data.sentence_objective, data.masking_unit) == expected
    assert ("sentence_accuracy" not in summary) == (name in ("roberta", "electra", "spanbert"))
    if name == "electra":  # generator + discriminator: tests/test_electra.py checks the tree
        assert summary["objective"] == "ElectraRTD" and data.masking == "in_step"
        assert 0 <= summary["disc_accuracy"] <= 1 and not config.pooler
        return
    if name == "spanbert":  # unpacked blocks, MLM + SBO: tests/test_spanbert.py checks the rest
        assert summary["objective"] == "SpanBoundary" and not data.packed and data.masking == "dynamic"
        assert 0 <= summary["eval"]["sbo_accuracy"] <= 1 and config.vocab_size == vocab_size
        return
    params = abstract_params(config, sentence_head=name != "roberta")
    encoder = set(params["encoder"])
    if name == "albert":
        assert {"embedding_projection", "shared_layer"} <= encoder and config.embedding_size == 16
    else:
        assert "layer_0" in encoder and "embedding_projection" not in encoder
    assert config.position_offset == (2 if name == "roberta" else 0)


ABLATIONS = os.path.join(ROOT, "configs", "ablations")
GRIDS = {
    "roberta_formats": {"segment_pair_nsp", "sentence_pair_nsp", "full_sentences", "doc_sentences"},
    "masking": {"static", "dynamic"},
    "sentence_objective": {"none", "nsp", "sop"},
    "albert_sharing": {"all", "attention", "ffn", "none"},
    "albert_embedding": {"64", "128", "256", "768"},
    "masking_unit": {"token", "whole_word", "ngram", "span", "span_sbo"},
    "electra_vs_mlm": {"electra", "mlm", "deberta_v3"},
    "chinese_masking": {"character", "whole_word"},
}


def _built(base: list[str], arm: str) -> tuple[EncoderConfig, PipelineConfig]:
    gin.clear_config()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        gin.parse_config_files_and_bindings([*base, arm], [])
        config, data = EncoderConfig(), PipelineConfig()
        objective = make_objective(config, data)
        jax.eval_shape(objective.init, jax.random.key(0))
        return config, data, type(objective).__name__
    finally:
        os.chdir(cwd)
        gin.clear_config()


@pytest.mark.slow
@pytest.mark.parametrize("grid", sorted(GRIDS))
def test_every_ablation_arm_builds_on_its_base_and_differs(grid):
    """Each arm file builds (model params and pipeline) on top of a base run, and no two arms
    of a grid build the same configuration."""
    arms = {os.path.basename(p)[: -len(".gin")]: p for p in glob.glob(os.path.join(ABLATIONS, grid, "*.gin"))}
    assert set(arms) == GRIDS[grid]
    if grid.startswith("albert"):
        base = ["configs/models/albert_base.gin", "configs/recipes/albert.gin"]
    else:
        base = ["configs/runs/demo.gin"]
    built = {name: _built(base, path) for name, path in arms.items()}
    assert len(set(built.values())) == len(arms), built
    if grid == "albert_embedding":
        assert {str(config.embedding_size) for config, _, _ in built.values()} == GRIDS[grid]
    if grid == "electra_vs_mlm":
        assert {name: objective for name, (_, _, objective) in built.items()} == {
            "electra": "ElectraRTD",
            "mlm": "MaskedLM",
            "deberta_v3": "DebertaRTD",
        }
    if grid == "masking_unit":
        objectives = {name: objective for name, (_, _, objective) in built.items()}
        assert objectives.pop("span_sbo") == "SpanBoundary" and set(objectives.values()) == {"MaskedLM"}
        assert built["span"][1].masking_unit == built["span_sbo"][1].masking_unit == "span"
    if grid == "chinese_masking":
        assert built["character"][1].masking_unit == "token"
        assert (
            built["whole_word"][1].require_word_segmenter
            and built["whole_word"][1].masking_unit == "whole_word"
        )
