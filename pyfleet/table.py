"""The in-process tables: :class:`SparseTable`, :class:`DenseTable` and :func:`route`.

These are thin, validating wrappers over the C++ core (``pyfleet._core``).
Every call takes numpy buffers without copying, releases the GIL, and makes
one core call, so many threads may pull and push one table at once.
"""

import os

import numpy as np

from pyfleet import _core
from pyfleet import entry as _entry
from pyfleet import initializer as _init
from pyfleet import optimizer as _opt

__all__ = [
    "DEFAULT_INITIALIZER",
    "FORMAT_VERSION",
    "STORAGE_TYPES",
    "DenseTable",
    "SparseTable",
    "check_spill_options",
    "route",
]

FORMAT_VERSION = _core.FORMAT_VERSION
# How a sparse table stores weights and optimizer state (docs/storage.md).
STORAGE_TYPES = ("fp32", "fp16", "bf16", "fp16_q8", "bf16_q8")
# A sparse table config's optional keys and what their absence means.
SPARSE_CONFIG_DEFAULTS = {"seed": 0, "entry": None, "storage": "fp32",
                          "memory_budget": None, "spill_dir": None, "regularizer": None}
# Small symmetric noise: embeddings start near zero, distinct per key.
DEFAULT_INITIALIZER = _init.Uniform(-0.01, 0.01)


def _keys(keys, what="keys"):
    if not isinstance(keys, np.ndarray):
        raise ValueError(f"{what} must be a 1-D numpy array of dtype uint64, "
                         f"got {type(keys).__name__}")
    if keys.dtype != np.uint64 or keys.ndim != 1:
        raise ValueError(f"{what} must be a 1-D numpy array of dtype uint64, "
                         f"got dtype {keys.dtype} with shape {keys.shape}")
    return np.ascontiguousarray(keys)


def _values(values, shape, what):
    if not isinstance(values, np.ndarray):
        raise ValueError(f"{what} must be a numpy float32 array of shape {shape}, "
                         f"got {type(values).__name__}")
    if values.dtype != np.float32:
        raise ValueError(f"{what} must have dtype float32, got {values.dtype}")
    if values.shape != shape:
        raise ValueError(f"{what} must have shape {shape}, got {values.shape}")
    return np.ascontiguousarray(values)


def route(keys, num_servers):
    """The server index (int32 array) that owns each key among ``num_servers``.

    A well-mixed 64-bit hash of the key, mapped onto ``[0, num_servers)`` by a
    multiply-shift: never ``key % n`` of the raw id, so ids that share low bits
    still spread evenly. The one routing function: clients, servers and
    checkpoint filters all call it.
    """
    keys = _keys(keys)
    num_servers = int(num_servers)
    if num_servers < 1:
        raise ValueError(f"num_servers must be >= 1, got {num_servers}")
    out = np.empty(keys.shape[0], dtype=np.int32)
    _core.route(keys, num_servers, out)
    return out


def check_spill_options(memory_budget, spill_dir, what=""):
    """Both or neither, a positive int of bytes and a path (``what`` prefixes
    the option names in messages, e.g. "sparse_"). Touches no file."""
    if memory_budget is None and spill_dir is None:
        return
    if memory_budget is None:
        raise ValueError(f"{what}spill_dir is given without {what}memory_budget: "
                         f"the disk tier needs both")
    if spill_dir is None:
        raise ValueError(f"{what}memory_budget needs {what}spill_dir, "
                         f"the directory its rows spill to")
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, (int, np.integer)):
        raise ValueError(f"{what}memory_budget must be an int of bytes, got {memory_budget!r}")
    if memory_budget <= 0:
        raise ValueError(f"{what}memory_budget must be > 0 bytes, got {memory_budget}")
    if not isinstance(spill_dir, (str, os.PathLike)):
        raise ValueError(f"{what}spill_dir must be a path, got {spill_dir!r}")


def _spill_options(memory_budget, spill_dir):
    """(memory_budget, spill_dir) checked: both or neither, a positive int of
    bytes and a directory this process can write (made if missing)."""
    check_spill_options(memory_budget, spill_dir)
    if memory_budget is None:
        return None, None
    spill_dir = os.fspath(spill_dir)
    try:
        os.makedirs(spill_dir, exist_ok=True)
    except OSError as e:
        raise ValueError(f"spill_dir {spill_dir!r} is not a usable directory: {e}") from None
    if not os.path.isdir(spill_dir) or not os.access(spill_dir, os.W_OK | os.X_OK):
        raise ValueError(f"spill_dir {spill_dir!r} is not a writable directory")
    return int(memory_budget), os.path.abspath(spill_dir)


