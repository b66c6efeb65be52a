"""Where data goes, without sockets: keys to servers, dense blocks to servers.

Sparse keys are deduplicated and routed with ``pyfleet.table.route(key, S)``
in one O(n) hash pass (``pyfleet._core.unique_route``), each server's share
sent as contiguous requests (views of one buffer, no copy), and the answers
gathered into the caller's order by one C++ pass over the reply buffers
(:func:`pyfleet.service.channel.pull_rows`). Dense parameters are split by a
block placement ``(name, start, end, server_index)`` over the flattened
parameter, learned from the servers' table maps (:class:`TableMap`).

Pure functions and one lock-guarded map: safe from any thread.
"""

import threading

import numpy as np

from pyfleet import _core
from pyfleet.errors import RemoteError
from pyfleet.service import protocol as P

__all__ = ["TableMap", "check_keys", "check_values", "gather_dense", "plan_keys",
           "split_configs", "unique_keys"]


class TableMap:
    """What a client knows of the servers' tables: per server the id of each
    table key (``ids``), sparse tables' dims and configs, and every dense
    parameter fully placed (``dense``: ``name -> (shape, [(start, end,
    server, id)])``). Updated by :meth:`learn`, and by :meth:`refresh`
    (``fetch()`` returns every server's TABLES reply) when a name is not
    known yet; thread-safe."""

    def __init__(self, num_servers, fetch):
        self.fetch = fetch
        self.lock = threading.Lock()
        self.ids = [{} for _ in range(num_servers)]  # per server: key -> id
        self.sparse = {}      # name -> dim
        self.sparse_cfg = {}  # name -> config
        self.dense = {}       # name -> (shape, [(start, end, server, id)])

    def refresh(self):
        self.learn(self.fetch())

    def sparse_dim(self, table):
        """The row width of sparse table ``table``; ValueError if no server has it."""
        if table not in self.sparse:
            self.refresh()
            if table not in self.sparse:
                raise ValueError(f"no sparse table {table!r} on the servers "
                                 f"(known: {sorted(self.sparse)})")
        return self.sparse[table]

    def dense_blocks(self, name):
        """``(shape, [(start, end, server, id)])`` of dense parameter ``name``;
        ValueError unless fully placed."""
        if name not in self.dense:
            self.refresh()
            if name not in self.dense:
                raise ValueError(f"no dense parameter {name!r} fully placed on the servers "
                                 f"(known: {sorted(self.dense)})")
        return self.dense[name]

    def dense_plan(self, names):
        """``(shapes, plan)``: ``{name: shape}`` and, per server,
        ``[(name, start, end, table_id)]`` of the blocks it holds."""
        shapes, plan = {}, {}
        for name in names:
            shape, blocks = self.dense_blocks(name)
            shapes[name] = shape
            for start, end, s, tid in blocks:
                plan.setdefault(s, []).append((name, start, end, tid))
        return shapes, plan

    def learn(self, maps):
        """Take in the TABLES/CREATE_TABLES replies of every server (in order)."""
        with self.lock:
            dense = {}
            for s, m in enumerate(maps):
                for key, info in m["tables"].items():
                    self.ids[s][key] = info["id"]
                    if info["kind"] == "sparse":
                        self.sparse[info["name"]] = info["dim"]
                        self.sparse_cfg[info["name"]] = info["config"]
                    else:
                        shape, blocks = dense.setdefault(info["name"], (tuple(info["shape"]), []))
                        blocks.append((info["start"], info["end"], s, info["id"]))
            for name, (shape, blocks) in dense.items():
                blocks.sort()
                pos = 0
                for start, end, _, _ in blocks:
                    if start != pos:
                        break
                    pos = end
                if pos == int(np.prod(shape)):
                    self.dense[name] = (shape, blocks)


def plan_keys(keys, num_servers, unique, step):
    """``(grouped, inverse, parts)`` for a batch of keys: ``grouped`` the
    distinct keys grouped by owning server, ``inverse`` the position in
    ``grouped`` of each key (None when ``grouped`` is ``keys`` itself), and
    ``parts`` the ``(server, start, end)`` ranges of ``grouped`` to send,
    at most ``step`` keys each, in ``grouped`` order.
    ``unique``: the caller says the keys are distinct; with one server
    they are then sent as they are (no hash pass). A wrong claim is the
    caller's bug: pulls still answer every key, but a push may then
    update a repeated key once per request instead of once in all."""
    n = keys.shape[0]
    if num_servers == 1 and (unique or n == 1):  # no kernel call
        return keys, None, [(0, a, min(a + step, n)) for a in range(0, n, step)]
    grouped, inverse, offsets = _core.unique_route(keys, num_servers)
    offsets = offsets.tolist()
    parts = [(s, a, min(a + step, offsets[s + 1]))
             for s in range(num_servers)
             for a in range(offsets[s], offsets[s + 1], step)]
    if grouped.shape[0] == n and (not parts or parts[0][0] == parts[-1][0]):
        # Distinct keys all owned by one server: grouped == keys (a group
        # keeps first-occurrence order), so no gather is needed.
        return keys, None, parts
    return grouped, inverse, parts


