"""``pyfleet serve``: inference models behind HTTP (docs/serving.md).

- :mod:`~pyfleet.serving.model`: one served version (the inference model's
  loader, sparse rows in C++ tables with their storage type and disk tier);
- :mod:`~pyfleet.serving.rows`: request bodies into batches, with the
  readers' parsers;
- :mod:`~pyfleet.serving.versions`: finding and following committed versions;
- :mod:`~pyfleet.serving.app`: the aiohttp server and its micro-batcher
  (needs the ``serve`` extra);
- :mod:`~pyfleet.serving.metrics`: the Prometheus text of ``/metrics``;
- :mod:`~pyfleet.serving.blas`: one BLAS thread for the model steps.

Importing this package loads neither aiohttp nor Fluid.
"""

__all__ = ["app", "blas", "metrics", "model", "rows", "versions"]
