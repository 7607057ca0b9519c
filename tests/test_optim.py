"""BERT's optimizer: which parameters get weight decay, and the warmup/linear-decay schedule."""

import flax.linen as nn
import numpy as np
from flax import traverse_util

from models.encoder import EncoderConfig
from models.pretraining import abstract_params
from pretrain import optim

TINY = EncoderConfig(
    vocab_size=100,
    hidden_size=16,
    num_layers=2,
    num_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
)


def test_decay_mask_excludes_every_bias_and_layernorm():
    params = nn.meta.unbox(abstract_params(TINY))
    flat = traverse_util.flatten_dict(optim.decay_mask(params), sep="/")
    no_decay = sorted(path for path, decays in flat.items() if not decays)
    decayed = sorted(path for path, decays in flat.items() if decays)
    # The original excludes any variable whose name contains LayerNorm or bias.
    assert "mlm_head/output_bias" in no_decay
    assert all(p.endswith(("bias", "scale")) for p in no_decay)
    assert all(p.endswith(("kernel", "embedding")) for p in decayed), decayed
    assert "encoder/embeddings/layer_norm/scale" in no_decay
    assert "mlm_head/transform_layer_norm/scale" in no_decay
    assert "encoder/embeddings/word_embeddings/embedding" in decayed
    assert "mlm_head/transform/kernel" in decayed


def test_warmup_then_linear_decay_over_the_whole_run():
    schedule = optim.warmup_linear_decay(1e-4, warmup_steps=10, total_steps=100)
    values = np.array([float(schedule(s)) for s in (0, 5, 10, 55, 100, 120)])
    # Warmup is linear to the peak; after it lr = peak * (1 - step / total), as in BERT.
    np.testing.assert_allclose(values, [0.0, 5e-5, 9e-5, 4.5e-5, 0.0, 0.0], rtol=1e-6, atol=1e-12)
