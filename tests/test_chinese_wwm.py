"""Chinese whole-word masking (data/word_segmentation.py): a character vocabulary, the
segmenter's words in the shards, and masking that takes every character of a chosen word.

The corpus is made here: sentences of dictionary words joined by "，", so that every word is
known (the segmenter cannot join two across the comma) and a row's words can be read off
its tokens."""

from __future__ import annotations

import dataclasses
import logging
import os

import numpy as np
import pytest
import tensorflow as tf

from core.errors import ConfigError
from data import instances, masking, pipeline, preprocess, shards, tokenizers, word_segmentation
from data.pipeline_config import PipelineConfig

# Words of jieba's dictionary, each segmented as one word (asserted below), 1 to 7 characters.
WORDS = (
    "北京大学", "学习", "手机", "中华人民共和国", "经济", "发展", "研究", "我们", "今天",
    "天气", "非常", "重要", "问题", "社会", "科学", "技术", "历史", "文化", "语言", "模型",
    "的", "是", "人",
)  # fmt: skip


def _documents(count: int, seed: int) -> list[list[str]]:
    """`count` documents of 3 to 6 sentences, each 4 to 9 words joined by "，" and ended by "。"."""
    rng = np.random.default_rng(seed)
    return [
        ["，".join(rng.choice(WORDS, rng.integers(4, 10))) + "。" for _ in range(rng.integers(3, 7))]
        for _ in range(count)
    ]


# Chinese, mixed Chinese and English, full-width punctuation, digits and letters.
PARITY_TEXTS = (
    "北京大学的学生在学习语言模型。",
    "我们用GPT-4和BERT-base做了3个实验，准确率是97.5%。",
    "全角标点：“你好！”（测试）；【注意】……１２３ＡＢＣ，半角,标点.",
)


@pytest.fixture(scope="module")
def chinese(tmp_path_factory):
    """(the corpus file, the tokenizer directory): 240 documents, and a WordPiece vocabulary
    trained on them and on PARITY_TEXTS (so that none of their characters is unknown)."""
    base = tmp_path_factory.mktemp("chinese")
    docs = _documents(240, seed=0)
    corpus = base / "corpus.txt"
    corpus.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")
    tokenizers.train_wordpiece([*docs, PARITY_TEXTS], 300).save(str(base / "tokenizer"))
    return str(corpus), str(base / "tokenizer")


def _preprocess(chinese, output, **kwargs):
    corpus, tokenizer = chinese
    return preprocess.preprocess(
        corpus,
        tokenizer,
        str(output),
        num_shards=2,
        eval_fraction=0.1,
        num_workers=1,
        log=lambda _: None,
        **kwargs,
    )


@pytest.fixture(scope="module")
def segmented(chinese, tmp_path_factory):
    return _preprocess(chinese, tmp_path_factory.mktemp("segmented"), word_segmenter="jieba")


@pytest.fixture(scope="module")
def unsegmented(chinese, tmp_path_factory):
    return _preprocess(chinese, tmp_path_factory.mktemp("unsegmented"))


def test_the_words_are_the_dictionarys():
    text = "，".join(WORDS)
    words = [text[s:e] for s, e in word_segmentation.segmenter("jieba").words(text)]
    assert [w for w in words if w != "，"] == list(WORDS)


def test_a_chinese_vocabulary_has_characters_as_units(chinese):
    tokenizer = tokenizers.load_tokenizer(chinese[1])
    characters = {c for w in WORDS for c in w}
    vocab = {tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)}
    assert characters <= vocab
    # BERT's tokenizer spaces out CJK characters: no piece holds two, and no "##" piece one.
    assert not any(len(t.removeprefix("##")) > 1 and word_segmentation.is_cjk_ideograph(t[-1]) for t in vocab)
    assert tokenizer.encode("中华人民共和国") == [tokenizer.token_to_id(c) for c in "中华人民共和国"]


def test_only_the_later_characters_of_all_chinese_words_continue_them():
    """run_chinese_ref.py's rule: words of 2+ characters, all CJK ideographs; "GPT4", "2019",
    "iPhone" and one-character words continue nothing, nor does punctuation."""
    tokenizer = tokenizers.WordPieceTokenizer(
        [
            "[PAD]",
            "[UNK]",
            "[CLS]",
            "[SEP]",
            "[MASK]",
            *"我在北京大学习和手机，年的预测概率。",
            "gp",
            "##t",
            "##4",
            "iphone",
            "2019",
        ],
        lowercase=True,
    )
    text = "我在北京大学学习GPT4和iPhone手机，2019年的预测概率。"
    [(ids, offsets)] = tokenizer.encode_batch_offsets([text])
    inner = word_segmentation.inner_characters(text, word_segmentation.segmenter("jieba").words(text))
    continuing = word_segmentation.continuing_tokens(text, offsets, inner)
    assert [tokenizer.id_to_token(ids[i]) for i in continuing] == ["京", "大", "学", "习", "机", "测", "率"]


