"""XLNet's encoder (models/xlnet.py) against transformers' XLNetLMHeadModel, whose forward
pass is the original's (two streams, relative positions with rel_shift, segment terms,
memories, bi_data): the same logits, loss and new memories from the same weights, with a
permutation mask, targets, random memories, both directions and clamp_len; and our
query stream at the P targets equals the original's all-rows-then-gather.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch  # requirements-test.txt: the reference implementation, CPU
import transformers
from flax import traverse_util

from core import optim, sharding
from core.errors import ConfigError
from core.state import count_params
from data.pipeline_config import PipelineConfig
from models import backbone, trees, xlnet
from models.classifier import ClassifierModel
from models.encoder import EncoderConfig
from models.pretraining import BertPretrainingModel
from models.xlnet_options import XLNetOptions
from pretrain.objectives import MaskedLM, PermutationLM, XLNetMLM, permutation_lm
from pretrain.objectives.permutation import draw_ranks, visibility
from tests import jitted, mesh_training

V, H, LAYERS, HEADS, FF = 96, 32, 2, 4, 64
B, L, P, MEM, REUSE = 4, 10, 3, 8, 6
TOLERANCE = 1e-5


def _config(clamp_len=-1, mem_len=MEM):
    return EncoderConfig(
        vocab_size=V,
        hidden_size=H,
        num_layers=LAYERS,
        num_heads=HEADS,
        intermediate_size=FF,
        hidden_act="gelu_tanh",
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        classifier_head="electra",
        pooler=False,
        type_vocab_size=0,
        xlnet=XLNetOptions(mem_len=mem_len, reuse_len=REUSE, clamp_len=clamp_len),
    )


def _hf_model(bi_data, clamp_len, seed=0):
    config = transformers.XLNetConfig(
        vocab_size=V,
        d_model=H,
        n_layer=LAYERS,
        n_head=HEADS,
        d_inner=FF,
        ff_activation="gelu_new",  # the original's tanh GELU
        untie_r=True,
        attn_type="bi",
        mem_len=MEM,
        reuse_len=REUSE,
        bi_data=bi_data,
        clamp_len=clamp_len,
        dropout=0.0,
    )
    model = transformers.XLNetLMHeadModel(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # every parameter random, LayerNorm scales around 1
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(1.0 + 0.1 * noise if "layer_norm.weight" in name else 0.2 * noise)
    return model.eval()


def _our_params(model):
    """Our parameter tree from transformers' XLNetLMHeadModel."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    encoder = {"word_embeddings": sd["transformer.word_embedding.weight"]}
    for i in range(LAYERS):
        prefix = f"transformer.layer.{i}."
        attention = {
            name: {"kernel": sd[prefix + f"rel_attn.{theirs}"]}
            for name, theirs in (("query", "q"), ("key", "k"), ("value", "v"), ("relative", "r"))
        }
        attention["output"] = {"kernel": sd[prefix + "rel_attn.o"].transpose(1, 2, 0)}
        for ours in ("r_w", "r_r", "r_s"):
            attention[ours] = sd[prefix + f"rel_attn.{ours}_bias"]
        attention["seg_embed"] = sd[prefix + "rel_attn.seg_embed"]
        encoder[f"layer_{i}"] = {
            "attention": attention,
            "attention_layer_norm": {
                "scale": sd[prefix + "rel_attn.layer_norm.weight"],
                "bias": sd[prefix + "rel_attn.layer_norm.bias"],
            },
            "intermediate": {
                "kernel": sd[prefix + "ff.layer_1.weight"].T,
                "bias": sd[prefix + "ff.layer_1.bias"],
            },
            "output": {"kernel": sd[prefix + "ff.layer_2.weight"].T, "bias": sd[prefix + "ff.layer_2.bias"]},
            "output_layer_norm": {
                "scale": sd[prefix + "ff.layer_norm.weight"],
                "bias": sd[prefix + "ff.layer_norm.bias"],
            },
        }
    head = {"mask_emb": sd["transformer.mask_emb"].reshape(H), "output_bias": sd["lm_loss.bias"]}
    return {"params": {"encoder": encoder, "plm_head": head}}


