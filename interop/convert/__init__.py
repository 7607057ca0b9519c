"""Checkpoint conversion: Hugging Face folders and original TF1 checkpoints <-> our workdirs
(`python -m interop.convert`, cli.py).

One module per published family owns its name table, its config translation, its tokenizer
files and its export checks: bert.py (also SpanBERT's releases), roberta.py, albert.py,
electra.py (discriminator and generator), deberta.py (v1, v2/v3); formats.py lists them.
What every family shares: layout.py (a name table's rows and how an array is laid out in
another framework), format.py (`ModelFormat`: config.json <-> EncoderConfig, tensors <->
our tree, the hooks), hf_files.py / hf.py (HF folders), tf1.py (TF1 checkpoints),
tokenizer_files.py and workdir.py (the imported workdir and converted_from.json).

Parameter names map one-to-one by the tables; the MLM decoder is tied to the word
embeddings everywhere, so it has no row: an HF file that stores it must hold a copy of the
embeddings (an untied decoder is refused). A converted workdir records in
`converted_from.json` the source and which optional parts it had; parts it lacked are left
out of the parameters rather than filled with random values.
"""

# `python -m interop.convert` imports this package before its __main__: TensorFlow's
# environment first, or its C++ start-up lines come before the tool's own output.
import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from interop.convert.format import OPTIONAL_GROUPS, ModelFormat, present_groups
from interop.convert.formats import FORMATS, format_of
from interop.convert.hf import (
    export_hf,
    hf_config_to_ours,
    hf_model_files,
    import_hf,
    read_hf_model,
    write_hf_model,
)
from interop.convert.hf_files import read_hf_weights
from interop.convert.layout import ConversionError
from interop.convert.tf1 import import_tf, read_tf_model
from interop.convert.tokenizer_files import read_tokenizer, write_hf_tokenizer
from interop.convert.workdir import CONVERTED_FROM, Imported, write_workdir

__all__ = [
    "CONVERTED_FROM",
    "FORMATS",
    "OPTIONAL_GROUPS",
    "ConversionError",
    "Imported",
    "ModelFormat",
    "export_hf",
    "format_of",
    "hf_config_to_ours",
    "hf_model_files",
    "import_hf",
    "import_tf",
    "present_groups",
    "read_hf_model",
    "read_hf_weights",
    "read_tf_model",
    "read_tokenizer",
    "write_hf_model",
    "write_hf_tokenizer",
    "write_workdir",
]