def _records(manifest: shards.Manifest) -> list[dict]:
    files = manifest.files("train") + manifest.files("eval")
    parse = lambda record: instances.parse_document(record, word_tags=True)  # noqa: E731
    return list(tf.data.TFRecordDataset(files).map(parse).as_numpy_iterator())


def test_the_shards_list_the_segmenters_words(segmented, unsegmented, chinese):
    tokenizer = tokenizers.load_tokenizer(chinese[1])
    assert segmented.word_segmenter == {
        "name": "jieba",
        "library": "rjieba",
        "version": "0.2.2",
        "hmm": False,
    }
    assert unsegmented.word_segmenter is None
    assert segmented.fields["fingerprint"] != unsegmented.fields["fingerprint"]
    comma, period = tokenizer.token_to_id("，"), tokenizer.token_to_id("。")
    for record in _records(segmented):
        ids = record["token_ids"]
        tagged = ids >= masking.WORD_TAG
        tokens = ids & (masking.WORD_TAG - 1)
        # Each run between punctuation is one word: its first character untagged, the rest tagged.
        words = np.split(np.arange(len(ids)), np.flatnonzero(np.isin(tokens, [comma, period])))
        for positions in words:
            positions = positions[~np.isin(tokens[positions], [comma, period])]
            if not len(positions):  # after the last "。"
                continue
            assert "".join(tokenizer.id_to_token(t) for t in tokens[positions]) in WORDS
            assert not tagged[positions[0]] and tagged[positions[1:]].all()
    # The same tokens either way: the words ride beside them.
    plain = {r["doc_id"]: r["token_ids"] for r in _records(unsegmented)}
    assert all(
        np.array_equal(r["token_ids"] & (masking.WORD_TAG - 1), plain[r["doc_id"]])
        for r in _records(segmented)
    )
    assert not any((r["token_ids"] >= masking.WORD_TAG).any() for r in _records(unsegmented))


def _rows(manifest, unit: str, count: int = 60, split: str = "train", **config) -> list[dict]:
    cfg = PipelineConfig(
        max_seq_length=64, masking_unit=unit, short_seq_prob=0.0, instance_shuffle_buffer=50, **config
    )
    ds = pipeline.make_dataset(manifest.directory, split, cfg, 1)
    return [{k: v[0] for k, v in row.items()} for row in ds.take(count).as_numpy_iterator()]


def _word_masking(row: dict, separators: set[int]) -> list[np.ndarray]:
    """Per word of the row (runs between punctuation and specials): which of its tokens are masked."""
    chosen = row["masked_lm_weights"] > 0
    masked = np.zeros(len(row["input_ids"]), bool)
    masked[row["masked_lm_positions"][chosen]] = True
    original = row["input_ids"].copy()
    original[row["masked_lm_positions"][chosen]] = row["masked_lm_ids"][chosen]
    cut = np.isin(original, list(separators))  # a masked "，" is a word of its own: left out
    runs = np.split(np.arange(len(masked)), np.flatnonzero(cut))
    return [masked[r[~cut[r]]] for r in runs if (~cut[r]).any()]


@pytest.mark.slow
def test_whole_word_masking_masks_every_character_of_a_word_and_nothing_across(segmented, chinese):
    tokenizer = tokenizers.load_tokenizer(chinese[1])
    separators = {tokenizer.token_to_id(t) for t in ("，", "。", "[CLS]", "[SEP]", "[PAD]")}

    def split_words(unit, manifest):
        words = [w for row in _rows(manifest, unit) for w in _word_masking(row, separators)]
        return sum(w.any() and not w.all() for w in words), sum(w.all() for w in words)

    split, whole = split_words("whole_word", segmented)
    assert split == 0 and whole > 100
    # Character masking on the same shards splits words: the check can fail.
    split, _ = split_words("token", segmented)
    assert split > 20


