"""Interop: a pretrained model as the rest of the codebase and the outside world see it.

The floor between the model and data floors and the stages that train (pretrain/,
finetune/): the workdir bundle (config, parameters, tokenizer) and continued pretraining's
warm start, feature extraction (`python -m interop.encode`), fill-mask
(`python -m interop.predict`) and checkpoint conversion to and from transformers and the
original TF1 releases (`python -m interop.convert`). Here models meet tokenizers; below,
models/ takes arrays and data/ makes them, and neither imports the other.
"""
