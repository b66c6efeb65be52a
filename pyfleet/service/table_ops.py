"""The ops one server answers from its tables (:class:`TableOps`): the data ops
(pulls and pushes) and the table control ops (create, list, shrink).

Each op method takes ``(header, op, payload frames, identity)`` and returns
the reply messages (frame lists starting with the identity); a bad request
raises :class:`~pyfleet.service.protocol.ProtocolError` or
:class:`~pyfleet.service.protocol.Refused`, which the server's dispatch turns
into an error reply. How pushes apply depends on the mode:

- ``async``: every push is applied on arrival (Hogwild).
- ``sync``: pushes are buffered per table in the
  :class:`~pyfleet.service.barrier.Barriers`; when every live worker has
  reached the barrier the buffered gradients are summed per key, divided by
  the number of workers at the step barrier, checked (every table, before any
  is changed: a value beyond ``MAX_UPDATE``, as finite gradients overflowing
  when summed, refuses the whole step) and applied once
  (:meth:`TableOps.apply_sync`), then the barrier replies. A worker's pull
  after the barrier sees every worker's update of that step.
- ``geo``: workers train locally and push deltas (``Flag.ADD_DELTA``) that are
  added to the rows (``w += delta``); gradient pushes to sparse tables are
  refused. A sparse table is stored with ``SGD(learning_rate=1)`` so that
  ``push(-delta)`` is exactly ``w + delta``; its configured optimizer runs in
  the workers. Dense parameters in geo mode take gradients (applied on
  arrival) or deltas.

Thread safety: every op may run on any thread at once (the tables serialize
their rows themselves); sync buffers and the export snapshots are guarded by
the server's lock.
"""

import logging
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from pyfleet import _core
from pyfleet.service import protocol as P
from pyfleet.service.protocol import Op, ProtocolError, Refused, Status

__all__ = ["MAX_UPDATE", "SPLIT_PULL_KEYS", "TableOps", "check_frames", "control_payload",
           "segment_sum", "spill_failure", "spill_reply"]

log = logging.getLogger("pyfleet.server")

MAX_JSON_BYTES = 64 << 20
# A sparse pull of at least this many keys is cut into up to
# ``handler_threads`` parts pulled at once (the serving thread takes one, pull
# helper threads the others; the table releases the GIL), as Paddle's sparse
# tables spread a pull over their shards' task pools: a big pull is bound by
# memory latency, which more cores hide (measured on 2 cores, 16k keys from a
# 512k-row table: 1.6 ms -> 0.8 ms). Smaller pulls are not worth a hand-off.
SPLIT_PULL_KEYS = 8192
# The largest gradient magnitude a push may carry (the core's kMaxUpdate,
# include/pyfleet/optimizer.h): its square leaves the optimizers' squared-
# gradient state finite. Larger, NaN or Inf: the push (async) or the step
# (sync) is refused and nothing of it applied.
MAX_UPDATE = 1e18
# Rows per EXPORT_SPARSE page unless the request asks for fewer.
_EXPORT_PAGE_ROWS = 65536
_ADD_DELTA = int(P.Flag.ADD_DELTA)
_PULL_AFTER = int(P.Flag.PULL_AFTER)
_NO_CREATE = int(P.Flag.NO_CREATE)


def _representable(grads):
    """Whether every value is within +-MAX_UPDATE (so neither NaN nor Inf)."""
    return bool((np.abs(grads) <= MAX_UPDATE).all())


def segment_sum(keys, values):
    """``(unique_keys, sums)``: rows of ``values`` with equal keys summed, in
    input order, keys in first-occurrence order (the core's hashing kernels,
    as the client uses). ``values`` is float32 ``[n, dim]``. Without
    duplicates the inputs themselves are returned (not copies)."""
    uniq, inverse = _core.unique_inverse(keys)
    if uniq.shape[0] == keys.shape[0]:
        return keys, values
    return uniq, _core.sum_rows(values, inverse, uniq.shape[0])


