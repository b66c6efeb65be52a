"""What a peer may make one server hold: :class:`Limits` (docs/service.md, "Limits").

A server's memory must not grow with what an untrusted or broken peer sends.
Each limit is a ``Server(...)`` argument and a ``python -m pyfleet.service``
flag (the same name with dashes):

- ``max_message_bytes`` (default 256 MiB: the largest dense block a server
  takes, ``max_dense_floats`` x 4): the largest message. libzmq enforces it
  per frame (``ZMQ_MAXMSGSIZE``: a peer sending a larger frame is
  disconnected as it arrives), and hands over a multipart message only once
  all its frames arrived, with no bound on their number; so libzmq reads TCP
  peers only through the server's relay (:mod:`pyfleet.service.inbound`),
  which reads no more of a connection holding this (1 MiB more for framing)
  in messages the server has not taken, checked before each read, and cuts it
  when it then sends nothing more for 2 s, whoever the peer is (with the
  job's keys or without). A Unix-socket peer's message whose frames add up to
  more is refused once received. The memory of a large message goes back to
  the system once libzmq or the server lets go of it
  (:data:`pyfleet.service.loop.TRIM_BYTES`).
- ``max_queued_replies`` (default 16) and ``max_backlog_bytes`` (default
  64 MiB): replies waiting for one peer that does not read them: that many in
  libzmq's queue (``ZMQ_SNDHWM`` with ``ZMQ_ROUTER_MANDATORY``), then up to
  that many bytes in the server's backlog for the peer (a burst of small
  replies can outrun libzmq's count of what left); a reply beyond is dropped,
  logged and counted (``dropped_replies``). A pyfleet client's I/O thread
  reads its replies as they come, whatever its program does.
- ``max_request_keys`` (default 2^20, the client's largest pull): keys in one
  sparse request; a pull's reply (keys x dim floats) must also fit
  ``max_message_bytes``. Checked before any row is made.
- ``max_dense_floats`` (default 2^26), ``max_sparse_dim`` (default 4096),
  ``max_tables`` (default 1024): what a ``CREATE_TABLES`` request may add:
  dense blocks up to that many floats on this server in all, sparse rows up
  to that dim, tables up to that count. Tables given to the server itself
  (``Server(tables=...)``, ``--tables``, Fleet's ``init_server``) are the
  operator's and not capped; a request repeating an existing config is a
  no-op and never refused.
- Every number of a peer's table config is checked by type and range first
  (``dim`` an int, not ``65536.0``; seeds, shapes, block bounds and budgets
  ints; an optimizer's or initializer's numbers finite), and unknown keys are
  refused. A peer never chooses where a server writes: its ``spill_dir`` must
  lie inside the directory the operator gave the server (``spill_root``:
  ``Server(spill_root=...)``, ``--spill-dir``, or Fleet's
  ``sparse_spill_dir``); a server without one refuses a peer's disk tier.
- ``max_server_bytes`` (default: the machine's physical memory) and
  ``max_table_bytes`` (default: the same): what the sparse rows of all tables,
  and of one table, may hold in RAM, counted as rows x an upper bound of a row
  (``4 * (dim + optimizer state floats) + 64`` bytes; a table with a disk tier
  counts at most its ``memory_budget``). A pull or push that could create rows
  past either, were all its keys new, is refused by name before any row is made.
- ``max_buffer_bytes`` (default 256 MiB): one budget for every peer together:
  what libzmq holds for all TCP connections (unfinished and unread messages)
  with the requests the handler threads hold, checked by the relay before each
  read (past it, connections wait in TCP and one reads on alone, so TCP peers
  make a server hold at most ``max_buffer_bytes + max_message_bytes`` + 1 MiB;
  :mod:`pyfleet.service.inbound`), and the large replies libzmq still holds
  and every peer's backlog (see :mod:`pyfleet.service.loop`).
- ``max_step_bytes`` (default 128 MiB): sparse gradient bytes (keys and
  values) one worker's pushes may leave buffered on a sync-mode server in one
  step; a push beyond is refused by name (a step's own pushes of a CTR batch
  are a few MiB a server). A worker's dense pushes within a step add up in one
  buffer per block, so they never grow with the number of pushes.
"""

import math
import os
from typing import NamedTuple

import numpy as np

from pyfleet.errors import ConfigError
from pyfleet.service.protocol import Refused

__all__ = ["DEFAULTS", "ROW_OVERHEAD", "Limits", "add_arguments", "check_peer_config"]


def _physical_memory():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


# Bytes of a row beyond its floats, at most: metadata, index slot, allocator slack.
ROW_OVERHEAD = 64


