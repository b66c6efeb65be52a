"""Runtime values of ``pyfleet.fluid``: tensors, scopes and places.

:class:`LoDTensor` (a value with sequence offsets), :class:`Scope` (the
persistable non-parameter state of a worker, e.g. the auc layer's counts),
:func:`global_scope` / :func:`scope_guard`, and the places (CPU only).
This module imports no other Fluid module: kernels, feeds and the graph all
build on it.
"""

import contextlib

import numpy as np

__all__ = [
    "CPUPlace",
    "CUDAPlace",
    "FetchedArray",
    "LoDTensor",
    "Scope",
    "convert_dtype",
    "create_lod_tensor",
    "create_random_int_lodtensor",
    "global_scope",
    "scope_guard",
]


_DTYPES = {"float32": np.float32, "float64": np.float64, "int64": np.int64,
           "int32": np.int32, "uint64": np.uint64, "bool": np.bool_, "float16": np.float16,
           "int8": np.int8, "uint8": np.uint8, "int16": np.int16}


def convert_dtype(dtype):
    """A numpy dtype from a Fluid dtype name, numpy dtype or type."""
    if isinstance(dtype, str):
        try:
            return np.dtype(_DTYPES[dtype])
        except KeyError:
            raise ValueError(f"unsupported dtype {dtype!r}; expected one of "
                             f"{sorted(_DTYPES)}") from None
    try:
        return np.dtype(dtype)
    except TypeError:
        raise ValueError(f"unsupported dtype {dtype!r}") from None


class FetchedArray(np.ndarray):
    """A fetched value: a plain ndarray (shape ``[1]`` for a scalar loss, as in
    Fluid) that also converts to a Python number when it holds one element.

    Fluid scripts print fetches with ``"%f" % cost``, ``float(cost)`` and
    ``"%f" % cost[0]``; numpy 2 refuses ``float()`` of a 1-element array that
    is not 0-d, so this subclass does the conversion itself. Any other use
    (indexing, arithmetic, ``np.array(v)``) is the ndarray's, and so is its
    ``repr`` (``array([0.47], dtype=float32)``, as Fluid's fetches printed).
    """

    def _one(self, what):
        if self.size != 1:
            raise TypeError(f"only a fetched value of one element converts to {what}; "
                            f"this one has shape {self.shape}")
        return self.reshape(-1)[0]

    def __float__(self):
        return float(self._one("float"))

    def __int__(self):
        return int(self._one("int"))

    def __index__(self):
        v = self._one("an index")
        if self.dtype.kind not in "iub":
            raise TypeError(f"a fetched {self.dtype} value cannot be used as an index")
        return int(v)

    def __complex__(self):
        return complex(self._one("complex"))

    def __repr__(self):
        # Fluid fetched plain ndarrays: `print([loss])` and log scrapers read
        # numpy's own form, `array([0.47], dtype=float32)`.
        return repr(self.view(np.ndarray))

    def __format__(self, spec):
        if spec and self.size == 1:
            return format(self.reshape(-1)[0].item(), spec)
        return super().__format__(spec)


def fetched(value):
    """``value`` as a :class:`FetchedArray` (a view, no copy) when it is an ndarray."""
    if type(value) is np.ndarray:
        return value.view(FetchedArray)
    return value


class CPUPlace:
    def __repr__(self):
        return "CPUPlace"


class CUDAPlace:
    def __init__(self, device_id=0):
        raise ValueError("pyfleet runs on CPU only: use fluid.CPUPlace()")


