"""The tables one server holds: :class:`Registry` of :class:`Entry`.

For one ``server_index`` among ``server_num``, a registry holds every sparse
table's shard (the keys ``pyfleet.table.route(key, server_num)`` sends here)
as a :class:`pyfleet.table.SparseTable`, and the dense parameter blocks placed
on this server as :class:`pyfleet.table.DenseTable`. Each table has an id (its
place in creation order, from 1), which requests name, and a key: a sparse
table's name, or ``name[start:end]`` for a dense block.

Thread safety: the registry shares its server's lock (``lock``); creating
tables takes it, and the methods reading every table (:meth:`table_map`,
:meth:`table_stats`, :meth:`shrink`) take it too. Looking one table up
(:meth:`entry`) takes no lock: an entry, once created, is never removed.
"""

import json
import re
import threading

import numpy as np

from pyfleet import initializer as _init
from pyfleet import optimizer as _opt
from pyfleet.service.limits import ROW_OVERHEAD, check_peer_config
from pyfleet.service.protocol import Refused
from pyfleet.table import DenseTable, SparseTable

__all__ = ["Entry", "Registry"]

# Table names become file names: no separators, no leading dot.
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@:+-]{0,199}")
_SHRINK_ARGS = frozenset({"max_unseen_passes", "min_update_count", "min_score", "decay",
                          "tables"})


class Entry:
    """One table of a server: ``table`` with its ``id``, ``key``, ``kind``
    (``"sparse"``/``"dense"``), ``name``, ``config`` (as created, and its
    ``canonical`` JSON), ``dim`` (1 for dense), and for a dense block its
    ``shape`` (the whole parameter's) and ``[start, end)`` of the flattened
    parameter. ``lock`` serializes a dense block's save/load with itself.
    ``row_bound``: an upper bound of a sparse row's bytes in RAM; ``budget``: its
    disk tier's memory budget (None: all rows in RAM)."""

    __slots__ = (
        "budget",
        "canonical",
        "config",
        "dim",
        "end",
        "id",
        "key",
        "kind",
        "lock",
        "name",
        "row_bound",
        "shape",
        "start",
        "table",
    )

    def held_bytes(self):
        """A sparse table's rows in RAM, at most (rows x ``row_bound``, its budget)."""
        held = len(self.table) * self.row_bound
        return held if self.budget is None else min(held, self.budget)

    def info(self):
        d = {"id": self.id, "kind": self.kind, "name": self.name}
        if self.kind == "sparse":
            d.update(dim=self.dim, config=self.config)
        else:
            d.update(shape=list(self.shape), start=self.start, end=self.end)
        return d