def _inputs(seed=0):
    """Rows of 8 and 10 real tokens with segments 0/1/2, the permutation mask of our own
    factorization orders (pretrain/objectives/permutation.py: a target never sees itself or
    later tokens, the reused part nothing of the rest), 3 target slots of which row 0's last
    is padding, and random memories."""
    rs = np.random.RandomState(seed)
    real = np.array([L, 8, L, 9])
    input_mask = (np.arange(L)[None] < real[:, None]).astype(np.int32)
    input_ids = rs.randint(5, V, (B, L)).astype(np.int32) * input_mask
    segment_ids = np.broadcast_to(np.where(np.arange(L) < 5, 0, 1), (B, L)).astype(np.int32)
    segment_ids[np.arange(B), real - 1] = 2
    segment_ids *= input_mask
    target_positions = np.stack([np.sort(rs.choice(r, P, replace=False)) for r in real]).astype(np.int32)
    target_weights = np.ones((B, P), np.float32)
    target_weights[0, -1] = 0.0
    is_target = np.zeros((B, L), bool)
    for b in range(B):
        is_target[b, target_positions[b][target_weights[b] > 0]] = True
    ranks = draw_ranks(jax.random.key(seed), jnp.arange(B, dtype=jnp.int32), L, REUSE)
    functional = segment_ids == 2  # the <cls> of each row
    visible = np.asarray(
        visibility(ranks, jnp.asarray(is_target & ~functional), jnp.asarray(functional), REUSE)
    )
    memory = rs.randn(B, LAYERS, MEM, H).astype(np.float32)
    labels = np.take_along_axis(input_ids, target_positions, axis=1)
    return dict(
        input_ids=input_ids,
        segment_ids=segment_ids,
        input_mask=input_mask,
        visible=visible,
        target_positions=target_positions,
        target_weights=target_weights,
        memory=memory,
        labels=labels,
    )


def _theirs(model, x, with_memory=True):
    target_mapping = np.zeros((B, P, L), np.float32)
    for b in range(B):
        for m in range(P):
            if x["target_weights"][b, m]:
                target_mapping[b, m, x["target_positions"][b, m]] = 1.0
    labels = np.where(x["target_weights"] > 0, x["labels"], -100)
    mems = (
        [torch.tensor(x["memory"][:, i].transpose(1, 0, 2)) for i in range(LAYERS)] if with_memory else None
    )
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(x["input_ids"], dtype=torch.long),
            token_type_ids=torch.tensor(x["segment_ids"], dtype=torch.long),
            attention_mask=torch.tensor(x["input_mask"], dtype=torch.float32),
            perm_mask=torch.tensor(~x["visible"], dtype=torch.float32),
            target_mapping=torch.tensor(target_mapping),
            mems=mems,
            use_mems=True,
            labels=torch.tensor(labels, dtype=torch.long),
        )
    memory = np.stack([m.numpy().transpose(1, 0, 2) for m in out.mems], axis=1)
    return out.logits.numpy(), float(out.loss), memory


def _ours(config, params, x, direction, with_memory=True):
    visible = x["visible"]
    query_visible = np.take_along_axis(visible, x["target_positions"][:, :, None], axis=1)
    logits, memory = jitted.apply(
        xlnet.PermutationLMModel(config),
        params,
        jnp.asarray(x["input_ids"]),
        jnp.asarray(x["segment_ids"]),
        jnp.asarray(x["input_mask"]),
        jnp.asarray(x["target_positions"]),
        jnp.asarray(visible),
        jnp.asarray(query_visible),
        deterministic=True,
        memory=jnp.asarray(x["memory"]) if with_memory else None,
        direction=jnp.asarray(direction, jnp.int32),
    )
    logits, memory = np.asarray(logits), np.asarray(memory)
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = np.take_along_axis(np.asarray(logp), x["labels"][..., None], axis=-1)[..., 0]
    loss = -(picked * x["target_weights"]).sum() / x["target_weights"].sum()
    return logits, float(loss), memory


@pytest.mark.slow
@pytest.mark.extended(keep=["forward"])
@pytest.mark.parametrize(
    "bi_data, clamp_len, with_memory",
    [(False, -1, True), (True, 5, True), (True, -1, False), (False, -1, "zeros")],
    ids=["forward", "bi_data_clamped", "no_memory", "zero_memory"],
)
def test_matches_transformers(bi_data, clamp_len, with_memory):
    """with_memory: random memories, none (theirs: length 0), or explicit zeros (attended, as
    the original's training starts)."""
    model = _hf_model(bi_data, clamp_len)
    x = _inputs()
    if with_memory == "zeros":
        x["memory"] = np.zeros_like(x["memory"])
    direction = [1, 1, -1, -1] if bi_data else [1] * B
    config = _config(clamp_len)
    logits, loss, memory = _ours(config, _our_params(model), x, direction, with_memory)
    their_logits, their_loss, their_memory = _theirs(model, x, with_memory)
    real = x["target_weights"] > 0  # a padded target slot is all zeros in their target_mapping
    np.testing.assert_allclose(logits[real], their_logits[real], atol=TOLERANCE, rtol=TOLERANCE)
    np.testing.assert_allclose(loss, their_loss, rtol=TOLERANCE)
    if not with_memory:  # theirs caches the first REUSE positions alone, as ours
        their_memory = their_memory[:, :, -min(REUSE, MEM) :]
    np.testing.assert_allclose(memory, their_memory, atol=TOLERANCE, rtol=TOLERANCE)


