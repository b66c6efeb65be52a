"""Admission policies ("entry", as Paddle's ``CountFilterEntry``/``ProbabilityEntry``).

Exact semantics, shared by the in-process table and the servers:

- A key that has no row is a *candidate*. ``pull`` of a candidate returns its
  initial value (the same one it will start from once admitted) and stores no
  row; ``push`` to a candidate is dropped (counted as ``dropped_push_keys`` in
  ``stats()``).
- ``CountFilterEntry(n)``: each ``pull`` call in which a candidate appears
  counts once (duplicates inside one call count once; the worker's client
  deduplicates anyway). The call that brings the count to ``n`` admits the key:
  it becomes a trainable row, and that very pull returns (and stores) its
  initial value. ``n = 1`` admits on first sight. Candidate counts are kept in
  a small per-shard map (16 bytes a key) and cleared by ``shrink()``, so a key
  must reach ``n`` within one pass; that is what keeps one-off ids from costing
  memory across passes. A job that never calls ``shrink()`` never forgets them,
  and every id seen once per pass is admitted in the next: ``pyfleet train
  --admission-count`` therefore ends every pass with a ``shrink()`` even without
  a shrink option (which then drops no row); a Fleet script should call
  ``fleet.shrink()`` at its pass ends.
- ``ProbabilityEntry(p)``: each ``pull`` call in which a candidate appears
  admits it with probability ``p`` (independent draws from a counter-based
  generator seeded by the table's seed).
"""

from pyfleet import _core
from pyfleet._record import ConfigRecord
from pyfleet._record import from_config as _from_config

__all__ = ["CountFilterEntry", "Entry", "ProbabilityEntry"]


class Entry(ConfigRecord):
    kind = None

    def _core_config(self):
        c = _core.EntryConfig()
        c.kind = getattr(_core.EntryKind, self.kind)
        c.count = int(getattr(self, "count_filter", 0))
        c.probability = float(getattr(self, "probability", 1.0))
        return c


class CountFilterEntry(Entry):
    kind = "CountFilter"

    def __init__(self, count_filter):
        if isinstance(count_filter, bool) or not isinstance(count_filter, int) or count_filter < 1:
            raise ValueError(f"count_filter must be an integer >= 1, got {count_filter!r}")
        self.count_filter = count_filter


class ProbabilityEntry(Entry):
    kind = "Probability"

    def __init__(self, probability):
        probability = float(probability)
        if not (0.0 < probability <= 1.0):
            raise ValueError(f"probability must be in (0, 1], got {probability!r}")
        self.probability = probability



def from_config(config):
    """Rebuild a policy from :meth:`Entry.to_config` output (None stays None)."""
    if config is None:
        return None
    return _from_config(config, (CountFilterEntry, ProbabilityEntry), "entry")
