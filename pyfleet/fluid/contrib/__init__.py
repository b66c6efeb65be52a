"""``fluid.contrib`` (Fluid 1.5-1.7): the names CTR scripts of the era import.

Provided: :mod:`~pyfleet.fluid.contrib.layers` (``fused_embedding_seq_pool``),
:mod:`~pyfleet.fluid.contrib.utils` (``lookup_table_utils``: the infer
scripts' ``load_persistables_for_inference`` / ``..._for_increment`` and
``convert_dist_to_sparse_program``; ``hdfs_utils``, whose HDFS client is
refused when used), and :mod:`~pyfleet.fluid.contrib.mixed_precision` (its
``decorate`` refused: it is a GPU feature). As Fluid's ``contrib/__init__``
re-exports its submodules' names, so does this package.

Every other name Fluid's contrib had (the RNN decoders and units,
quantization and slim, ``memory_usage``, ``extend_with_decoupled_weight_decay``,
the ctr_reader, ...) is refused by name when a script reaches for it, with
the reason; an unknown name is an AttributeError.
"""

from pyfleet.errors import ConfigError
from pyfleet.fluid.contrib import layers, mixed_precision, utils
from pyfleet.fluid.contrib.layers import fused_embedding_seq_pool
from pyfleet.fluid.contrib.utils import (
    HDFSClient,
    convert_dist_to_sparse_program,
    load_persistables_for_increment,
    load_persistables_for_inference,
    multi_download,
    multi_upload,
)

__all__ = [
    "HDFSClient",
    "convert_dist_to_sparse_program",
    "fused_embedding_seq_pool",
    "layers",
    "load_persistables_for_increment",
    "load_persistables_for_inference",
    "mixed_precision",
    "multi_download",
    "multi_upload",
    "utils",
]

_RNN = "RNN decoders and units are not part of pyfleet's CTR layer set (no recurrent layers)"
_QUANT = "quantization and model compression (slim) target GPU and mobile inference"
REFUSED = {
    "BasicLSTMUnit": _RNN, "basic_lstm": _RNN, "BasicGRUUnit": _RNN, "basic_gru": _RNN,
    "InitState": _RNN, "StateCell": _RNN, "TrainingDecoder": _RNN, "BeamSearchDecoder": _RNN,
    "decoder": _RNN,
    "QuantizeTranspiler": _QUANT, "quantize": _QUANT, "slim": _QUANT, "Compressor": _QUANT,
    "Calibrator": _QUANT, "int8_inference": _QUANT,
    "memory_usage": "pyfleet does not estimate a program's device memory",
    "memory_usage_calc": "pyfleet does not estimate a program's device memory",
    "op_freq_statistic": "pyfleet's programs have no Fluid op statistics to count",
    "op_frequence": "pyfleet's programs have no Fluid op statistics to count",
    "summary": "pyfleet's programs have no Fluid op statistics to count",
    "model_stat": "pyfleet's programs have no Fluid op statistics to count",
    "extend_with_decoupled_weight_decay": "decoupled weight decay (AdamW) is not an optimizer "
                                          "rule of pyfleet's tables; use regularization=L2Decay",
    "extend_optimizer": "decoupled weight decay (AdamW) is not an optimizer rule of "
                        "pyfleet's tables; use regularization=L2Decay",
    "reader": "fluid.contrib.reader's ctr_reader and distributed_batch_reader are C++ "
              "readers; use fluid.DatasetFactory or pyfleet.data",
    "ctr_reader": "fluid.contrib.reader's ctr_reader is a C++ reader; use "
                  "fluid.DatasetFactory or pyfleet.data",
    "distributed_batch_reader": "use fleet.split_files to give each worker its files",
    "trainer": "fluid.contrib.trainer (the high-level Trainer API) was removed in Fluid 1.6; "
               "use Executor.run",
    "inferencer": "fluid.contrib.inferencer was removed in Fluid 1.6; use "
                  "fluid.io.load_inference_model",
}


def refusal(module, name, reason):
    """The error for a Fluid contrib name pyfleet does not provide."""
    return ConfigError(f"fluid.{module}.{name} is not supported by pyfleet: {reason}")


def __getattr__(name):
    if name in REFUSED:
        raise refusal("contrib", name, REFUSED[name])
    raise AttributeError(f"module 'pyfleet.fluid.contrib' has no attribute {name!r} "
                         f"(provided: {', '.join(__all__)})")