@pytest.mark.slow
def test_relative_gather_equals_the_shift():
    """For queries at positions 0..L-1, the gather (the query stream's) is the reshape shift
    (the content stream's): entry (i, j) is the score against distance (M + i) - j."""
    scores = jax.random.normal(jax.random.key(0), (2, 3, L, MEM + 2 * L))
    positions = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (2, L))
    shifted = xlnet.relative_shift(scores, MEM + L)
    np.testing.assert_array_equal(xlnet.relative_gather(scores, positions, L, MEM + L), shifted)
    # and by its definition: distances klen .. -L + 1 are columns 0 .. klen + L - 1
    distances = np.asarray(xlnet.relative_distances(L, MEM + L, jnp.ones(1), -1))[0]
    for i, j in ((0, 0), (3, MEM + 3), (L - 1, 2)):
        column = int(np.where(distances == (MEM + i) - j)[0][0])
        assert shifted[1, 2, i, j] == scores[1, 2, i, column]


@pytest.mark.slow
def test_memory_keeps_the_last_mem_len_of_each_layers_input():
    """Layer 0's new memory is [old memory; the embeddings of the first reuse_len tokens]
    cut to the last mem_len positions, without gradient."""
    config = _config()
    x = _inputs(1)
    params = _our_params(_hf_model(False, -1))
    _, _, memory = _ours(config, params, x, [1] * B)
    embeddings = params["params"]["encoder"]["word_embeddings"][x["input_ids"]]
    expected = np.concatenate([x["memory"][:, 0], embeddings[:, :REUSE]], axis=1)[:, -MEM:]
    np.testing.assert_allclose(memory[:, 0], expected, rtol=1e-6)


def test_clamp_len_0_clips_nothing_as_the_original():
    direction = jnp.array([1, -1])
    unclipped = xlnet.relative_distances(L, MEM + L, direction, -1)
    np.testing.assert_array_equal(xlnet.relative_distances(L, MEM + L, direction, 0), unclipped)
    assert float(jnp.abs(xlnet.relative_distances(L, MEM + L, direction, 5)).max()) == 5.0


@pytest.mark.slow
def test_fine_tuning_logits_do_not_depend_on_the_left_padding():
    """The classifier (the summary of the last position) gives the same logits for a row
    padded on the left with 1 or with 40 pads (segment id 4), and for the row alone: the pads
    are hidden keys and the positions relative."""
    config = dataclasses.replace(_config(), classifier_head="xlnet")
    ids = np.array([11, 12, 13, 4, 21, 22, 4, 3], np.int32)  # A <sep> B <sep> <cls>
    segments = np.array([0, 0, 0, 0, 1, 1, 1, 2], np.int32)
    model = ClassifierModel(config, num_outputs=3)

    def batch(pads):
        return {
            "input_ids": jnp.asarray(np.concatenate([np.full(pads, 5), ids])[None], jnp.int32),
            "input_mask": jnp.asarray(np.concatenate([np.zeros(pads), np.ones(len(ids))])[None], jnp.int32),
            "segment_ids": jnp.asarray(np.concatenate([np.full(pads, 4), segments])[None], jnp.int32),
        }

    params = model.init(jax.random.key(0), batch(1), deterministic=True)
    logits = {pads: np.asarray(model.apply(params, batch(pads), deterministic=True)) for pads in (0, 1, 40)}
    assert set(params["params"]) == {"encoder", "classifier_dense", "classifier"}
    np.testing.assert_allclose(logits[1], logits[0], atol=1e-5)
    np.testing.assert_allclose(logits[40], logits[0], atol=1e-5)


def test_packed_rows_are_refused_in_one_line():
    inputs = [jnp.ones((1, 4), jnp.int32)] * 3
    with pytest.raises(ConfigError, match="XLNet's encoder does not take packed rows"):
        backbone.encoder_module(_config()).init(
            jax.random.key(0), *inputs, None, jnp.ones((1, 4), jnp.int32), deterministic=True
        )


def test_options_are_checked():
    with pytest.raises(Exception, match="XLNetOptions needs mem_len >= 0"):
        _config(mem_len=-1)
    with pytest.raises(Exception, match="scan_layers=True is not implemented for XLNet"):
        dataclasses.replace(_config(), scan_layers=True)