class SparseTable:
    """uint64 feature id -> embedding row of ``dim`` float32, optimizer applied on push.

    Args:
        dim: floats per row.
        optimizer: a :mod:`pyfleet.optimizer` rule (SGD, Adagrad, Adam, FTRL,
            Momentum, RMSProp).
        initializer: a :mod:`pyfleet.initializer`; default ``Uniform(-0.01, 0.01)``.
        seed: with ``initializer``, decides every key's initial row.
        entry: an admission policy from :mod:`pyfleet.entry`, or None to admit all.
        name: a label for stats, manifests and error messages.
        storage: ``"fp32"`` (default), ``"fp16"`` or ``"bf16"``: how rows hold
            weights and optimizer state. Updates are computed in fp32 and
            rounded back stochastically (seeded by ``seed``, the key and the
            row's update count); ``pull`` and ``export`` return fp32.
            ``"fp16_q8"``/``"bf16_q8"``: 16-bit weights and Adam's or
            Adagrad's state in 8-bit blocks (other rules: ``ValueError``).
        memory_budget, spill_dir: a disk tier (both or neither). Rows beyond
            ``memory_budget`` bytes (rows and index) leave RAM for an unnamed
            file in the directory ``spill_dir``; a pull or push brings them
            back, rows in use stay (docs/disk_tier.md). Keys
            stay in RAM: the index costs about 19 bytes a key of the budget,
            and a budget below that is exceeded by the index.
        regularizer: None, or a weight decay the table adds to every pushed row's
            gradient before the rule (``{"type": "L1Decay" | "L2Decay",
            "regularization_coeff": c}``: Fluid's regularizers, applied where
            the row lives; see :func:`pyfleet.optimizer.check_regularizer`).

    Thread safety: every method may be called from many threads at once.
    Concurrent pushes to one row are Hogwild: an update may be lost, a row is
    never torn to garbage, a key is never lost or duplicated.
    """

    def __init__(self, dim, optimizer, initializer=None, seed=0, entry=None, name=None,
                 storage="fp32", memory_budget=None, spill_dir=None, regularizer=None):
        dim = int(dim)
        memory_budget, spill_dir = _spill_options(memory_budget, spill_dir)
        if storage not in STORAGE_TYPES:
            raise ValueError(f"storage must be one of {', '.join(STORAGE_TYPES)}, "
                             f"got {storage!r}")
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        if not isinstance(optimizer, _opt.Optimizer):
            raise ValueError(f"optimizer must be a pyfleet.optimizer rule, got {optimizer!r}")
        initializer = DEFAULT_INITIALIZER if initializer is None else initializer
        if not isinstance(initializer, _init.Initializer):
            raise ValueError(f"initializer must be a pyfleet.initializer, got {initializer!r}")
        if entry is not None and not isinstance(entry, _entry.Entry):
            raise ValueError(f"entry must be a pyfleet.entry policy or None, got {entry!r}")
        self.dim = dim
        self.optimizer = optimizer
        self.initializer = initializer
        self.seed = int(seed)
        self.entry = entry
        self.name = name or "sparse"
        self.storage = storage
        self.regularizer = _opt.check_regularizer(regularizer)
        entry_cfg = entry._core_config() if entry is not None else _core.EntryConfig()
        self._t = _core.SparseTable(dim, optimizer._core_config(self.regularizer),
                                    initializer._core_config(fan_in=1, fan_out=dim),
                                    self.seed & 0xFFFFFFFFFFFFFFFF, entry_cfg,
                                    getattr(_core.StorageKind, storage))
        self.memory_budget = memory_budget
        self.spill_dir = spill_dir
        if memory_budget is not None:
            self._t.enable_spill(memory_budget, spill_dir)

    def config(self):
        """Everything needed to build an equal, empty table (JSON-friendly)."""
        return {"dim": self.dim, "optimizer": self.optimizer.to_config(),
                "initializer": self.initializer.to_config(), "seed": self.seed,
                "entry": None if self.entry is None else self.entry.to_config(),
                "name": self.name, "storage": self.storage,
                "memory_budget": self.memory_budget, "spill_dir": self.spill_dir,
                "regularizer": self.regularizer}

    @staticmethod
    def full_config(config):
        """``config`` with every optional key present (``seed`` 0, ``entry``
        None, ``storage`` "fp32", ``regularizer`` None): two configs that build equal tables are
        equal after this, e.g. one without ``storage`` and one with "fp32"."""
        return {**SPARSE_CONFIG_DEFAULTS, **config}

    @classmethod
    def from_config(cls, config):
        config = cls.full_config(config)
        return cls(config["dim"], _opt.from_config(config["optimizer"]),
                   _init.from_config(config["initializer"]), config["seed"],
                   _entry.from_config(config["entry"]), config.get("name"),
                   config["storage"], config["memory_budget"], config["spill_dir"],
                   config["regularizer"])

    def pull(self, keys, out=None, create=True):
        """Rows of ``keys`` as float32 ``[n, dim]``; a missing key is created
        with its initial value (or, under an admission policy, counted and
        answered with its initial value). ``create=False``: a missing key is
        answered with its initial value and the table is not changed (for
        evaluation and serving). Duplicates and empty arrays are fine."""
        keys = _keys(keys)
        if out is None:
            out = np.empty((keys.shape[0], self.dim), dtype=np.float32)
        else:
            out = _values(out, (keys.shape[0], self.dim), "out")
        self._t.pull(keys, out, bool(create))
        return out

    def prefetch(self, keys):
        """Bring the rows of ``keys`` that are on disk back into RAM, as
        :meth:`pull` would, without pulling them: no output, no row created
        (keys without a row are ignored), no value, count or admission
        counter changed. A no-op on a table without a disk tier. Meant for
        another thread, on the next batch's keys while this batch is pulled
        and pushed: that pull then finds its rows in RAM (docs/disk_tier.md). Same ``keys`` checks as :meth:`pull`; a disk error raises
        as a pull's would (rows already read back stay in RAM, exact)."""
        self._t.prefetch(_keys(keys))

    def push(self, keys, grads):
        """Apply the optimizer to each key's row with its gradient.

        ``grads`` is float32 ``[n, dim]``. Gradients of equal keys inside one
        push are summed and applied once. A gradient with NaN or Inf rejects the
        whole push (``ValueError``, nothing applied)."""
        keys = _keys(keys)
        grads = _values(grads, (keys.shape[0], self.dim), "grads")
        self._t.push(keys, grads)

    def add(self, keys, deltas):
        """``w += delta`` for each key's row, bypassing the optimizer (geo
        mode's deltas); a key without a row gets one at its initial value
        first. Equal keys are summed; NaN/Inf rejects the call."""
        keys = _keys(keys)
        deltas = _values(deltas, (keys.shape[0], self.dim), "deltas")
        self._t.push(keys, deltas, True)

    def add_show_click(self, keys, shows, clicks):
        """Add to each key's show and click counters (float32 ``[n]`` each; Paddle's
        CTR accessor): ``shrink(min_score=..., decay=...)`` decays them every pass
        and drops rows whose score ``0.1 * (show - click) + click`` is below
        ``min_score``. Keys without a row are ignored; negative or non-finite
        counts raise ValueError and change nothing."""
        keys = _keys(keys)
        n = keys.shape[0]
        self._t.add_show_click(keys, _values(shows, (n,), "shows"),
                               _values(clicks, (n,), "clicks"))

    def initial_values(self, keys):
        """The rows ``keys`` start from, without touching the table."""
        keys = _keys(keys)
        out = np.empty((keys.shape[0], self.dim), dtype=np.float32)
        self._t.initial_values(keys, out)
        return out

    def __len__(self):
        return self._t.size()

    def memory_bytes(self):
        """Bytes held by rows, index and admission counters."""
        return self._t.memory_bytes()

    def keys(self):
        """A uint64 array of every key with a row (a snapshot, shard by shard)."""
        return self._t.keys()

    def export(self, keys=None, with_state=False):
        """``{"keys", "weights"[, "state"], "update_count", "unseen_passes", "show",
        "click"}`` for ``keys`` (default: every row); keys without a row are left out."""
        k = self.keys() if keys is None else _keys(keys)
        return self._t.export(k, bool(with_state))

    def stats(self):
        """Counters: rows, pulls, pushes, inserts, admissions, rejections, shrinks, memory;
        with a disk tier also ``memory_budget``, ``spilled_rows``,
        ``spill_file_bytes``, ``spill_reads`` and ``spill_writes`` (rows),
        ``spill_clean_reads`` and ``spill_clean_moves`` (the cleaner's part:
        slots it read, whole extents, and live records it moved),
        ``spill_slot_bytes`` (a row on disk), ``spill_extent_bytes``,
        ``relocated_rows`` (rows moved to lower row ids as the budget's share
        for rows shrank, so that the memory above goes back), and
        ``prefetch_calls`` and ``prefetched_rows`` (:meth:`prefetch`'s calls
        and the rows they read back, counted in ``spill_reads`` too), and
        ``spill_ghost_hits`` (rows read back soon after they left RAM, within
        a shard's rows in RAM of evictions: evicted too early, they skip
        probation; docs/disk_tier.md)."""
        s = dict(self._t.stats())
        s["name"] = self.name
        return s

    def save(self, path, delta=False):
        """Write every row (``delta=True``: rows pushed since the last save, and
        keys dropped since then) with optimizer state to ``path`` atomically
        (temporary name, fsync, rename). Each shard is copied under its lock,
        so every row is saved from one instant. Returns the rows written."""
        return self._t.save(str(path), bool(delta))

    def load(self, path, filter=None):
        """Read a file written by :meth:`save` into this table (rows replace
        rows with the same key; a delta's dropped keys are removed).

        ``filter=(num_servers, server_index)`` keeps only keys with
        ``route(key, num_servers) == server_index``, so a checkpoint of any
        number of servers loads into any other. Refuses, with a message naming
        the file, one that is truncated, fails its checksum, or holds another
        dim or optimizer. A file of another storage type is converted (to
        nearest even); one written before storage types loads as fp32.
        Returns the rows loaded."""
        n, idx = (0, 0) if filter is None else (int(filter[0]), int(filter[1]))
        if filter is not None and not (n >= 1 and 0 <= idx < n):
            raise ValueError(f"filter must be (num_servers, server_index) with "
                             f"0 <= server_index < num_servers, got {filter!r}")
        return self._t.load(str(path), n, idx)

    def shrink(self, max_unseen_passes=None, min_update_count=None, min_score=None,
               decay=None):
        """End a pass and drop stale rows; returns the number of rows dropped.

        Each call ends one pass: a row pushed during it gets ``unseen_passes =
        0``, any other row ``unseen_passes += 1``. Then a row is dropped when
        ``unseen_passes > max_unseen_passes``, or when its ``update_count <
        min_update_count``, or when its show/click score (decayed by ``decay``
        per pass) ``< min_score``. Admission candidates are forgotten."""
        return self._t.shrink(-1 if max_unseen_passes is None else int(max_unseen_passes),
                              0 if min_update_count is None else int(min_update_count),
                              float("-inf") if min_score is None else float(min_score),
                              1.0 if decay is None else float(decay))

    def min_memory_budget(self):
        """The smallest ``memory_budget`` this table's rows allow."""
        return self._t.min_memory_budget()

    def __repr__(self):
        return (f"SparseTable(name={self.name!r}, dim={self.dim}, rows={len(self)}, "
                f"optimizer={self.optimizer!r}, storage={self.storage!r})")


