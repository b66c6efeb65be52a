"""``fluid.contrib`` (Fluid 1.5-1.7): the names CTR scripts of the era import.

Provided: :mod:`~pyfleet.fluid.contrib.layers` (``fused_embedding_seq_pool``,
``shuffle_batch``, ``sparse_embedding``, ``ctr_metric_bundle``),
:mod:`~pyfleet.fluid.contrib.utils` (``lookup_table_utils``: the infer
scripts' ``load_persistables_for_inference`` / ``..._for_increment`` and
``convert_dist_to_sparse_program``; ``hdfs_utils``, whose HDFS client is
refused when used), and :mod:`~pyfleet.fluid.contrib.mixed_precision` (its
``decorate`` refused: it is a GPU feature). As Fluid's ``contrib/__init__``
re-exports its submodules' names, so does this package.

Every other name Fluid's contrib had (the RNN decoders and units,
quantization and slim, ``memory_usage``, ``extend_with_decoupled_weight_decay``,
the ctr_reader, ...) resolves to a placeholder that raises
:class:`~pyfleet.errors.UnsupportedError` with the reason when used; an
unknown name is an AttributeError.
"""

from pyfleet.fluid import refusals as _refusals
from pyfleet.fluid.contrib import layers, mixed_precision, utils
from pyfleet.fluid.contrib.layers import (
    ctr_metric_bundle,
    fused_embedding_seq_pool,
    shuffle_batch,
    sparse_embedding,
)
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
    "ctr_metric_bundle",
    "fused_embedding_seq_pool",
    "layers",
    "load_persistables_for_increment",
    "load_persistables_for_inference",
    "mixed_precision",
    "multi_download",
    "multi_upload",
    "shuffle_batch",
    "sparse_embedding",
    "utils",
]

# The RNN units, quantization, memory estimates, ... : refused by name when used
# (one table, pyfleet.fluid.refusals).
_refusals.install(globals(), "paddle.fluid.contrib")
