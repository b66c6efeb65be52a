"""Programs, variables and parameters: the static graph of ``pyfleet.fluid``.

As in PaddlePaddle Fluid 1.5, layer functions append operators to the current
*main program* and parameter initializers to the current *startup program*
(:func:`program_guard` changes both). Nothing is computed while a network is
built; :class:`pyfleet.fluid.Executor` runs programs.

Differences from Fluid, by design:

- Parameters live in a backend (``program.backend``, see
  :mod:`pyfleet.fluid.backend`), not in a scope; a program's clones share it.
- Initialization is deterministic: every parameter's seed is derived from the
  program's ``random_seed`` and the parameter's name (Fluid's
  ``random_seed = 0`` means "random"; here it is just seed 0).
- An embedding whose ``is_distributed=True`` or whose vocabulary is at least
  :data:`SPARSE_TABLE_MIN_VOCAB` rows is a *sparse table* keyed by the raw
  uint64 id (ids are not bounded by the vocabulary).

Runtime values (``LoDTensor``, ``Scope``, places) live in
:mod:`pyfleet.fluid.tensor`, ``ParamAttr`` in :mod:`pyfleet.fluid.param_attr`;
both are re-exported here under their Fluid paths.

Programs are not thread-safe while they are being built; a built program may
be run by several executors.
"""
import contextlib
import copy
import zlib

import numpy as np

from pyfleet import optimizer as _opt
from pyfleet.fluid import fluid_model, program_desc, unique_name
from pyfleet.fluid.backend import LocalBackend
from pyfleet.fluid.optimizer import check_minimize, minimize
from pyfleet.fluid.param_attr import ParamAttr, create_parameter_in
from pyfleet.fluid.tensor import (
    CPUPlace,
    CUDAPlace,
    LoDTensor,
    Scope,
    convert_dtype,
    create_lod_tensor,
    global_scope,
    scope_guard,
)

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
    "check_variable",
    "convert_dtype",
    "create_lod_tensor",
    "create_parameter_in",
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

SPARSE_TABLE_MIN_VOCAB = 100_000

