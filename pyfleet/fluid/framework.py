"""Programs, variables and parameters: the static graph of ``pyfleet.fluid``.

As in PaddlePaddle Fluid 1.5, layer functions append operators to the current
*main program* and parameter initializers to the current *startup program*
(:func:`program_guard` changes both). Nothing is computed while a network is
built; :class:`pyfleet.fluid.Executor` runs programs.

Differences from Fluid, by design:

- Parameters live in a backend (``program._backend``, see
  :mod:`pyfleet.fluid.backend`), not in a scope; a program's clones share it.
- Initialization is deterministic: every parameter's seed is derived from the
  program's ``random_seed`` and the parameter's name (Fluid's
  ``random_seed = 0`` means "random"; here it is just seed 0).
- An embedding whose ``is_distributed=True`` or whose vocabulary is at least
  :data:`SPARSE_TABLE_MIN_VOCAB` rows is a *sparse table* keyed by the raw
  uint64 id (ids are not bounded by the vocabulary).

Programs are not thread-safe while they are being built; a built program may
be run by several executors.
"""

import contextlib
import copy
import zlib

import numpy as np

__all__ = [
    "SPARSE_TABLE_MIN_VOCAB",
    "Block",
    "CPUPlace",
    "CUDAPlace",
    "LoDTensor",
    "Operator",
    "ParamAttr",
    "Parameter",
    "Program",
    "Scope",
    "Variable",
    "create_lod_tensor",
    "default_main_program",
    "default_startup_program",
    "global_scope",
    "minimize",
    "name_scope",
    "program_guard",
    "scope_guard",
    "switch_main_program",
    "switch_startup_program",
    "unique_name",
]

# From this many rows on, an embedding is a sparse table even without
# is_distributed: a dense [vocab, dim] parameter would be pulled whole each step.
SPARSE_TABLE_MIN_VOCAB = 100_000

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


class _UniqueName:
    """Fluid's ``unique_name``: ``generate("fc")`` gives ``fc_0``, ``fc_1``, ..."""

    def __init__(self):
        self.counters = {}

    def generate(self, key):
        n = self.counters.get(key, 0)
        self.counters[key] = n + 1
        return f"{key}_{n}"

    @contextlib.contextmanager
    def guard(self, new_generator=None):
        saved = self.counters
        self.counters = {}
        try:
            yield
        finally:
            self.counters = saved


unique_name = _UniqueName()


@contextlib.contextmanager
def name_scope(prefix=None):
    """Accepted for compatibility; names are not prefixed."""
    yield


class CPUPlace:
    def __repr__(self):
        return "CPUPlace"


class CUDAPlace:
    def __init__(self, device_id=0):
        raise ValueError("pyfleet runs on CPU only: use fluid.CPUPlace()")


# --------------------------------------------------------------------------- tensors

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


class _ScopeTensor:
    """A live view of one scope entry; ``set`` replaces the value."""

    def __init__(self, scope, name):
        self._scope, self._name = scope, name

    def set(self, value, place=None):
        old = self._scope.vars.get(self._name)
        value = np.array(value, copy=True)
        if old is not None:
            value = value.astype(old.dtype, copy=False).reshape(old.shape)
        self._scope.vars[self._name] = value

    def __array__(self, dtype=None, copy=None):
        v = self._scope.vars[self._name]
        return v if dtype is None else v.astype(dtype)

    def shape(self):
        return list(self._scope.vars[self._name].shape)


class Scope:
    """Persistable non-parameter state of a worker (e.g. the auc layer's counts).

    Not thread-safe: one executor thread per scope.
    """

    def __init__(self):
        self.vars = {}

    def find_var(self, name):
        return _ScopeVar(self, name) if name in self.vars else None

    def var(self, name):
        self.vars.setdefault(name, np.zeros(0, dtype=np.float32))
        return _ScopeVar(self, name)


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


# --------------------------------------------------------------------------- graph

