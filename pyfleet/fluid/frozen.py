"""The read-only parameters of a loaded prediction directory (:mod:`pyfleet.fluid.inference`).

:func:`frozen_backend` checks and maps the files an inference section lists: each
``.npy`` header against the model before anything is allocated, its size against
its header, its sha256 against the recorded one, and every value finite (read a
page at a time: mapped weights are never read whole). :class:`FrozenBackend`
answers pulls from them; a key the model never saw gets the row a server would
have created for it (the table's initializer with its seed), never zeros.
"""

import hashlib
import os

import numpy as np

from pyfleet import initializer as _init
from pyfleet.endpoint import check_file_name
from pyfleet.fluid.backend import Backend
from pyfleet.optimizer import SGD
from pyfleet.table import SparseTable

__all__ = ["PAGE_ROWS", "FrozenBackend", "check_finite", "frozen_backend", "load_npy",
           "sha256_file"]

PAGE_ROWS = 65536


def sha256_file(path):
    """The hex sha256 of the file at ``path``, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class FrozenBackend(Backend):
    """Read-only parameters of a prediction directory."""

    def __init__(self, dense, sparse, sparse_configs):
        self.dense = dense    # name -> float32 array
        self.sparse = sparse  # name -> (sorted keys, their rows, mapped weights, initial rows)
        self.sparse_configs = sparse_configs  # name -> {dim, initializer, seed[, storage]}

    def sparse_rows(self, name):
        """``(keys, weights)`` of table ``name`` in file order, ``weights`` mapped read-only."""
        skeys, order, weights, _ = self.sparse[name]
        return skeys[np.argsort(order)], weights  # (the load sorted them the same way)

    def _refuse(self, *_):
        raise ValueError("an inference model is read-only: it cannot create, train or "
                         "save parameters")

    create_sparse = create_dense = push_sparse = push_dense = set_dense = _refuse

    def pull_dense(self, name):
        try:
            return self.dense[name].copy()
        except KeyError:
            raise ValueError(f"the inference model has no parameter {name!r}") from None

    def pull_sparse(self, name, keys, create=True):  # never creates: the model is read-only
        try:
            skeys, order, weights, init = self.sparse[name]
        except KeyError:
            raise ValueError(f"the inference model has no sparse table {name!r}") from None
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        out = np.empty((keys.shape[0], weights.shape[1]), dtype=np.float32)
        if skeys.shape[0]:
            pos = np.minimum(np.searchsorted(skeys, keys), skeys.shape[0] - 1)
            hit = skeys[pos] == keys
            out[hit] = weights[order[pos[hit]]]
        else:
            hit = np.zeros(keys.shape[0], dtype=bool)
        miss = ~hit
        if miss.any():
            out[miss] = init.initial_values(keys[miss])
        return out


def load_npy(dirname, name, dtype, shape, digests, mmap=False):
    """The array of ``dirname/name``, after checking (before allocating it) that its
    header holds ``dtype`` and ``shape`` (None: any length on that axis), that the
    file is as long as its header says and that its sha256 is the recorded one."""
    path = os.path.join(dirname, check_file_name(name, "the inference model's file"))
    try:
        with open(path, "rb") as f:
            try:
                version = np.lib.format.read_magic(f)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                got_shape, fortran, got_dtype = read_header(f, max_header_size=1 << 16)
            except (ValueError, SyntaxError, TypeError) as e:
                raise ValueError(f"{path} is not a valid .npy file ({e})") from None
            header_end = f.tell()
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        raise ValueError(f"inference model file {path} is missing") from None
    if got_dtype != np.dtype(dtype) or fortran or len(got_shape) != len(shape) or any(
            w is not None and g != w for g, w in zip(got_shape, shape)):
        raise ValueError(f"{path}: its header says {got_dtype} {tuple(got_shape)}, the model "
                         f"expects {np.dtype(dtype)} "
                         f"{tuple('n' if w is None else w for w in shape)}")
    want_size = header_end + int(np.prod(got_shape, dtype=np.float64)) * got_dtype.itemsize
    if size != want_size:
        raise ValueError(f"{path} is {size:,} bytes, its header {tuple(got_shape)} needs "
                         f"{want_size:,} (a truncated or damaged file)")
    if digests is not None:
        if name not in digests:
            raise ValueError(f"{path} has no checksum in the model description")
        if sha256_file(path) != digests[name]:
            raise ValueError(f"{path} does not match its sha256 in the model description "
                             f"(a damaged or altered file)")
    mapped = mmap and want_size > header_end  # (numpy cannot map an empty array)
    return np.load(path, mmap_mode="r" if mapped else None, allow_pickle=False)


def check_finite(value, what, page_rows=PAGE_ROWS):
    v = np.atleast_1d(value)  # read in pages: a mapped file is not read in whole
    bad = sum(np.size(p) - int(np.count_nonzero(np.isfinite(p)))
              for p in (v[a:a + page_rows] for a in range(0, max(len(v), 1), page_rows)))
    if bad:
        raise ValueError(f"{what} holds {bad:,} NaN or infinite value(s) of {np.size(value):,}: "
                         f"the model is damaged (or diverged in training)")


def frozen_backend(dirname, section, program):
    params = {p.name: p for p in program.all_parameters()}
    digests = section.get("sha256")  # absent only where the caller said unchecked_ok
    dense = {}
    for name, fname in section["dense"].items():
        if name not in params:
            raise ValueError(f"{dirname}: parameter {name!r} of the inference section is not "
                             f"in the program")
        value = load_npy(dirname, fname, "<f4", tuple(params[name].shape), digests)
        check_finite(value, f"parameter {name!r} ({fname})")
        dense[name] = value
    sparse, configs = {}, {}
    for name, cfg in section["sparse"].items():
        dim, rows = int(cfg["dim"]), cfg.get("rows")
        rows = int(rows) if isinstance(rows, int) and not isinstance(rows, bool) else None
        keys = load_npy(dirname, cfg["keys"], "<u8", (rows,), digests)
        weights = load_npy(dirname, cfg["weights"], "<f4", (keys.shape[0], dim), digests, True)
        check_finite(weights, f"sparse table {name!r} ({cfg['weights']})")
        order = np.argsort(keys, kind="stable")
        init = SparseTable(dim, SGD(1.0), initializer=_init.from_config(cfg["initializer"]),
                           seed=int(cfg["seed"]), name=name)
        sparse[name] = (keys[order], order, weights, init)
        configs[name] = {k: cfg[k] for k in ("dim", "initializer", "seed", "storage") if k in cfg}
    checked = set(section["dense"].values()) | {
        t[k] for t in section["sparse"].values() for k in ("keys", "weights")}
    for fname, digest in (digests or {}).items():   # Fluid's files written beside
        if fname not in checked:
            path = os.path.join(dirname, check_file_name(fname, "the inference model's file"))
            if not os.path.exists(path):
                raise ValueError(f"inference model file {path} is missing")
            if sha256_file(path) != digest:
                raise ValueError(f"{path} does not match its sha256 in the model description "
                                 f"(a damaged or altered file)")
    return FrozenBackend(dense, sparse, configs)