class DenseTable:
    """A dense float32 parameter (or one block of one) with its optimizer.

    ``shape`` is an int or tuple; ``initial`` an array of that shape or an
    initializer (default zeros). ``pull()`` returns a copy; ``push(grad)``
    applies the optimizer to every element (Adam keeps one beta-power pair for
    the block), after adding ``regularizer``'s decay (as :class:`SparseTable`) to the
    gradient. Thread-safe; a push and a save never interleave.
    """

    def __init__(self, shape, optimizer, initial=None, seed=0, name=None, regularizer=None):
        self.shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
        if any(s < 1 for s in self.shape):
            raise ValueError(f"shape must have positive dimensions, got {self.shape}")
        if not isinstance(optimizer, _opt.Optimizer):
            raise ValueError(f"optimizer must be a pyfleet.optimizer rule, got {optimizer!r}")
        self.optimizer = optimizer
        self.name = name or "dense"
        self.size = int(np.prod(self.shape))
        self.regularizer = _opt.check_regularizer(regularizer)
        self._t = _core.DenseTable(self.size, optimizer._core_config(self.regularizer))
        if initial is None:
            return
        if isinstance(initial, _init.Initializer):
            initial = initial.generate(self.shape, seed=seed)
        self.set(initial)

    def set(self, values):
        """Overwrite the weights (optimizer state is reset)."""
        values = _values(np.asarray(values, dtype=np.float32).reshape(self.shape),
                         self.shape, "values")
        self._t.set(values.reshape(-1))

    def pull(self, out=None):
        if out is None:
            out = np.empty(self.shape, dtype=np.float32)
        else:
            out = _values(out, self.shape, "out")
        self._t.pull(out.reshape(-1))
        return out

    def push(self, grad):
        grad = _values(grad, self.shape, "grad")
        self._t.push(grad.reshape(-1))

    def add(self, delta):
        """``w += delta`` bypassing the optimizer (geo mode); state unchanged."""
        delta = _values(delta, self.shape, "delta")
        self._t.add_delta(delta.reshape(-1))

    def state(self):
        """The optimizer state as a float32 array (layout: see optimizer.h)."""
        return self._t.state()

    def memory_bytes(self):
        return self._t.memory_bytes()

    def save(self, path):
        return self._t.save(str(path))

    def load(self, path):
        return self._t.load(str(path))

    def __len__(self):
        return self.size

    def __repr__(self):
        return f"DenseTable(name={self.name!r}, shape={self.shape}, optimizer={self.optimizer!r})"
