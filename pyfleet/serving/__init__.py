"""``pyfleet serve``: inference models behind HTTP (docs/serving.md).

- :mod:`~pyfleet.serving.model`: one served version (the inference model's
  loader, sparse rows in C++ tables with their storage type and disk tier);
- :mod:`~pyfleet.serving.rows`: request bodies into batches, with the
  readers' parsers;
- :mod:`~pyfleet.serving.versions`: finding and following committed versions;
- :mod:`~pyfleet.serving.app`: the server, its routes and its micro-batcher,
  and :mod:`~pyfleet.serving.http`: HTTP/1.1 on httptools' parser in an asyncio
  Protocol (both need the ``serve`` extra);
- :mod:`~pyfleet.serving.metrics`: the Prometheus text of ``/metrics``;
- :mod:`~pyfleet.serving.blas`: one BLAS thread for the model steps.

Importing this package loads neither httptools nor Fluid.
"""

__all__ = ["app", "blas", "http", "metrics", "model", "rows", "versions"]