class Limits(NamedTuple):
    max_message_bytes: int = 256 << 20
    max_queued_replies: int = 16
    max_backlog_bytes: int = 64 << 20
    max_request_keys: int = 1 << 20
    max_dense_floats: int = 1 << 26
    max_sparse_dim: int = 4096
    max_tables: int = 1024
    max_server_bytes: int = _physical_memory()
    max_table_bytes: int = _physical_memory()
    max_step_bytes: int = 128 << 20
    max_buffer_bytes: int = 256 << 20

    @classmethod
    def make(cls, **values):
        """Limits from keyword values (None: the default); each must be an int >= 1."""
        out = {}
        for name, default in cls._field_defaults.items():
            v = values.get(name)
            v = default if v is None else v
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
            out[name] = v
        return cls(**out)

    def check_keys(self, op, count, dim):
        """Refuse a sparse request of ``count`` keys of ``dim`` floats (before
        anything is pulled, pushed or created)."""
        if count > self.max_request_keys:
            raise Refused(f"{op.name} of {count} keys exceeds this server's max_request_keys="
                          f"{self.max_request_keys} (--max-request-keys; a client cuts its "
                          f"requests at max_pull_keys/max_request_keys, which must not be "
                          f"larger)")
        if 4 * count * dim > self.max_message_bytes:
            raise Refused(f"{op.name} of {count} keys x dim {dim} needs a message of "
                          f"{4 * count * dim} bytes, over max_message_bytes="
                          f"{self.max_message_bytes}")

    def check_growth(self, op, entry, keys, entries):
        """Refuse a request on sparse ``entry`` whose new ``keys`` could take its rows past
        ``max_table_bytes``, or all of ``entries``' past ``max_server_bytes`` (called
        before any row is made). Far from a cap every key is counted as new; near one,
        only the keys without a row (a slower look)."""
        if entry.budget is not None:
            return  # its RAM stays within its memory_budget; new rows go to disk
        table = len(entry.table) * entry.row_bound
        held = None
        grow = keys.shape[0] * entry.row_bound
        for exact in (False, True):
            if exact:
                grow = _new_keys(entry.table, keys) * entry.row_bound
            if table + grow > self.max_table_bytes:
                if exact:
                    raise Refused(f"{op.name} of {keys.shape[0]} keys would add {grow} bytes "
                                  f"of rows to table {entry.key!r}, which holds {table}: over "
                                  f"this server's max_table_bytes={self.max_table_bytes} "
                                  f"(--max-table-bytes)")
                continue
            if held is None:
                held = sum(e.held_bytes() for e in entries if e.kind == "sparse")
            if held + grow <= self.max_server_bytes:
                return
            if exact:
                raise Refused(f"{op.name} of {keys.shape[0]} keys would add {grow} bytes of "
                              f"rows to table {entry.key!r}; this server's tables hold "
                              f"{held}: over max_server_bytes={self.max_server_bytes} "
                              f"(--max-server-bytes)")

    def check_new_tables(self, new, existing):
        """Refuse a CREATE_TABLES request whose ``new`` configs (tables not yet
        held) would take this server beyond the table limits; ``existing``: the
        entries held. Each config is ``(key, cfg, dense floats)``."""
        if len(existing) + len(new) > self.max_tables:
            raise Refused(f"CREATE_TABLES would make {len(existing) + len(new)} tables, over "
                          f"this server's max_tables={self.max_tables} (--max-tables)")
        held = sum(e.end - e.start for e in existing if e.kind == "dense")
        for key, cfg, floats in new:
            if cfg["kind"] == "sparse":
                dim = cfg.get("dim")
                if not _is_int(dim) or dim > self.max_sparse_dim:
                    raise Refused(f"CREATE_TABLES: sparse table {key!r} of dim {dim!r} is over "
                                  f"this server's max_sparse_dim={self.max_sparse_dim} "
                                  f"(--max-sparse-dim), or not an int")
            held += floats
        if held > self.max_dense_floats:
            raise Refused(f"CREATE_TABLES would hold {held} dense floats on this server, over "
                          f"max_dense_floats={self.max_dense_floats} (--max-dense-floats)")


DEFAULTS = Limits()


RELAY_VAR = "PYFLEET_INBOUND_RELAY"


def inbound_relay_wanted():
    """``PYFLEET_INBOUND_RELAY``: 1 (the default) reads TCP peers through the
    inbound relay, which bounds what they make a server hold by
    ``max_buffer_bytes``; 0 lets libzmq read them itself (faster pulls over TCP,
    no such bound: for networks whose peers are all trusted). Anything else is
    a ConfigError naming it."""
    flag = os.environ.get(RELAY_VAR, "1").strip()
    if flag not in ("0", "1"):
        raise ConfigError(f"{RELAY_VAR} must be 0 (libzmq reads TCP peers itself: no byte "
                          f"bound on what they make a server hold) or 1 (the default: "
                          f"through the inbound relay), got {flag!r}")
    return flag == "1"