class Registry:
    """The tables of server ``server_index`` of ``server_num``.

    ``max_message_bytes``: a dense block must fit in one message.
    ``lock``: the server's lock (see the module docstring)."""

    def __init__(self, server_index, server_num, max_message_bytes, lock, spill_root=None):
        self.server_index, self.server_num = server_index, server_num
        self.spill_root = spill_root  # the operator's directory for peers' disk tiers
        self.max_message_bytes = max_message_bytes
        self.lock = lock
        self.entries = {}   # id -> Entry
        self.by_key = {}    # "name" / "name[s:e]" -> Entry

    def entry(self, table_id, kind, op):
        """The ``kind`` table of id ``table_id`` named by an ``op`` request."""
        e = self.entries.get(table_id)
        if e is None:
            raise Refused(f"unknown table id {table_id} for {op.name} on server "
                          f"{self.server_index} (known: {sorted(self.entries)})")
        if e.kind != kind:
            raise Refused(f"table {e.key!r} is {e.kind}, {op.name} needs a {kind} table")
        return e

    def table_map(self):
        """What the TABLES op answers: every table's info by key."""
        with self.lock:
            return {"tables": {e.key: e.info() for e in self.entries.values()},
                    "server_index": self.server_index, "server_num": self.server_num}

    def table_stats(self):
        """``{key: stats}`` of every table (JSON-friendly)."""
        with self.lock:
            tables = {}
            for e in self.entries.values():
                if e.kind == "sparse":
                    tables[e.key] = {k: _jsonable(v) for k, v in e.table.stats().items()}
                else:
                    tables[e.key] = {"size": e.end - e.start,
                                     "memory_bytes": int(e.table.memory_bytes())}
            return tables

    def shrink(self, payload):
        """End a pass on the sparse tables ``payload["tables"]`` names (all by
        default) with the other arguments of ``SparseTable.shrink``:
        ``{name: rows dropped}``."""
        extra = set(payload) - _SHRINK_ARGS
        if extra:
            raise Refused(f"unknown shrink argument(s) {sorted(extra)}")
        names = payload.pop("tables", None)
        dropped = {}
        with self.lock:
            for e in self.entries.values():
                if e.kind == "sparse" and (names is None or e.name in names):
                    dropped[e.name] = e.table.shrink(**payload)
        return dropped

    def create_tables(self, configs, limits=None):
        """Create tables from JSON configs (idempotent: an identical config again
        is a no-op; a different config under an existing name is a ValueError).

        Sparse: ``{"kind": "sparse", "name", **SparseTable.config()}``, holding
        this server's shard. Dense: ``{"kind": "dense", "name", "shape",
        "optimizer", "initial"?, "seed"?, "start"?, "end"?, "regularizer"?}``: this server holds
        elements ``[start, end)`` of the flattened parameter (default: all);
        ``initial`` is a flat list of the whole parameter or an initializer
        config. Every config is checked before any table is made.
        ``limits``: a :class:`~pyfleet.service.limits.Limits` the tables not
        yet held must fit (a CREATE_TABLES request; None: not capped). Returns
        the key -> id map."""
        built = []
        for cfg in configs:
            if not isinstance(cfg, dict):
                raise ValueError(f"a table config must be a JSON object, got {cfg!r}")
            kind, name = cfg.get("kind"), cfg.get("name")
            if not isinstance(name, str) or not NAME_RE.fullmatch(name):
                raise ValueError(f"table name {name!r} must match {NAME_RE.pattern}")
            if limits is not None and kind in ("sparse", "dense"):
                check_peer_config(cfg, self.spill_root)  # a peer's: types, ranges, paths
            floats = 0
            if kind == "sparse":
                key = name
            elif kind == "dense":
                size = int(np.prod(_shape(cfg.get("shape"), name)))
                start, end = int(cfg.get("start", 0)), int(cfg.get("end", size))
                if not 0 <= start < end <= size:
                    raise ValueError(f"dense {name!r}: block [{start}, {end}) not inside "
                                     f"[0, {size})")
                if 4 * (end - start) > self.max_message_bytes:
                    raise ValueError(f"dense {name!r}: a block of {end - start} floats does "
                                     f"not fit in max_message_bytes={self.max_message_bytes}; "
                                     f"slice it over more blocks")
                key, floats = f"{name}[{start}:{end}]", end - start
            else:
                raise ValueError(f"table kind must be 'sparse' or 'dense', got {kind!r}")
            _opt.check_regularizer(cfg.get("regularizer"))
            built.append((key, cfg, floats))
        with self.lock:
            if limits is not None:
                fresh = {k: (k, c, f) for k, c, f in built if k not in self.by_key}
                limits.check_new_tables(list(fresh.values()), list(self.entries.values()))
            for key, cfg, _ in built:
                old = self.by_key.get(key)
                if old is not None:
                    if old.canonical != _canonical(cfg):
                        raise ValueError(f"table {key!r} already exists with a different "
                                         f"config: {old.config} vs {cfg}")
                    continue
                if cfg["kind"] == "sparse" and any(
                        e.kind == "sparse" and e.name == cfg["name"] for e in self.by_key.values()):
                    raise ValueError(f"table {cfg['name']!r} already exists")
                e = _build(key, cfg)
                e.id = len(self.entries) + 1
                self.entries[e.id] = e
                self.by_key[key] = e
            return {k: e.id for k, e in self.by_key.items()}


def _build(key, cfg):
    e = Entry()
    e.key, e.kind, e.name, e.config = key, cfg["kind"], cfg["name"], cfg
    e.canonical = _canonical(cfg)
    e.lock = threading.Lock()
    if e.kind == "sparse":
        c = {k: v for k, v in cfg.items() if k != "kind"}
        e.table = SparseTable.from_config(c)
        e.dim = e.table.dim
        e.row_bound = 4 * (e.dim + e.table.stats()["state_dim"]) + ROW_OVERHEAD
        e.budget = e.table.memory_budget
        e.start = e.end = e.shape = None
    else:
        e.shape = _shape(cfg["shape"], e.name)
        size = int(np.prod(e.shape))
        e.start, e.end = int(cfg.get("start", 0)), int(cfg.get("end", size))
        opt = _opt.from_config(cfg["optimizer"])
        initial = cfg.get("initial")
        if isinstance(initial, dict):
            initial = _init.from_config(initial).generate(
                e.shape, seed=int(cfg.get("seed", 0))).reshape(-1)
        elif initial is not None:
            initial = np.asarray(initial, dtype=np.float32).reshape(-1)
            if initial.shape[0] != size:
                raise ValueError(f"dense {e.name!r}: initial has {initial.shape[0]} "
                                 f"values, shape {e.shape} needs {size}")
        if initial is not None:
            initial = initial[e.start:e.end]
        e.table = DenseTable(e.end - e.start, opt, initial=initial, name=key,
                             regularizer=cfg.get("regularizer"))
        e.dim = 1
        e.row_bound = e.budget = None
    return e


def _canonical(cfg):
    """The comparable form of a table config: a sparse one with its defaults
    filled in, so leaving out ``storage`` equals saying "fp32"."""
    if cfg.get("kind") == "sparse":
        cfg = SparseTable.full_config(cfg)
    return json.dumps(cfg, sort_keys=True, separators=(",", ":"))


def _shape(shape, name):
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = [shape]
    if (not isinstance(shape, (list, tuple)) or not shape
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1
                       for s in shape)):
        raise ValueError(f"dense {name!r}: shape must be a list of positive ints, got {shape!r}")
    return tuple(shape)


def _jsonable(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v