class Variable:
    """A node of the graph: a name, a static shape (``-1`` for the batch), a dtype.

    ``lod_level=1`` means the runtime value is a :class:`LoDTensor`.
    """

    def __init__(self, block, name, shape=None, dtype="float32", lod_level=0,
                 persistable=False, stop_gradient=False, is_data=False):
        self.block = block
        self.name = name
        self.shape = tuple(int(s) for s in shape) if shape is not None else None
        self.dtype = convert_dtype(dtype)
        self.lod_level = int(lod_level)
        self.persistable = bool(persistable)
        self.stop_gradient = bool(stop_gradient)
        self.is_data = bool(is_data)
        self.op = None

    @property
    def program(self):
        return self.block.program

    def __repr__(self):
        return (f"Variable(name={self.name!r}, shape={self.shape}, dtype={self.dtype}, "
                f"lod_level={self.lod_level})")

    # Fluid's monkey-patched arithmetic: var + var, var * 2.0, ...
    def _binary(self, other, op, reverse=False):
        from pyfleet.fluid import layers
        if not isinstance(other, Variable):
            other = float(other)
            if op == "elementwise_add":
                return layers.scale(self, scale=1.0, bias=other)
            if op == "elementwise_sub":
                return (layers.scale(self, scale=-1.0, bias=other) if reverse
                        else layers.scale(self, scale=1.0, bias=-other))
            if op == "elementwise_mul":
                return layers.scale(self, scale=other)
            if op == "elementwise_div" and not reverse:
                return layers.scale(self, scale=1.0 / other)
            other = layers.fill_constant([1], self.dtype.name, other)
        x, y = (other, self) if reverse else (self, other)
        return getattr(layers, op)(x, y)

    def __add__(self, o):
        return self._binary(o, "elementwise_add")

    def __radd__(self, o):
        return self._binary(o, "elementwise_add", True)

    def __sub__(self, o):
        return self._binary(o, "elementwise_sub")

    def __rsub__(self, o):
        return self._binary(o, "elementwise_sub", True)

    def __mul__(self, o):
        return self._binary(o, "elementwise_mul")

    def __rmul__(self, o):
        return self._binary(o, "elementwise_mul", True)

    def __truediv__(self, o):
        return self._binary(o, "elementwise_div")

    def __rtruediv__(self, o):
        return self._binary(o, "elementwise_div", True)

    def __neg__(self):
        from pyfleet.fluid import layers
        return layers.scale(self, scale=-1.0)


class Parameter(Variable):
    """A trainable value held by the program's backend.

    Attributes the parameter-server layer reads: ``name``, ``shape``,
    ``is_sparse_table`` (``True``: a table of rows keyed by uint64 id, ``dim``
    floats a row; ``shape`` is then ``(vocab, dim)`` as declared), ``dim``,
    ``initializer`` (resolved, never None), ``seed`` (deterministic),
    ``optimizer`` (the rule minimizing the program's loss, with this
    parameter's learning-rate multiplier applied; None before ``minimize``),
    ``trainable``, :meth:`initial_value` for dense parameters.
    """

    def __init__(self, block, name, shape, dtype="float32", initializer=None,
                 trainable=True, learning_rate=1.0, is_sparse_table=False):
        super().__init__(block, name, shape, dtype, persistable=True,
                         stop_gradient=not trainable)
        self.trainable = bool(trainable)
        self.learning_rate = float(learning_rate)
        self.is_sparse_table = bool(is_sparse_table)
        self.dim = int(self.shape[-1])
        self.initializer = initializer

    @property
    def seed(self):
        rs = int(self.block.program.random_seed) & 0xFFFFFFFF
        return (rs << 32) | zlib.crc32(self.name.encode())

    @property
    def optimizer(self):
        opt = self.block.program._optimizer
        if opt is None:
            return None
        if self.learning_rate == 1.0:
            return opt
        from pyfleet import optimizer as _opt
        cfg = opt.to_config()
        cfg["learning_rate"] = cfg["learning_rate"] * self.learning_rate
        return _opt.from_config(cfg)

    def initial_value(self):
        """The dense parameter's initial float32 value (deterministic)."""
        if self.is_sparse_table:
            raise ValueError(f"{self.name} is a sparse table: its rows are created on pull")
        return np.asarray(self.initializer.generate(self.shape, seed=self.seed),
                          dtype=np.float32).reshape(self.shape)

    def __repr__(self):
        kind = "sparse table" if self.is_sparse_table else "dense"
        return f"Parameter(name={self.name!r}, shape={self.shape}, {kind})"


class Operator:
    """One operation: ``type``, ``inputs``/``outputs`` (slot -> list of
    :class:`Variable`) and ``attrs``."""

    def __init__(self, block, type, inputs=None, outputs=None, attrs=None):
        self.block = block
        self.type = type
        self.inputs = {k: list(v) for k, v in (inputs or {}).items()}
        self.outputs = {k: list(v) for k, v in (outputs or {}).items()}
        self.attrs = dict(attrs or {})

    def input(self, slot):
        return self.inputs.get(slot, [])

    def output(self, slot):
        return self.outputs.get(slot, [])

    def input_vars(self):
        return [v for vs in self.inputs.values() for v in vs]

    def output_vars(self):
        return [v for vs in self.outputs.values() for v in vs]

    def __repr__(self):
        ins = {k: [v.name for v in vs] for k, vs in self.inputs.items()}
        outs = {k: [v.name for v in vs] for k, vs in self.outputs.items()}
        return f"Operator({self.type}, inputs={ins}, outputs={outs})"