def check_frames(frames, n, op):
    if len(frames) != n:
        raise ProtocolError(f"{op.name} needs {n} payload frame(s), got {len(frames)}")


def control_payload(frames, op):
    """The JSON object of a control request (``{}`` without a payload frame)."""
    if len(frames) > 1:
        raise ProtocolError(f"{op.name} takes at most one JSON frame, got {len(frames)}")
    return P.parse_json(frames[0], MAX_JSON_BYTES) if frames else {}


class TableOps:
    """The table ops of a server over ``registry``, in ``mode``.

    ``barriers``: where sync-mode pushes wait; ``count(name)``: the server's
    counters; pulls of at least ``split_pull_keys`` keys are pulled in up to
    ``handler_threads`` parts at once; ``limits``: the
    :class:`~pyfleet.service.limits.Limits` requests must fit (a reply must
    fit ``max_message_bytes``)."""

    def __init__(self, registry, barriers, mode, count, handler_threads, split_pull_keys,
                 limits):
        self.registry, self.barriers, self.mode = registry, barriers, mode
        self.count = count
        self.handler_threads = handler_threads
        self.split_pull_keys = split_pull_keys
        self.limits = limits
        self.max_message_bytes = limits.max_message_bytes
        self.lock = registry.lock
        # Threads start on first use (a split pull).
        self._pull_helpers = ThreadPoolExecutor(
            max(handler_threads - 1, 1), thread_name_prefix="pyfleet-pull")
        self._export_snapshots = {}  # table id -> sorted keys of an export

    def ops(self):
        return {Op.PULL_SPARSE: self.pull_sparse, Op.PUSH_SPARSE: self.push_sparse,
                Op.PULL_DENSE: self.pull_dense, Op.PUSH_DENSE: self.push_dense,
                Op.PULL_DENSE_MANY: self.pull_dense_many,
                Op.PUSH_DENSE_MANY: self.push_dense_many,
                Op.EXPORT_SPARSE: self.export_sparse, Op.PUSH_SHOW_CLICK: self.push_show_click,
                Op.CREATE_TABLES: self.create_tables, Op.TABLES: self.tables,
                Op.SHRINK: self.shrink}

    def close(self):
        self._pull_helpers.shutdown(wait=False)

    def table_map(self):
        """The TABLES reply: every table's info, this server's place and mode."""
        return {**self.registry.table_map(), "mode": self.mode}

    def tables(self, h, op, frames, ident):
        control_payload(frames, op)
        return [[ident] + P.reply(h, payload=self.table_map())]

    def create_tables(self, h, op, frames, ident):
        configs = control_payload(frames, op).get("tables")
        if not isinstance(configs, list):
            raise Refused("CREATE_TABLES needs {'tables': [config, ...]}")
        self.registry.create_tables(configs, self.limits)
        return [[ident] + P.reply(h, payload=self.table_map())]

    def shrink(self, h, op, frames, ident):
        dropped = self.registry.shrink(control_payload(frames, op))
        return [[ident] + P.reply(h, payload={"dropped": dropped})]

    def _sparse_rows(self, h, op, frames, n_frames):
        """``(entry, keys)`` of a request on a sparse table's rows: ``n_frames``
        payload frames, the first the keys, rows of the table's dim."""
        check_frames(frames, n_frames, op)
        e = self.registry.entry(h.table, "sparse", op)
        if h.dim != e.dim:
            raise ProtocolError(f"dim {h.dim} does not match table {e.key!r} dim {e.dim}")
        self.limits.check_keys(op, h.count, e.dim)
        return e, P.keys_from(frames[0], h.count)

    def pull_sparse(self, h, op, frames, ident):
        e, keys = self._sparse_rows(h, op, frames, 1)
        n = keys.shape[0]
        create = not h.flags & _NO_CREATE
        if create:
            self.limits.check_growth(op, e, keys, list(self.registry.entries.values()))
        parts = min(self.handler_threads, n // max(self.split_pull_keys // 2, 1)) \
            if self.split_pull_keys and e.table.entry is None else 1
        if parts < 2:
            return [[ident] + P.reply(h, values=e.table.pull(keys, create=create))]
        out = np.empty((n, e.dim), dtype=np.float32)
        bounds = [n * i // parts for i in range(parts + 1)]
        rest = [self._pull_helpers.submit(e.table.pull, keys[a:b], out[a:b], create)
                for a, b in zip(bounds[1:-1], bounds[2:])]
        e.table.pull(keys[:bounds[1]], out[:bounds[1]], create)
        for f in rest:
            f.result()
        return [[ident] + P.reply(h, values=out)]

    def push_sparse(self, h, op, frames, ident):
        e, keys = self._sparse_rows(h, op, frames, 2)
        self.limits.check_growth(op, e, keys, list(self.registry.entries.values()))
        grads = P.values_from(frames[1], h.count, e.dim, "grads")
        delta = bool(h.flags & _ADD_DELTA)
        if self.mode == "geo" and not delta:
            raise Refused(f"geo-mode server takes deltas (ADD_DELTA) for sparse table "
                          f"{e.key!r}, not gradients")
        if self.mode != "geo" and delta:
            raise Refused(f"ADD_DELTA pushes need a geo-mode server (this one is {self.mode})")
        self._apply(e, h, keys, grads, delta)
        return [[ident] + P.reply(h)]

    def push_show_click(self, h, op, frames, ident):
        check_frames(frames, 2, op)
        e = self.registry.entry(h.table, "sparse", op)
        if h.dim != 2:
            raise ProtocolError(f"PUSH_SHOW_CLICK carries 2 floats a key (show, click), "
                                f"got dim {h.dim}")
        self.limits.check_keys(op, h.count, 2)
        keys = P.keys_from(frames[0], h.count)
        self.limits.check_growth(op, e, keys, list(self.registry.entries.values()))
        values = P.values_from(frames[1], h.count, 2, "show/click")
        e.table.add_show_click(keys, np.ascontiguousarray(values[:, 0]),
                               np.ascontiguousarray(values[:, 1]))
        return [[ident] + P.reply(h)]

    def pull_dense(self, h, op, frames, ident):
        check_frames(frames, 0, op)
        e = self.registry.entry(h.table, "dense", op)
        out = e.table.pull().reshape(-1)
        return [[ident] + P.reply(h, values=out, count=out.shape[0], dim=1)]

    def push_dense(self, h, op, frames, ident):
        check_frames(frames, 1, op)
        e = self.registry.entry(h.table, "dense", op)
        size = e.end - e.start
        if h.count != size:
            raise ProtocolError(f"dense push of {h.count} floats to {e.key!r} of {size}")
        grads = P.values_from(frames[0], h.count, 1, "grad").reshape(-1)
        delta = bool(h.flags & _ADD_DELTA)
        if self.mode != "geo" and delta:
            raise Refused(f"ADD_DELTA pushes need a geo-mode server (this one is {self.mode})")
        self._apply(e, h, None, grads, delta)
        return [[ident] + P.reply(h)]

    def _dense_many(self, h, op, frames, grads):
        """The entries of a *_DENSE_MANY request, every block checked (ids,
        kinds, sizes against ``count``, frame count) before any is touched."""
        n = h.dim
        want = 1 + (n if grads else 0)
        if len(frames) != want:
            raise ProtocolError(f"{op.name} of {n} block(s) needs {want} payload frame(s), "
                                f"got {len(frames)}")
        ids = P.table_ids_from(frames[0], n).tolist()
        if len(set(ids)) != n:
            raise Refused(f"{op.name} names a dense block twice: table ids {ids}")
        entries, total = [], 0
        for i, tid in enumerate(ids):
            e = self.registry.entries.get(tid)
            if e is None or e.kind != "dense":
                what = "unknown table id" if e is None else f"sparse table {e.key!r}, id"
                raise Refused(f"block {i}: {what} {tid} is not a dense block on server "
                              f"{self.registry.server_index}")
            size = e.end - e.start
            if grads and len(frames[1 + i]) != 4 * size:
                raise ProtocolError(f"block {i} ({e.key!r}, {size} floats): grad frame has "
                                    f"{len(frames[1 + i])} bytes, expected {4 * size}")
            entries.append(e)
            total += size
        if total != h.count:
            raise ProtocolError(f"{op.name}: header says {h.count} floats, the {n} block(s) "
                                f"named hold {total}")
        return entries

    def pull_dense_many(self, h, op, frames, ident):
        entries = self._dense_many(h, op, frames, False)
        return [[ident] + P.reply(h) + [e.table.pull().reshape(-1) for e in entries]]

    def push_dense_many(self, h, op, frames, ident):
        """Blocks are applied in request order; a block refused when applied
        (a non-finite gradient) ends the request with earlier blocks applied."""
        entries = self._dense_many(h, op, frames, True)
        delta = bool(h.flags & _ADD_DELTA)
        if self.mode != "geo" and delta:
            raise Refused(f"ADD_DELTA pushes need a geo-mode server (this one is {self.mode})")
        pull = bool(h.flags & _PULL_AFTER)
        if pull and self.mode == "sync":
            raise Refused("PULL_AFTER is meaningless on a sync-mode server (pushes apply at "
                          "the barrier); pull after the barrier instead")
        out = [ident] + P.reply(h)
        for i, e in enumerate(entries):
            grads = np.frombuffer(frames[1 + i].buffer, dtype="<f4")
            self._apply(e, h, None, grads, delta)
            if pull:
                out.append(e.table.pull().reshape(-1))
        return [out]

    def repeat_reply(self, h, op, frames, ident):
        """The answer to a retried push already applied (nothing applied
        again): its plain reply, or for a PUSH_DENSE_MANY with PULL_AFTER the
        blocks' current values."""
        if op == Op.PUSH_DENSE_MANY and h.flags & _PULL_AFTER:
            entries = self._dense_many(h, op, frames, True)
            return [[ident] + P.reply(h) + [e.table.pull().reshape(-1) for e in entries]]
        return [[ident] + P.reply(h)]

    def export_sparse(self, h, op, frames, ident):
        """One page of this shard's rows, weights only, keys ascending after
        ``after`` (the cursor: the last key sent). ``after=null`` starts an
        export from a sorted snapshot of the keys, kept until its last page so
        each page costs O(page); a later page with no snapshot (another export
        finished it) sorts a new one, so the cursor stays correct."""
        check_frames(frames, 1, op)
        payload = P.parse_json(frames[0], MAX_JSON_BYTES)
        e = self.registry.entry(h.table, "sparse", op)
        limit, after = payload.get("limit", _EXPORT_PAGE_ROWS), payload.get("after")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise Refused(f"limit must be a positive integer, got {limit!r}")
        # A page must fit in one message: keys (8 bytes) + a row per key.
        limit = min(limit, max(1, self.max_message_bytes // (2 * (8 + 4 * e.dim))))
        if after is not None and (isinstance(after, bool) or not isinstance(after, int) or
                                  not 0 <= after < 1 << 64):
            raise Refused(f"after must be a uint64 key or null, got {after!r}")
        snapshot = None if after is None else self._export_snapshots.get(e.id)
        if snapshot is None:
            snapshot = np.sort(e.table.keys())
            self._export_snapshots[e.id] = snapshot
        start = 0 if after is None else int(np.searchsorted(snapshot, np.uint64(after), "right"))
        keys = snapshot[start:start + limit]
        full = start + limit < snapshot.shape[0]
        if not full:
            self._export_snapshots.pop(e.id, None)
        rows = e.table.export(keys)  # rows dropped since the snapshot are left out
        k = np.ascontiguousarray(rows["keys"], dtype="<u8")
        w = np.ascontiguousarray(rows["weights"], dtype="<f4").reshape(k.shape[0], e.dim)
        nxt = int(keys[-1]) if full else None
        return [[ident, P.pack_header(h.op, h.request, h.table, k.shape[0], e.dim,
                                      P.Flag.REPLY, Status.OK),
                 k, w, P.json_frame({"next": nxt})]]

    def _apply(self, e, h, keys, grads, delta):
        if self.mode == "sync":
            if not np.isfinite(grads).all():
                self.count("rejected_nonfinite")
                raise Refused(f"gradient for {e.key!r} holds NaN or Inf; push rejected")
            if h.status == 0:
                raise Refused("a sync-mode push must carry the worker index in its header")
            with self.lock:
                self.barriers.buffer(h.status - 1, e.id, keys, grads)
            return
        try:
            if e.kind == "sparse":
                if delta:
                    e.table.add(keys, grads)
                else:
                    e.table.push(keys, grads)
            elif delta:
                e.table.add(grads.reshape(e.table.shape))
            else:
                e.table.push(grads.reshape(e.table.shape))
        except ValueError:
            if not _representable(grads):
                self.count("rejected_nonfinite")
                raise Refused(f"gradient for {e.key!r} holds NaN or Inf, or a value beyond "
                              f"+-{MAX_UPDATE:g}; push rejected") from None
            raise

    def apply_sync(self, buffered, workers):
        """Average the buffered pushes ``{table id: [(worker, keys, grads)]}``
        of a step over ``workers`` and apply them; caller holds the lock."""
        scale = np.float32(max(workers, 1))
        steps = []
        for tid, items in buffered.items():
            e = self.registry.entries[tid]
            items.sort(key=lambda it: it[0])  # add workers' gradients in worker order
            if e.kind == "sparse":
                keys = np.concatenate([it[1] for it in items])
                grads = np.concatenate([it[2] for it in items])
                keys, grads = segment_sum(keys, grads)
                grads = grads / scale
            else:
                keys, total = None, items[0][2].copy()
                for it in items[1:]:
                    total += it[2]
                grads = (total / scale).reshape(e.table.shape)
            if not _representable(grads):  # every table checked before any changes
                self.count("rejected_steps")
                raise Refused(f"the step's averaged gradient of {e.key!r} holds NaN or Inf, or a "
                              f"value beyond +-{MAX_UPDATE:g} (the workers' gradients overflow "
                              f"when summed); nothing of this step was applied")
            steps.append((e, keys, grads))
        for e, keys, grads in steps:
            if keys is None:
                e.table.push(grads)
            else:
                e.table.push(keys, grads)


_SPILL_IO = re.compile(r"spill file in (.+): (write|read) failed: (.+)")


def spill_failure(e):
    """The sentence for a disk tier's failed read or write (the core's
    RuntimeError), else None."""
    m = _SPILL_IO.fullmatch(str(e)) if isinstance(e, RuntimeError) else None
    if m is None:
        return None
    return (f"cannot {m.group(2)} a spill file in {m.group(1)}: {m.group(3)} (the disk tier "
            f"of this server's sparse tables; free space there or give --spill-dir another "
            f"disk)")


def spill_reply(e, h, ident, count, server_index):
    """The error reply to request ``h`` that a disk tier's failed read or write
    ended (a full spill disk: said once per server, in one line, no
    traceback; ``count(name)`` returns the counter after adding one), else None."""
    why = spill_failure(e)
    if why is None:
        return None
    if count("spill_failures") == 1:
        log.error("server %d: %s", server_index, why)
    return [[ident] + P.error_reply(h.op, h.request, f"{Op(h.op).name}: {why}")]
