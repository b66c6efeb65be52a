"""CTR training data: readers, the feature hash and a synthetic data generator.

``Dataset`` reads raw Criteo TSV, CSV with a header, or PaddleRec's slot format
(plain or gzip; a file, a list, or a directory of shards) into ``Batch`` objects
of numpy arrays; ``feature_hash`` is the stable 64-bit id of a (slot, value)
pair. The formats and the hash are specified in ``docs/formats.md``; the
synthetic generator is :mod:`pyfleet.data.synthetic`.
"""

from pyfleet.data.readers import (
    Batch,
    DataError,
    Dataset,
    Schema,
    criteo_schema,
    feature_hash,
    list_files,
    parse_criteo_bytes,
    shard_files,
)

__all__ = [
    "Batch",
    "DataError",
    "Dataset",
    "Schema",
    "criteo_schema",
    "feature_hash",
    "list_files",
    "parse_criteo_bytes",
    "shard_files",
]