def _abstract_params(config):
    """The PermutationLMModel's parameter tree as ShapeDtypeStructs (nothing allocated)."""
    shapes = jax.eval_shape(
        lambda: xlnet.PermutationLMModel(config).init(
            jax.random.key(0),
            *(jnp.zeros((1, 4), jnp.int32),) * 3,
            jnp.zeros((1, 2), jnp.int32),
            jnp.ones((1, 4, 4), bool),
            jnp.ones((1, 2, 4), bool),
            deterministic=True,
        )
    )
    return nn.meta.unbox(shapes["params"])


def test_weight_decay_follows_the_original():
    """The original's AdamWeightDecayOptimizer (model_utils.py) decays everything but names
    matching LayerNorm, layer_norm or bias, except r_w_bias, r_r_bias and r_s_bias, which it
    decays: ours decays r_w, r_r, r_s, seg_embed, mask_emb, the kernels and the word table,
    and leaves out the layer norms, the FFN biases and the LM output bias."""
    mask = traverse_util.flatten_dict(optim.decay_mask(_abstract_params(_config())), sep="/")
    decayed = {path for path, on in mask.items() if on}
    layer = "encoder/layer_0/"
    for name in ("r_w", "r_r", "r_s", "seg_embed", "query/kernel", "relative/kernel", "output/kernel"):
        assert layer + "attention/" + name in decayed, name
    assert {"encoder/word_embeddings", "plm_head/mask_emb", layer + "intermediate/kernel"} <= decayed
    for name in ("attention_layer_norm/scale", "output_layer_norm/bias", "intermediate/bias"):
        assert layer + name not in decayed, name
    assert "plm_head/output_bias" not in decayed


# --- the objective ----------------------------------------------------------------------------

PLM_REUSE = 8


def _plm_objective():
    config = dataclasses.replace(
        mesh_training.SHARDABLE,
        hidden_act="gelu_tanh",
        pooler=False,
        xlnet=XLNetOptions(mem_len=6, reuse_len=PLM_REUSE),
    )
    return PermutationLM(config, _plm_pipeline())


def _plm_pipeline(**changes):
    return PipelineConfig(
        **{
            "format": "xlnet_stream",
            "sentence_objective": "none",
            "max_seq_length": mesh_training.L,
            "reuse_len": PLM_REUSE,
            "max_predictions_per_seq": mesh_training.P,
            **changes,
        }
    )


def _plm_batches(n, seed=0):
    """Rows [reused 8 | A <sep> B <sep> <cls>] of random ids, 4 target slots off the
    functional tokens (some padding), alternating directions."""
    rs = np.random.RandomState(seed)
    rows, length, slots = mesh_training.B, mesh_training.L, mesh_training.P
    functional = np.zeros((rows, length), np.int32)
    functional[:, [15, length - 2, length - 1]] = 1
    segment_ids = np.where(np.arange(length) <= 15, 0, 1).astype(np.int32)[None].repeat(rows, 0)
    segment_ids[:, -1] = 2
    batches = []
    for _ in range(n):
        candidates = np.flatnonzero(functional[0] == 0)
        positions = np.sort(np.stack([rs.choice(candidates, slots, replace=False) for _ in range(rows)]), 1)
        batches.append(
            {
                "input_ids": rs.randint(5, mesh_training.SHARDABLE.vocab_size, (rows, length)).astype(
                    np.int32
                ),
                "segment_ids": segment_ids,
                "input_mask": np.ones((rows, length), np.int32),
                "functional": functional,
                "target_positions": positions.astype(np.int32),
                "target_weights": (rs.rand(rows, slots) < 0.9).astype(np.float32),
                "direction": np.where(np.arange(rows) % 2 == 0, 1, -1).astype(np.int32),
            }
        )
    return batches


@pytest.mark.slow(30)
@pytest.mark.extended
def test_permutation_lm_on_a_mesh_with_microbatches_equals_one_device():
    """Three steps, each reading the memory the one before left: 2 microbatches on a data x
    fsdp x tensor mesh give one device's losses and parameters (orders drawn per row of the
    global batch, memories split and rejoined by rows)."""
    batches = _plm_batches(3)
    mesh_training.assert_layouts_equal_one_device(_plm_objective, batches)
    state, losses = mesh_training.train(
        sharding.make_mesh(None, jax.devices()[:1]), batches, _plm_objective()
    )
    assert np.isfinite(losses).all() and np.abs(np.asarray(state.carry["memory"])).max() > 0