class LoDTensor:
    """A tensor with one level of sequence offsets (Fluid's LoDTensor, lod_level <= 1).

    ``data`` has one row per element of all sequences; ``offsets`` (int64,
    ``B + 1`` entries, starting at 0, non-decreasing, ending at ``len(data)``)
    delimits sequence ``i`` as rows ``offsets[i]:offsets[i+1]``.
    """

    def __init__(self, data=None, offsets=None):
        self._data = None if data is None else np.asarray(data)
        self._offsets = None
        self._segment_ids = None
        self._unit = None
        if offsets is not None:
            self._set_offsets(offsets)

    # Fluid's API
    def set(self, data, place=None):
        self._data = np.asarray(data)
        self._segment_ids = None
        self._unit = None

    def set_lod(self, lod):
        if len(lod) == 0:
            self._offsets = None
            return
        if len(lod) != 1:
            raise ValueError(f"only lod_level <= 1 is supported, got {len(lod)} levels")
        self._set_offsets(lod[0])

    def lod(self):
        return [] if self._offsets is None else [self._offsets.tolist()]

    def set_recursive_sequence_lengths(self, lengths):
        if len(lengths) == 0:
            self._offsets = None
            return
        if len(lengths) != 1:
            raise ValueError(f"only lod_level <= 1 is supported, got {len(lengths)} levels")
        lens = np.asarray(lengths[0], dtype=np.int64)
        self._set_offsets(np.concatenate([[0], np.cumsum(lens)]))

    def recursive_sequence_lengths(self):
        return [] if self._offsets is None else [np.diff(self._offsets).tolist()]

    def has_valid_recursive_sequence_lengths(self):
        try:
            self.validate()
            return True
        except ValueError:
            return False

    def shape(self):
        return list(self._data.shape)

    def _is_initialized(self):
        return self._data is not None

    def __array__(self, dtype=None, copy=None):
        return self._data if dtype is None else self._data.astype(dtype)

    def _set_offsets(self, offsets):
        off = np.asarray(offsets)
        if off.ndim != 1 or off.size < 1 or off.dtype.kind not in "iu":
            raise ValueError(f"lod offsets must be a 1-D integer array of B+1 entries, got "
                             f"dtype {off.dtype} shape {off.shape}")
        self._offsets = off.astype(np.int64, copy=False)
        self._segment_ids = None
        self._unit = None

    # engine helpers
    @property
    def data(self):
        return self._data

    @property
    def offsets(self):
        return self._offsets

    @property
    def num_sequences(self):
        return self._offsets.shape[0] - 1

    def validate(self, name="value"):
        if self._data is None:
            raise ValueError(f"{name}: LoDTensor has no data")
        if self._offsets is None:
            raise ValueError(f"{name}: LoDTensor has no lod (sequence offsets)")
        off = self._offsets
        n = self._data.shape[0] if self._data.ndim else 0
        shortest = int(np.minimum.reduce(off[1:] - off[:-1])) if off.size > 1 else 0
        if off[0] != 0 or off[-1] != n or shortest < 0:
            raise ValueError(f"{name}: lod offsets must start at 0, never decrease and end "
                             f"at the number of rows ({n}); got first={off[0]} "
                             f"last={off[-1]}")
        # n rows in n sequences, none empty: every sequence has one row.
        self._unit = off.size - 1 == n and (n == 0 or shortest >= 1)
        return self

    def _like(self, data):
        """A LoDTensor of ``data`` (same number of rows) with this one's
        sequences, already validated: shares offsets and cached facts."""
        t = LoDTensor.__new__(LoDTensor)
        t._data, t._offsets = data, self._offsets
        t._segment_ids, t._unit = self._segment_ids, self._unit
        return t

    def segment_ids(self):
        """The sequence index of every row (cached)."""
        if self._segment_ids is None:
            lens = np.diff(self._offsets)
            self._segment_ids = np.repeat(np.arange(lens.shape[0], dtype=np.int64), lens)
        return self._segment_ids

    def __repr__(self):
        shape = None if self._data is None else self._data.shape
        return f"LoDTensor(shape={shape}, lod={self.recursive_sequence_lengths()})"


def create_random_int_lodtensor(recursive_seq_lens, base_shape, place=None, low=0, high=1):
    """Fluid's test helper: a LoDTensor of random ints in ``[low, high]``,
    ``sum(lengths)`` rows of ``base_shape``, sequences of the given lengths."""
    if len(recursive_seq_lens) != 1:
        raise ValueError("create_random_int_lodtensor: only one LoD level is supported, got "
                         f"{len(recursive_seq_lens)}")
    lens = [int(n) for n in recursive_seq_lens[0]]
    data = np.random.randint(low, high + 1, size=[sum(lens)] + list(base_shape)).astype(
        np.int64)
    return create_lod_tensor(data, [lens], place)