@pytest.mark.slow
def test_macberts_masking_takes_whole_words_and_puts_no_mask(segmented, chinese):
    tokenizer = tokenizers.load_tokenizer(chinese[1])
    separators = {tokenizer.token_to_id(t) for t in ("，", "。", "[CLS]", "[SEP]", "[PAD]")}
    rows = _rows(segmented, "ngram", ngram_probabilities=(0.4, 0.3, 0.2, 0.1), replacement="random")
    words = [w for row in rows for w in _word_masking(row, separators)]
    assert not any(w.any() and not w.all() for w in words) and sum(w.all() for w in words) > 100
    assert not any((row["input_ids"] == tokenizer.mask_id).any() for row in rows)


@pytest.mark.slow
def test_the_masking_rate_stays_at_15_percent(segmented):
    rates = {}
    for unit in ("token", "whole_word"):
        rows = _rows(segmented, unit, count=200)
        rates[unit] = sum(r["masked_lm_weights"].sum() for r in rows) / sum(
            r["input_mask"].sum() for r in rows
        )
    # BERT's count, round(0.15 x tokens): whole words reach it unless no word left fits.
    assert 0.145 < rates["token"] < 0.155
    assert 0.14 < rates["whole_word"] <= rates["token"]


@pytest.mark.slow
def test_the_words_do_not_reach_the_model(segmented):
    row = _rows(segmented, "whole_word", count=1)[0]
    assert masking.WORD_CONTINUES not in row
    assert (row["input_ids"] < masking.WORD_TAG).all() and (row["masked_lm_ids"] < masking.WORD_TAG).all()


@pytest.mark.slow
def test_required_words_on_shards_without_them_is_one_line(unsegmented):
    with pytest.raises(ConfigError, match="preprocess them with --word_segmenter=jieba"):
        _rows(unsegmented, "whole_word", count=1, require_word_segmenter=True)
    with pytest.raises(ConfigError, match="needs words to mask"):
        PipelineConfig(require_word_segmenter=True)


@pytest.mark.slow
def test_whole_words_of_chinese_without_a_segmenter_warn(unsegmented, caplog):
    with caplog.at_level(logging.WARNING):
        _rows(unsegmented, "whole_word", count=1)
    assert "this is character masking" in caplog.text


def test_a_segmenter_with_another_tokenizer_kind_is_one_line(chinese, tmp_path):
    corpus, _ = chinese
    tokenizers.train_bpe([["中文句子。"] * 3], 300).save(str(tmp_path / "bpe"))
    with pytest.raises(preprocess.PreprocessError, match="for BERT's WordPiece tokenizer"):
        preprocess.preprocess(corpus, str(tmp_path / "bpe"), str(tmp_path / "out"), word_segmenter="jieba")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text", PARITY_TEXTS)
def test_tokens_equal_transformers_bert_tokenizer_on_chinese(chinese, text):
    from transformers import BertTokenizer

    ours = tokenizers.load_tokenizer(chinese[1])
    theirs = BertTokenizer(f"{chinese[1]}/vocab.txt", do_lower_case=True)
    assert ours.encode(text) == theirs.encode(text, add_special_tokens=False)
    assert ours.unk_id not in ours.encode(text)  # every character is in the vocabulary


@pytest.mark.slow(20)
@pytest.mark.extended
def test_a_tiny_chinese_run_with_whole_word_masking_learns(segmented, tmp_path):
    """The tiny model, whole-word masked on the segmented shards, beats always predicting
    the most frequent token on the held-out words (its length in [MASK]s, and a kept or
    random character, tell which word it was)."""
    from tests import tiny

    data = PipelineConfig(
        max_seq_length=32, masking_unit="whole_word", require_word_segmenter=True, instance_shuffle_buffer=50
    )
    model = dataclasses.replace(tiny.TINY, vocab_size=segmented.vocab_size)
    summary = tiny.run(
        tmp_path, segmented.directory, 300, model_config=model, pipeline_config=data, eval_batches=8
    )
    rows = _rows(segmented, "whole_word", count=400, split="eval")
    counts = np.asarray(segmented.unigram_counts())
    top = int(np.argmax(counts))
    baseline = sum(((r["masked_lm_ids"] == top) * r["masked_lm_weights"]).sum() for r in rows) / sum(
        r["masked_lm_weights"].sum() for r in rows
    )
    # Measured: 0.41 against 0.31 ("，", a word of its own, is the most frequent token).
    assert summary["eval"]["mlm_accuracy"] > baseline + 0.05, (summary["eval"], baseline)