class Block:
    """The (single) block of a program: its variables and operators in order."""

    def __init__(self, program, idx=0):
        self.program = program
        self.idx = idx
        self.vars = {}
        self.ops = []

    def var(self, name):
        try:
            return self.vars[name]
        except KeyError:
            raise ValueError(f"no variable named {name!r} in this program") from None

    def has_var(self, name):
        return name in self.vars

    def create_var(self, name=None, shape=None, dtype="float32", lod_level=0,
                   persistable=False, stop_gradient=False, is_data=False):
        name = name or unique_name.generate("_generated_var")
        if name in self.vars:
            raise ValueError(f"variable {name!r} already exists in this program")
        v = Variable(self, name, shape, dtype, lod_level, persistable, stop_gradient, is_data)
        self.vars[name] = v
        return v

    def create_parameter(self, name, shape, dtype, initializer, trainable=True,
                         learning_rate=1.0, is_sparse_table=False):
        if name in self.vars:
            p = self.vars[name]
            if not isinstance(p, Parameter):
                raise ValueError(f"{name!r} already names a non-parameter variable")
            if p.is_sparse_table != is_sparse_table or (
                    tuple(p.shape[1:] if is_sparse_table else p.shape)
                    != tuple(shape[1:] if is_sparse_table else shape)):
                raise ValueError(f"parameter {name!r} is shared with an incompatible shape: "
                                 f"{p.shape} (sparse={p.is_sparse_table}) vs {tuple(shape)} "
                                 f"(sparse={is_sparse_table})")
            return p
        p = Parameter(self, name, shape, dtype, initializer, trainable, learning_rate,
                      is_sparse_table)
        self.vars[name] = p
        return p

    def append_op(self, type, inputs=None, outputs=None, attrs=None):
        op = Operator(self, type, inputs, outputs, attrs)
        for v in op.output_vars():
            v.op = op
        self.ops.append(op)
        self.program._version += 1
        return op

    def all_parameters(self):
        return [v for v in self.vars.values() if isinstance(v, Parameter)]

    def iter_parameters(self):
        return iter(self.all_parameters())