def create_lod_tensor(data, recursive_seq_lens, place=None):
    """Fluid's ``create_lod_tensor``: ``data`` an array (or a list of sequences)."""
    if isinstance(data, LoDTensor):
        data = data.data
    if isinstance(data, list):
        flat = [x for seq in data for x in (seq if isinstance(seq, (list, tuple, np.ndarray))
                                             else [seq])]
        data = np.asarray(flat).reshape(len(flat), -1)
    t = LoDTensor()
    t.set(np.asarray(data))
    t.set_recursive_sequence_lengths(recursive_seq_lens)
    t.validate("create_lod_tensor")
    return t


class _ScopeVar:
    def __init__(self, scope, name):
        self._scope, self._name = scope, name

    def get_tensor(self):
        return _ScopeTensor(self._scope, self._name)

    def __repr__(self):
        return f"ScopeVar({self._name!r})"


class _ScopeTensor:
    """A live view of one scope entry (Fluid's ``var.get_tensor()``).

    A state entry (e.g. an auc layer's counts) is read and replaced in the
    scope, so what the next ``exe.run`` accumulates starts from the value
    ``set`` here. A dense parameter registered by the startup program reads
    and writes its backend (``pull_dense`` / ``set_dense``); a sparse table
    has no array form and is refused by name.
    """

    def __init__(self, scope, name):
        self._scope, self._name = scope, name

    def _param(self):
        entry = self._scope._params.get(self._name)
        if entry is not None and self._name not in self._scope.vars:
            backend, is_sparse_table = entry
            if is_sparse_table:
                raise ValueError(f"{self._name!r} is a sparse table: its rows have no array "
                                 "form in the scope; read them through the backend or "
                                 "fluid.io.save_persistables")
            return backend
        return None

    def _value(self):
        backend = self._param()
        if backend is not None:
            return np.asarray(backend.pull_dense(self._name))
        try:
            return self._scope.vars[self._name]
        except KeyError:
            raise ValueError(f"scope variable {self._name!r} holds no value") from None

    def set(self, value, place=None):
        """Replace the value (Fluid's ``tensor.set(array, place)``). A state
        keeps its dtype, and its shape when the sizes agree; a parameter keeps
        its shape and must get as many elements."""
        value = np.array(value, copy=True)
        backend = self._param()
        if backend is not None:
            old = np.asarray(backend.pull_dense(self._name))
            if value.size != old.size:
                raise ValueError(f"parameter {self._name!r} has shape {list(old.shape)}, got "
                                 f"a value of shape {list(value.shape)}")
            backend.set_dense(self._name, value.astype(old.dtype).reshape(old.shape))
            return
        old = self._scope.vars.get(self._name)
        if old is not None and old.size > 0:
            value = value.astype(old.dtype, copy=False)
            if value.size == old.size:
                value = value.reshape(old.shape)
        self._scope.vars[self._name] = value

    def __array__(self, dtype=None, copy=None):
        v = self._value()
        return v if dtype is None else v.astype(dtype)

    def shape(self):
        return list(self._value().shape)

    def _get_dims(self):
        return self.shape()

    def lod(self):
        return []

    def __repr__(self):
        return f"ScopeTensor({self._name!r}, shape={self.shape()})"


class Scope:
    """Persistable non-parameter state of a worker (e.g. the auc layer's
    counts), and the dense parameters its startup programs created (read
    through their backend).

    Not thread-safe: one executor thread per scope.
    """

    def __init__(self):
        self.vars = {}
        self._params = {}   # name -> (backend, is_sparse_table), set by the startup run

    def find_var(self, name):
        if name in self.vars or name in self._params:
            return _ScopeVar(self, name)
        return None

    def var(self, name):
        if name not in self._params:
            self.vars.setdefault(name, np.zeros(0, dtype=np.float32))
        return _ScopeVar(self, name)

    def _register_parameter(self, name, backend, is_sparse_table):
        self._params[name] = (backend, bool(is_sparse_table))


_global_scope = Scope()


def global_scope():
    return _global_scope


@contextlib.contextmanager
def scope_guard(scope):
    global _global_scope
    saved, _global_scope = _global_scope, scope
    try:
        yield
    finally:
        _global_scope = saved