def add_arguments(parser):
    """The ``--max-*`` flags of ``python -m pyfleet.service`` (read them back
    with ``Limits.make(**vars(args))``)."""
    helps = {
        "max_message_bytes": "largest message: per frame by libzmq; a TCP connection "
                             "holding more in libzmq is cut (default 256 MiB)",
        "max_queued_replies": "replies kept for a peer that does not read them; more are "
                              "dropped (default 16)",
        "max_backlog_bytes": "bytes of replies kept for a peer beyond --max-queued-replies "
                             "(default 64 MiB)",
        "max_request_keys": "keys in one sparse request (default 1048576)",
        "max_dense_floats": "dense floats CREATE_TABLES requests may make on this server "
                            "(default 67108864)",
        "max_sparse_dim": "largest sparse dim a CREATE_TABLES request may make (default 4096)",
        "max_tables": "tables a CREATE_TABLES request may bring this server to (default 1024)",
        "max_server_bytes": "bytes the sparse rows of all tables may hold in RAM; a request "
                            "that could create rows past it is refused (default: physical "
                            "memory)",
        "max_table_bytes": "bytes one sparse table's rows may hold in RAM (default: physical "
                           "memory)",
        "max_step_bytes": "sparse gradient bytes one worker may buffer in one sync step "
                          "(default 128 MiB)",
        "max_buffer_bytes": "bytes of unfinished or unread requests in libzmq, unread "
                            "large replies, backlogs and requests in the handlers, all "
                            "peers together (default 256 MiB)",
    }
    for name, default in Limits._field_defaults.items():
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=default,
                            help=helps[name])


def _new_keys(table, keys):
    """How many distinct ``keys`` have no row in ``table`` yet."""
    distinct = np.unique(keys)
    return distinct.shape[0] - table.export(distinct)["keys"].shape[0]


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


_SPARSE_KEYS = frozenset({"kind", "name", "dim", "optimizer", "initializer", "seed", "entry",
                          "storage", "memory_budget", "spill_dir", "regularizer"})
_DENSE_KEYS = frozenset({"kind", "name", "shape", "optimizer", "initial", "seed", "start",
                         "end", "regularizer"})
_INT_RANGES = {"dim": (1, None), "seed": (-(1 << 63), (1 << 64) - 1), "start": (0, None),
               "end": (1, None), "memory_budget": (1, None)}


def _finite_numbers(value, where, depth=0):
    """Refuse a non-finite float (or a nesting deeper than 4) anywhere in ``value``."""
    if depth > 4:
        raise Refused(f"{where} nests too deep")
    if isinstance(value, float) and not math.isfinite(value):
        raise Refused(f"{where} holds {value!r}: numbers must be finite")
    if isinstance(value, dict):
        for k, v in value.items():
            _finite_numbers(v, f"{where}.{k}", depth + 1)
    elif isinstance(value, list) and value and not all(
            isinstance(x, (int, float)) for x in value):
        for i, v in enumerate(value):
            _finite_numbers(v, f"{where}[{i}]", depth + 1)
    elif isinstance(value, list) and value and any(
            isinstance(x, float) and not math.isfinite(x) for x in value):
        raise Refused(f"{where} holds a non-finite number")


def check_peer_config(cfg, spill_root):
    """Refuse a table config a peer sent (CREATE_TABLES) unless every key is known,
    every size and bound an int in range, every other number finite, and a disk
    tier's ``spill_dir`` inside ``spill_root`` (the operator's; None: no disk tier
    for peers). Raises :class:`Refused` naming the key."""
    name = cfg.get("name")
    kind = cfg.get("kind")
    known = _SPARSE_KEYS if kind == "sparse" else _DENSE_KEYS
    extra = sorted(set(cfg) - known)
    if extra:
        raise Refused(f"table {name!r} has unknown key(s) {extra}")
    for key, (lo, hi) in _INT_RANGES.items():
        v = cfg.get(key)
        if v is None and key not in ("dim",):
            continue
        if kind == "dense" and key == "dim":
            continue
        if not _is_int(v) or v < lo or (hi is not None and v > hi):
            span = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise Refused(f"table {name!r}: {key} must be an int {span}, "
                          f"got {v!r}")
    if kind == "dense":
        shape = cfg.get("shape")
        shape = [shape] if _is_int(shape) else shape
        if not isinstance(shape, list) or not 1 <= len(shape) <= 8 or not all(
                _is_int(x) and x >= 1 for x in shape):
            raise Refused(f"table {name!r}: shape must be a list of 1 to 8 "
                          f"ints >= 1, got {cfg.get('shape')!r}")
    for key in ("optimizer", "initializer", "entry", "regularizer", "initial"):
        _finite_numbers(cfg.get(key), f"table {name!r} {key}")
    spill = cfg.get("spill_dir")
    if spill is None and cfg.get("memory_budget") is None:
        return
    if spill_root is None:
        raise Refused(f"table {name!r} asks for a disk tier (spill_dir "
                      f"{spill!r}): a peer cannot choose where this server writes, and its "
                      f"operator gave it no spill directory (--spill-dir)")
    if not isinstance(spill, str):
        raise Refused(f"table {name!r}: spill_dir must be a path, got {spill!r}")
    if not os.path.isabs(spill):
        raise Refused(f"table {name!r}: spill_dir must be an absolute path, "
                      f"got {spill!r}")
    root = os.path.realpath(spill_root)
    real = os.path.realpath(spill)
    if real != root and not real.startswith(root + os.sep):
        raise Refused(f"table {name!r}: spill_dir {spill!r} lies outside this "
                      f"server's spill directory: refused")