def gather_dense(shapes, plan, replies, endpoints):
    """``{name: value}`` of a dense pull's ``replies`` (one per server of
    ``plan``, in order), each parameter assembled from its blocks. A
    parameter held whole by one server is a view of its reply (no copy)."""
    pieces = {}
    for (s, blocks), (_header, frames) in zip(plan.items(), replies):
        if len(frames) != len(blocks):
            raise RemoteError(f"server {s} ({endpoints[s]}) answered {len(frames)} "
                              f"dense blocks for {len(blocks)}")
        for (name, start, end, _), f in zip(blocks, frames):
            pieces.setdefault(name, []).append(
                (start, end, P.values_from(f, end - start, 1).reshape(-1)))
    out = {}
    for name, shape in shapes.items():
        parts = pieces[name]
        if len(parts) == 1:
            out[name] = parts[0][2].reshape(shape)  # a view of the reply
            continue
        flat = np.empty(int(np.prod(shape)), dtype=np.float32)
        for start, end, v in parts:
            flat[start:end] = v
        out[name] = flat.reshape(shape)
    return out


def split_configs(configs, placement, num_servers):
    """The table configs each server must create (a list per server):
    sparse configs go to every server; a dense config to the servers its
    blocks name, with its block's ``start``/``end``. ``placement`` is a list
    of ``(name, start, end, server_index)`` over the flattened parameter (as
    computed by ``pyfleet.config``); a dense parameter it does not mention is
    placed whole on server ``i % S`` for the ``i``-th dense config. Raises
    ValueError for a placement that does not cover a parameter exactly."""
    per_server = [[] for _ in range(num_servers)]
    by_name = {}
    for name, start, end, s in (placement or []):
        by_name.setdefault(name, []).append((int(start), int(end), int(s)))
    n_dense = 0
    for cfg in configs:
        if cfg.get("kind") == "sparse":
            for lst in per_server:
                lst.append(cfg)
        elif cfg.get("kind") == "dense":
            shape = cfg.get("shape")
            size = int(np.prod(shape if isinstance(shape, (list, tuple)) else [shape]))
            blocks = sorted(by_name.get(cfg.get("name"),
                                        [(0, size, n_dense % num_servers)]))
            n_dense += 1
            pos = 0
            for start, end, s in blocks:
                if start != pos or end <= start or not 0 <= s < num_servers:
                    raise ValueError(f"placement of {cfg.get('name')!r} is not a list of "
                                     f"consecutive blocks on servers 0..{num_servers - 1}"
                                     f": {blocks}")
                pos = end
            if pos != size:
                raise ValueError(f"placement of {cfg.get('name')!r} covers {pos} of "
                                 f"{size} elements")
            for start, end, s in blocks:
                per_server[s].append({**cfg, "start": start, "end": end})
        else:
            raise ValueError(f"table kind must be 'sparse' or 'dense', got {cfg!r}")
    return per_server


def unique_keys(keys):
    """``(unique, inverse)`` with ``unique[inverse] == keys``, unique keys in
    first-occurrence order; ``(keys, None)`` when there is no duplicate. One
    O(n) hash pass (``pyfleet._core.unique_inverse``)."""
    uniq, inverse = _core.unique_inverse(keys)
    if uniq.shape[0] == keys.shape[0]:
        return keys, None
    return uniq, inverse


def check_keys(keys):
    if not isinstance(keys, np.ndarray) or keys.dtype != np.uint64 or keys.ndim != 1:
        got = (f"dtype {keys.dtype} shape {keys.shape}" if isinstance(keys, np.ndarray)
               else type(keys).__name__)
        raise ValueError(f"keys must be a 1-D numpy uint64 array, got {got}")
    return keys


def check_values(values, shape, what):
    if not isinstance(values, np.ndarray) or values.dtype != np.float32:
        got = values.dtype if isinstance(values, np.ndarray) else type(values).__name__
        raise ValueError(f"{what} must be a float32 numpy array, got {got}")
    if values.shape != tuple(shape):
        raise ValueError(f"{what} must have shape {tuple(shape)}, got {values.shape}")
    return np.ascontiguousarray(values)