def test_a_target_slot_on_sep_or_cls_has_no_weight():
    """<sep> and <cls> are never targets (the original's _local_perm drops them); a slot there
    would see its own token."""
    batch = _plm_batches(1)[0]
    batch["target_positions"][0, 0] = 15  # a <sep>
    weights = np.asarray(permutation_lm.target_weights(batch))
    assert weights[0, 0] == 0 and (weights[1:] == batch["target_weights"][1:]).all()


def test_permutation_lm_needs_xlnets_encoder_and_rows():
    with pytest.raises(ConfigError, match="PermutationLM needs XLNet's encoder"):
        PermutationLM(mesh_training.SHARDABLE, PipelineConfig())
    config = _plm_objective().model_config
    with pytest.raises(ConfigError, match="set PipelineConfig.format = 'xlnet_stream'"):
        PermutationLM(config, PipelineConfig())
    with pytest.raises(ConfigError, match="XLNetOptions.reuse_len = 8 but PipelineConfig.reuse_len = 6"):
        PermutationLM(config, _plm_pipeline(reuse_len=6))


@pytest.mark.slow
@pytest.mark.extended(keep=["base"])
@pytest.mark.parametrize(
    "layers, hidden, heads, published",
    [(12, 768, 12, 116_750_336), (24, 1024, 16, 360_300_800)],
    ids=["base", "large"],
)
def test_parameter_counts_are_transformers(layers, hidden, heads, published):
    """xlnet-base-cased and xlnet-large-cased (vocabulary 32000): transformers'
    `XLNetLMHeadModel.num_parameters()` of their configs (the tied LM weights once)."""
    config = dataclasses.replace(
        _config(),
        vocab_size=32000,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        intermediate_size=4 * hidden,
    )
    assert count_params(_abstract_params(config)) == published


@pytest.mark.slow
def test_the_dropout_after_the_ffn_activation_has_its_own_rate():
    """XLNetOptions.activation_dropout: None takes the hidden rate (the original code, and
    transformers); the paper's table sets it apart (0 in its pretraining), and fine-tuning's
    one rate (`with_dropout`) makes it follow the hidden rate again."""
    tuned = dataclasses.replace(_config(), xlnet=XLNetOptions(activation_dropout=0.0)).with_dropout(0.1)
    assert (tuned.dropout_rate, tuned.attention_dropout_rate, tuned.xlnet.activation_dropout) == (
        0.1,
        0.1,
        None,
    )
    x = jax.random.normal(jax.random.key(0), (2, 4, H))

    def ffn(activation_dropout):
        options = dataclasses.replace(_config().xlnet, activation_dropout=activation_dropout)
        layer = xlnet.XLNetLayer(dataclasses.replace(_config(), dropout_rate=0.5, xlnet=options))
        params = layer.init(jax.random.key(1), x, True, method=layer.feed_forward)
        out = layer.apply(params, x, False, method=layer.feed_forward, rngs={"dropout": jax.random.key(2)})
        return np.asarray(out)

    np.testing.assert_array_equal(ffn(None), ffn(0.5))
    assert not np.allclose(ffn(0.0), ffn(0.5))


@pytest.mark.slow
def test_mlm_on_xlnets_encoder_counts_its_relative_terms():
    """XLNetMLM (the paper's "DAE + Transformer-XL"): BERT's MLM head on XLNet's content
    stream; its FLOPs are BERT's MLM count plus the relative projection and scores, and a
    BERT config is refused in one line."""
    config = dataclasses.replace(_config(), classifier_head="xlnet")
    pipeline = PipelineConfig(max_seq_length=L, max_predictions_per_seq=P, sentence_objective="none")
    objective = XLNetMLM(config, pipeline)
    batch = objective.example_batch(B, L, P)
    params = objective.init(jax.random.key(0))
    assert set(params) == {"encoder", "mlm_head"} and "word_embeddings" in params["encoder"]
    loss, _ = objective.loss(params, batch, {}, objective.normalizers(batch), train=False)
    assert np.isfinite(float(loss))
    bert = MaskedLM(config, pipeline).flops_per_row(128, 20)
    assert objective.flops_per_row(128, 20) > bert
    # Fill-mask reads its MLM head (BERT's masked LM), fine-tuning's layer-wise decay its table.
    assert isinstance(trees.masked_lm(config, params)[0], BertPretrainingModel)
    assert optim.layer_depth(("encoder", "word_embeddings"), LAYERS) == 0
    with pytest.raises(ConfigError, match="XLNetMLM trains XLNet's encoder"):
        XLNetMLM(mesh_training.SHARDABLE, pipeline)