@contextlib.contextmanager
def name_scope(prefix=None):
    """Accepted for compatibility; names are not prefixed."""
    yield



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

    # Fluid's arithmetic (var + var, var * 2.0, ...): as Fluid's math_op_patch,
    # each operator appends its op to the current main program itself.
    def _binary(self, other, op, reverse=False):
        if not isinstance(other, Variable):
            other = float(other)
            if op == "elementwise_add":
                return self._scale(1.0, other)
            if op == "elementwise_sub":
                return self._scale(-1.0, other) if reverse else self._scale(1.0, -other)
            if op == "elementwise_mul":
                return self._scale(other)
            if op == "elementwise_div" and not reverse:
                return self._scale(1.0 / other)
            other = _fill_constant(self.dtype.name, other)
        x, y = (other, self) if reverse else (self, other)
        check_variable(x, f"{op} x")
        check_variable(y, f"{op} y")
        shape = x.shape if len(x.shape) >= len(y.shape) else y.shape
        return _append_math(op, {"X": [x], "Y": [y]}, shape, x.dtype, {"axis": -1})

    def _scale(self, scale, bias=0.0):
        """What ``fluid.layers.scale(self, scale, bias)`` appends."""
        check_variable(self, "scale input")
        return _append_math("scale", {"X": [self]}, self.shape, self.dtype,
                            {"scale": float(scale), "bias": float(bias),
                             "bias_after_scale": True})

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
        return self._scale(-1.0)


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
        self.regularizer = None          # fluid.regularizer rule (ParamAttr's)
        self.gradient_clip_attr = None   # fluid.clip rule (ParamAttr's, set_gradient_clip)

    @property
    def seed(self):
        rs = int(self.block.program.random_seed) & 0xFFFFFFFF
        return (rs << 32) | zlib.crc32(self.name.encode())

    @property
    def optimizer(self):
        opt = self.block.program._optimizer
        if opt is None:
            return None
        from pyfleet.fluid.optimizer import lazy_row_width
        lazy = lazy_row_width(self, opt)
        if self.learning_rate == 1.0 and not lazy:
            return opt
        cfg = opt.to_config()
        cfg["learning_rate"] = cfg["learning_rate"] * self.learning_rate
        if lazy:
            cfg["lazy_row_width"] = lazy
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
    """The (single) block of a program: its variables and operators in order (Fluid's ``Block``)."""

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

    Attributes: ``random_seed`` (parameter initialization), ``backend`` (see
    :mod:`pyfleet.fluid.backend`; :meth:`set_backend` before running the
    startup program to train through another backend; unset, a
    :class:`LocalBackend` is made on first use and shared with clones).
    ``_backend`` is the backend set on this program itself (None: resolved
    through its origin); assigning it is the same as :meth:`set_backend`.
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
        self._for_test = False         # clone(for_test=True): dropout/batch_norm test mode

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

    @property
    def backend(self):
        """The backend holding this program's parameters: the one set on it,
        else its origin's (a clone's program, a startup's main program), else
        a :class:`LocalBackend` made now."""
        if self._backend is not None:
            return self._backend
        if self._backend_parent is not None:
            return self._backend_parent.backend
        if self._main_of_startup is not None:
            return self._main_of_startup.backend
        self._backend = LocalBackend()
        return self._backend

    def set_backend(self, backend):
        """Train and evaluate this program (and clones made from it) through
        ``backend``; None resolves it through the program's origin again."""
        self._backend = backend

    def _get_backend(self):
        """The old spelling of :attr:`backend`."""
        return self.backend

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
            p._for_test = True
            p._optimizer = None
            p._loss = None
        return p

    def attach_optimizer(self, optimizer, loss, parameter_list=None, no_grad_set=None):
        """Fluid's ``optimizer.minimize(loss)``, done: from now on running this
        program (the program of ``loss``) does forward, backward and the
        update with ``optimizer``'s rule. ``parameter_list`` limits, and
        ``no_grad_set`` excludes, the parameters trained.

        Returns ``(optimize_ops, params_grads)`` like Fluid: ``optimize_ops`` is
        an empty list (the update runs in the backend), ``params_grads`` a list
        of ``(Parameter, gradient Variable)`` pairs.
        """
        if not isinstance(loss, Variable):
            raise ValueError(f"loss must be a fluid Variable, got {loss!r}")
        names = check_minimize(self, optimizer, loss, parameter_list, no_grad_set)
        self._optimizer = optimizer
        self._loss = loss
        self._trainable = names
        self._plan_cache.clear()
        block = self.global_block()
        params_grads = []
        for p in self.all_parameters():
            if not p.trainable or (names is not None and p.name not in names):
                continue
            gname = p.name + "@GRAD"
            g = block.vars.get(gname) or Variable(block, gname, p.shape, p.dtype)
            block.vars[gname] = g
            params_grads.append((p, g))
        return [], params_grads

    def to_dict(self, ops=None):
        """A JSON-friendly description of the program (or of the subset ``ops``
        and the variables they use); see :mod:`pyfleet.fluid.program_desc`."""
        return program_desc.to_dict(self, ops)

    @classmethod
    def from_dict(cls, d):
        """Rebuild a program from :meth:`to_dict` output (no optimizer attached;
        parameters keep their recorded optimizer in ``_saved_optimizer``)."""
        return program_desc.from_dict(d, cls)

    @classmethod
    def parse_from_string(cls, binary_str):
        """Fluid's: the program of ProgramDesc bytes (see :func:`fluid_model.parse`)."""
        return fluid_model.parse(binary_str, cls)

    def __repr__(self):
        return "\n".join(repr(op) for op in self.global_block().ops)

    to_string = __repr__


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


def check_variable(x, what):
    """``x``, if it is a Variable of the current main program (layers append
    their ops there); ValueError naming ``what`` otherwise."""
    if not isinstance(x, Variable):
        raise ValueError(f"{what} must be a fluid Variable, got {type(x).__name__}")
    if x.block.program is not _main_program:
        raise ValueError(f"{what} ({x.name}) belongs to another program than the current "
                         "main program: build the whole network under one program_guard")
    return x


def _append_math(type, inputs, shape, dtype, attrs):
    """Append one op of Variable arithmetic (output ``Out``) to the current main program."""
    block = _main_program.global_block()
    out = block.create_var(unique_name.generate("tmp"), shape, dtype)   # Fluid's math_op_patch
    block.append_op(type, inputs, {"Out": [out]}, attrs)
    return out


def _fill_constant(dtype, value):
    """What ``fluid.layers.fill_constant([1], dtype, value)`` appends."""
    block = _main_program.global_block()
    out = block.create_var(unique_name.generate("tmp"), (1,), dtype)
    out.stop_gradient = True
    block.append_op("fill_constant", {}, {"Out": [out]},
                    {"shape": [1], "dtype": convert_dtype(dtype).str, "value": float(value)})
    return out