@pytest.mark.parametrize("recipe", ["chinese_bert_wwm", "macbert"])
def test_the_chinese_recipes_build_on_berts(recipe):
    import gin

    from pretrain import trainer  # noqa: F401  (registers run, lamb)

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = ["configs/models/bert_base.gin", "configs/recipes/bert.gin", f"configs/recipes/{recipe}.gin"]
    gin.clear_config()
    try:
        gin.parse_config_files_and_bindings([os.path.join(root, f) for f in files], [])
        data = PipelineConfig()
    finally:
        gin.clear_config()
    assert data.require_word_segmenter
    if recipe == "macbert":
        assert (data.masking_unit, data.ngram_probabilities, data.replacement) == (
            "ngram",
            (0.4, 0.3, 0.2, 0.1),
            "random",
        )
        assert (data.sentence_objective, data.max_seq_length, data.max_predictions_per_seq) == (
            "sop",
            512,
            80,
        )
    else:
        assert (data.masking_unit, data.replacement, data.sentence_objective) == ("whole_word", "mask", "nsp")


# MacBERT's similar words (after a byte-order mark): two words of the corpus with another of
# their length, the first after one with characters the vocabulary lacks (skipped: [UNK]);
# one whose only candidate is itself (dropped), and a line without candidates (ignored).
SIMILAR = "\ufeff学习  电脑 研究 问题\n北京大学  社会科学\n发展  发展\n天气\n"


@pytest.mark.slow
def test_macberts_similar_words_replace_whole_words(segmented, chinese, tmp_path):
    tokenizer = tokenizers.load_tokenizer(chinese[1])
    (tmp_path / "similar.txt").write_text(SIMILAR, encoding="utf-8")
    table = {
        tuple(tokenizer.encode(a)): tokenizer.encode(b)
        for a, b in (("学习", "研究"), ("北京大学", "社会科学"))
    }
    config = dict(replacement="similar", similar_words=str(tmp_path / "similar.txt"))
    rows = _rows(segmented, "whole_word", count=400, **config)
    outcomes = {"similar": 0, "kept": 0, "other": 0}
    for row in rows:
        chosen = row["masked_lm_weights"] > 0
        positions, originals = row["masked_lm_positions"][chosen], row["masked_lm_ids"][chosen]
        assert tokenizer.mask_id not in row["input_ids"]
        # The masked runs of a table word: each word whole (the tag-free ids) as the table has it.
        for start in range(len(positions)):
            for word, similar in table.items():
                span = positions[start : start + len(word)]
                if tuple(originals[start : start + len(word)]) != word or not np.array_equal(
                    span, span[0] + np.arange(len(word))
                ):
                    continue
                now = list(row["input_ids"][span])
                outcomes["similar" if now == similar else "kept" if tuple(now) == word else "other"] += 1
    total = sum(outcomes.values())
    assert total > 60, outcomes
    # One draw per word: 80% its similar word, 10% kept, 10% random tokens.
    assert 0.7 < outcomes["similar"] / total < 0.9 and outcomes["kept"] / total < 0.2, outcomes


def test_a_similar_word_table_is_checked(segmented, tmp_path):
    with pytest.raises(ConfigError, match="go together"):
        PipelineConfig(masking_unit="whole_word", replacement="similar")
    with pytest.raises(ConfigError, match="not all 0"):
        PipelineConfig(masking_unit="ngram", ngram_probabilities=(0.0, 0.0))
    from data import similar_words

    with pytest.raises(similar_words.SimilarWordsError, match="not found"):
        _rows(
            segmented, "whole_word", count=1, replacement="similar", similar_words=str(tmp_path / "none.txt")
        )
    (tmp_path / "bad.txt").write_text("发展 发展\n", encoding="utf-8")
    with pytest.raises(similar_words.SimilarWordsError, match="no word has a similar word"):
        _rows(
            segmented, "whole_word", count=1, replacement="similar", similar_words=str(tmp_path / "bad.txt")
        )


@pytest.mark.slow
def test_the_iterator_with_a_similar_word_table_saves_and_restores(segmented, tmp_path):
    (tmp_path / "similar.txt").write_text(SIMILAR, encoding="utf-8")
    cfg = PipelineConfig(
        max_seq_length=64,
        masking_unit="whole_word",
        replacement="similar",
        similar_words=str(tmp_path / "similar.txt"),
        instance_shuffle_buffer=50,
    )
    first = iter(pipeline.make_dataset(segmented.directory, "train", cfg, 2))
    next(first)
    path = tf.train.Checkpoint(iterator=first).save(str(tmp_path / "it"))
    expected = next(first)
    second = iter(pipeline.make_dataset(segmented.directory, "train", cfg, 2))
    tf.train.Checkpoint(iterator=second).restore(path)
    got = next(second)
    assert all(np.array_equal(expected[k], got[k]) for k in expected)