class Program:
    """A list of operators over variables, plus the optimizer that trains it.

    Attributes: ``random_seed`` (parameter initialization), ``_backend`` (see
    :mod:`pyfleet.fluid.backend`; set it before running the startup program
    to train through another backend; unset, a :class:`LocalBackend` is made
    on first use and shared with clones).
    """

    def __init__(self):
        self.blocks = [Block(self)]
        self.random_seed = 0
        self._backend = None
        self._backend_parent = None   # clones resolve the backend through their origin
        self._optimizer = None
        self._loss = None
        self._trainable = None        # names minimize may update (None: all trainable)
        self._init_params = []        # startup program: parameters it creates
        self._init_states = []        # startup program: (scope var name, zero value)
        self._main_of_startup = None  # startup program: the main program it initializes
        self._version = 0
        self._plan_cache = {}
        self._initialized_with = None  # the optimizer in force when the startup ran
        self._py_readers = []          # non-iterable PyReaders feeding this program

    def global_block(self):
        return self.blocks[0]

    def current_block(self):
        return self.blocks[0]

    def block(self, idx):
        return self.blocks[idx]

    def list_vars(self):
        return iter(self.global_block().vars.values())

    def all_parameters(self):
        return self.global_block().all_parameters()

    @property
    def num_blocks(self):
        return len(self.blocks)

    def sparse_tables(self):
        """Parameters that are sparse tables."""
        return [p for p in self.all_parameters() if p.is_sparse_table]

    def dense_parameters(self):
        return [p for p in self.all_parameters() if not p.is_sparse_table]

    def _get_backend(self):
        if self._backend is not None:
            return self._backend
        if self._backend_parent is not None:
            return self._backend_parent._get_backend()
        if self._main_of_startup is not None:
            return self._main_of_startup._get_backend()
        from pyfleet.fluid.backend import LocalBackend
        self._backend = LocalBackend()
        return self._backend

    def clone(self, for_test=False):
        """A copy of the operator list sharing parameters and backend.

        ``for_test=True`` drops the optimizer: running the clone computes only.
        """
        p = copy.copy(self)
        p.blocks = [Block(p)]
        p.blocks[0].vars = self.global_block().vars
        p.blocks[0].ops = list(self.global_block().ops)
        p._backend = None
        p._backend_parent = self
        p._plan_cache = {}
        p._init_params = list(self._init_params)
        p._init_states = list(self._init_states)
        p._py_readers = self._py_readers
        if for_test:
            p._optimizer = None
            p._loss = None
        return p

    def to_dict(self, ops=None):
        """A JSON-friendly description of the program (or of the subset
        ``ops`` and the variables they use): variables, parameters with their
        initializer, seed and optimizer, operators in order."""
        block = self.global_block()
        ops = block.ops if ops is None else ops
        used = {}
        for op in ops:
            for v in op.input_vars() + op.output_vars():
                used[v.name] = v
        if ops is block.ops:
            used.update((n, v) for n, v in block.vars.items() if not n.endswith("@GRAD"))
        out_vars = []
        for v in used.values():
            d = {"name": v.name, "shape": None if v.shape is None else list(v.shape),
                 "dtype": v.dtype.name, "lod_level": v.lod_level, "persistable": v.persistable,
                 "stop_gradient": v.stop_gradient, "is_data": v.is_data}
            if isinstance(v, Parameter):
                opt = v.optimizer
                d["parameter"] = {"trainable": v.trainable, "learning_rate": v.learning_rate,
                                  "is_sparse_table": v.is_sparse_table,
                                  "initializer": v.initializer.to_config(),
                                  "optimizer": None if opt is None else opt.to_config()}
            out_vars.append(d)
        out_ops = [{"type": op.type,
                    "inputs": {k: [v.name for v in vs] for k, vs in op.inputs.items()},
                    "outputs": {k: [v.name for v in vs] for k, vs in op.outputs.items()},
                    "attrs": op.attrs} for op in ops]
        return {"format": PROGRAM_FORMAT, "version": PROGRAM_FORMAT_VERSION,
                "random_seed": int(self.random_seed), "vars": out_vars, "ops": out_ops}

    @classmethod
    def from_dict(cls, d):
        """Rebuild a program from :meth:`to_dict` output (no optimizer attached;
        parameters keep their recorded optimizer in ``_saved_optimizer``)."""
        from pyfleet import initializer as _init
        from pyfleet import optimizer as _opt
        if not isinstance(d, dict) or d.get("format") != PROGRAM_FORMAT:
            raise ValueError("not a pyfleet.fluid program description")
        if d.get("version") != PROGRAM_FORMAT_VERSION:
            raise ValueError(f"program description version {d.get('version')!r} is not "
                             f"supported (expected {PROGRAM_FORMAT_VERSION})")
        p = cls()
        p.random_seed = int(d.get("random_seed", 0))
        block = p.global_block()
        for v in d["vars"]:
            if "parameter" in v:
                meta = v["parameter"]
                par = block.create_parameter(
                    v["name"], v["shape"], v["dtype"], _init.from_config(meta["initializer"]),
                    meta["trainable"], meta["learning_rate"], meta["is_sparse_table"])
                par._saved_optimizer = (None if meta.get("optimizer") is None
                                        else _opt.from_config(meta["optimizer"]))
            else:
                block.create_var(v["name"], v["shape"], v["dtype"], v["lod_level"],
                                 v["persistable"], v["stop_gradient"], v["is_data"])
        for op in d["ops"]:
            if op["type"] not in _known_op_types():
                raise ValueError(f"program description has unknown op type {op['type']!r}")
            block.append_op(op["type"],
                            {k: [block.var(n) for n in ns] for k, ns in op["inputs"].items()},
                            {k: [block.var(n) for n in ns] for k, ns in op["outputs"].items()},
                            op["attrs"])
        return p

    def __repr__(self):
        return "\n".join(repr(op) for op in self.global_block().ops)

    to_string = __repr__


PROGRAM_FORMAT = "pyfleet.fluid.program"
PROGRAM_FORMAT_VERSION = 1


def _known_op_types():
    from pyfleet.fluid import ops
    return set(ops.FORWARD) | {"lookup_table", "auc"}


_main_program = Program()
_startup_program = Program()


def default_main_program():
    return _main_program


def default_startup_program():
    return _startup_program


def switch_main_program(program):
    global _main_program
    prev, _main_program = _main_program, program
    return prev


def switch_startup_program(program):
    global _startup_program
    prev, _startup_program = _startup_program, program
    return prev


@contextlib.contextmanager
def program_guard(main_program, startup_program=None):
    """Make ``main_program`` (and ``startup_program``) the current programs."""
    if not isinstance(main_program, Program):
        raise ValueError(f"main_program must be a fluid.Program, got {main_program!r}")
    if startup_program is not None and not isinstance(startup_program, Program):
        raise ValueError(f"startup_program must be a fluid.Program, got {startup_program!r}")
    prev_main = switch_main_program(main_program)
    prev_startup = switch_startup_program(startup_program) if startup_program else None
    try:
        yield
    finally:
        switch_main_program(prev_main)
        if startup_program is not None:
            switch_startup_program(prev_startup)


class ParamAttr:
    """Fluid's ParamAttr: a parameter's name, initializer and learning-rate multiplier."""

    def __init__(self, name=None, initializer=None, learning_rate=1.0, regularizer=None,
                 trainable=True, gradient_clip=None, do_model_average=False):
        self.name = name
        self.initializer = initializer
        self.learning_rate = float(learning_rate)
        self.regularizer = regularizer
        self.trainable = bool(trainable)

    @staticmethod
    def _to_attr(arg):
        if arg is None:
            return ParamAttr()
        if isinstance(arg, ParamAttr):
            return arg
        if isinstance(arg, str):
            return ParamAttr(name=arg)
        if arg is False:
            return False
        from pyfleet.initializer import Initializer
        if isinstance(arg, Initializer):
            return ParamAttr(initializer=arg)
        raise ValueError(f"param_attr must be a ParamAttr, a name, an initializer, None "
                         f"or False; got {arg!r}")

    def __repr__(self):
        return (f"ParamAttr(name={self.name!r}, initializer={self.initializer!r}, "
                f"learning_rate={self.learning_rate})")


def create_parameter_in(main, startup, attr, shape, dtype, default_initializer,
                        default_prefix, is_sparse_table=False):
    """Create (or reuse, by name) a parameter in ``main`` and register its
    initialization in ``startup``."""
    name = attr.name or unique_name.generate(default_prefix)
    block = main.global_block()
    existed = name in block.vars
    init = attr.initializer if attr.initializer is not None else default_initializer
    if is_sparse_table:
        init = _sparse_initializer(init, shape)
    p = block.create_parameter(name, shape, dtype, init, attr.trainable, attr.learning_rate,
                               is_sparse_table)
    if not existed:
        if startup._main_of_startup is None:
            startup._main_of_startup = main
        startup._init_params.append(p)
        startup._plan_cache.clear()
    return p


def _sparse_initializer(init, shape):
    # A table row cannot see the vocabulary: Xavier is resolved to the uniform
    # bound Fluid would use for the declared [vocab, dim] parameter.
    from pyfleet import initializer as _init
    if isinstance(init, _init.Xavier):
        fan_in = init.fan_in or shape[0]
        fan_out = init.fan_out or shape[1]
        if init.uniform:
            limit = float(np.sqrt(6.0 / (fan_in + fan_out)))
            return _init.Uniform(-limit, limit)
        return _init.Normal(0.0, float(np.sqrt(2.0 / (fan_in + fan_out))))
    return init


def minimize(optimizer, loss, startup_program=None, parameter_list=None, no_grad_set=None):
    """Attach ``optimizer`` to the program of ``loss``: from now on running
    that program does forward, backward and the update.

    Returns ``(optimize_ops, params_grads)`` like Fluid: ``optimize_ops`` is an
    empty list (the update runs in the backend), ``params_grads`` a list of
    ``(Parameter, gradient Variable)`` pairs.
    """
    from pyfleet.optimizer import Optimizer
    if not isinstance(optimizer, Optimizer):
        raise ValueError(f"optimizer must be a pyfleet.optimizer rule, got {optimizer!r}")
    if not isinstance(loss, Variable):
        raise ValueError(f"loss must be a fluid Variable, got {loss!r}")
    if loss.shape is not None and int(np.prod([abs(s) for s in loss.shape])) != 1:
        raise ValueError(f"loss must be a scalar (shape [1]), got {loss.name} with shape "
                         f"{loss.shape}: reduce it with fluid.layers.mean")
    program = loss.block.program
    names = None
    if parameter_list is not None:
        names = {p.name if isinstance(p, Variable) else str(p) for p in parameter_list}
    if no_grad_set is not None:
        excluded = {p.name if isinstance(p, Variable) else str(p) for p in no_grad_set}
        base = names if names is not None else {p.name for p in program.all_parameters()}
        names = base - excluded
    program._optimizer = optimizer
    program._loss = loss
    program._trainable = names
    program._plan_cache.clear()
    block = program.global_block()
    params_grads = []
    for p in program.all_parameters():
        if not p.trainable or (names is not None and p.name not in names):
            continue
        gname = p.name + "@GRAD"
        g = block.vars.get(gname) or Variable(block, gname, p.shape, p.dtype)
        block.vars[gname] = g
        params_grads.append((p, g))
    return [], params_grads
