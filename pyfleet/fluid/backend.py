"""Where a program's parameters live: the seam between the executor and the tables.

The executor never owns a parameter. Every value it reads and every gradient
it produces goes through the :class:`Backend` set on the program
(``program._backend``), so one program trains in one process
(:class:`LocalBackend`, the default) or through parameter servers (a remote
backend over the network client, which implements the same methods).

Per training step the executor makes, in this order:

1. one :meth:`Backend.pull_sparse` per sparse table, with the *unique* ids of
   every embedding slot sharing that table (each once, in the order of its
   first occurrence), when the first embedding of that table runs;
2. one :meth:`Backend.pull_dense_many` with the names of every dense
   parameter the step reads, just before the first op that reads one (the
   embeddings before it run while a remote backend's reply travels);
3. (forward and backward in numpy);
4. one :meth:`Backend.push_dense_many` with a gradient per trained dense
   parameter;
5. one :meth:`Backend.push_sparse` per sparse table, with those unique ids and
   float32 gradients already summed per id;
6. :meth:`Backend.step_end`.

Ownership: the executor never modifies an array it passes to a push (keys,
gradients) afterwards, nor the keys it passes to a pull, so a backend may keep
them and send them later without a copy (the remote backend does); ids are
distinct within each call, so a backend may skip its own deduplication.

Gradients are those of the loss the optimizer minimizes (normally a mean over
the batch), exactly as Fluid computes them; the backend applies its optimizer.

Thread safety: the executor calls a backend from one thread at a time; a
backend shared by several executors in several threads must be thread-safe
itself (:class:`LocalBackend` is, because the tables are).
"""

import os

import numpy as np

from pyfleet import _atomic
from pyfleet.endpoint import check_file_name
from pyfleet.optimizer import SGD
from pyfleet.table import DenseTable, SparseTable

__all__ = ["Backend", "LocalBackend", "LocalSource", "param_path"]


def param_path(dirname, param):
    """The file of one parameter under ``dirname`` (``.npy`` dense, ``.table`` sparse)."""
    name = check_file_name(param.name, "parameter name")
    return os.path.join(dirname, name + (".table" if param.is_sparse_table else ".npy"))


def _old_name_hint(dirname, param):
    """Why a parameter may be missing from an older pyfleet checkpoint: pyfleet
    0.1 named an unnamed embedding's or create_parameter's parameter
    ``embedding_<k>`` where Fluid (and pyfleet now) names it ``embedding_<k>.w_0``."""
    base, dot, suffix = param.name.rpartition(".")
    if not dot or suffix not in ("w_0", "b_0"):
        return ""
    old = base.rsplit("_", 1)[0]
    if old not in ("embedding", "create_parameter"):
        return ""
    return (f" (checkpoints of pyfleet 0.1 name unnamed {old} parameters {old}_<k>, Fluid's "
            f"name is {param.name}: give the parameter a name with param_attr= in both the "
            f"saving and the loading program, or rename the file)")


def _placeholder_optimizer(param):
    opt = param.optimizer or getattr(param, "_saved_optimizer", None)
    return SGD(1.0) if opt is None else opt


def _file_rule(path):
    """The update rule whose state a table file of :meth:`SparseTable.save` holds
    (its header's optimizer kind), with default settings; None when unreadable.
    A program without an optimizer (inference) loads the weights of a checkpoint
    trained with any rule: its state rides along, unused."""
    from pyfleet import _core, optimizer
    try:
        with open(path, "rb") as f:
            header = f.read(24)
        kind = _core.OptimizerKind(int(np.frombuffer(header, "<u4", 1, 20)[0]))
    except (OSError, ValueError, IndexError):
        return None
    return {"SGD": lambda: SGD(1.0), "Adagrad": optimizer.Adagrad, "Adam": optimizer.Adam,
            "FTRL": optimizer.FTRL, "Momentum": lambda: optimizer.Momentum(0.0, 0.0),
            "RMSProp": lambda: optimizer.RMSProp(0.0)}[kind.name]()


class Backend:
    """Interface every parameter backend implements.

    ``name`` is the parameter's name in the program (for a sparse table, the
    ``param_attr`` name shared by the embeddings that use it). Keys are 1-D
    uint64 arrays; values and gradients float32.
    """

    def create_sparse(self, name, dim, optimizer, initializer, seed):
        """Create (or re-create, empty) the sparse table ``name``."""
        raise NotImplementedError

    def create_dense(self, name, initial_value, optimizer):
        """Create (or overwrite) dense parameter ``name`` with ``initial_value``."""
        raise NotImplementedError

    def pull_sparse(self, name, keys, create=True):
        """float32 ``[len(keys), dim]`` rows; missing keys get their initial row,
        and (``create=True``, a training step) a row of the table. The
        executor passes ``create=False`` for programs without an optimizer
        (``clone(for_test=True)``): evaluation does not grow the tables."""
        raise NotImplementedError

    def push_sparse(self, name, keys, grads):
        """Apply the table's optimizer with ``grads`` (float32 ``[len(keys), dim]``)."""
        raise NotImplementedError

    def pull_dense(self, name):
        """The current value of dense parameter ``name`` (a float32 array the caller owns)."""
        raise NotImplementedError

    def push_dense(self, name, grad):
        """Apply the parameter's optimizer with ``grad`` (float32, the parameter's shape)."""
        raise NotImplementedError

    def pull_dense_many(self, names):
        """``{name: value}`` for every name; override to make one round trip."""
        return {n: self.pull_dense(n) for n in names}

    def push_dense_many(self, grads):
        """Push every ``{name: grad}``; override to make one round trip."""
        for n, g in grads.items():
            self.push_dense(n, g)

    def set_dense(self, name, value):
        """Overwrite a dense parameter's value (used by loaders, and for the
        statistics of batch_norm/data_norm on a backend whose class declares
        ``keeps_op_statistics = True``); optional."""
        raise NotImplementedError(f"{type(self).__name__} cannot set parameter {name!r}")

    def step_end(self):
        """End of one training step (called after the pushes of every training
        step, never after a forward-only run): a sync barrier for remote backends."""

    def save(self, dirname, params):
        """Write each of ``params`` (:class:`~pyfleet.fluid.framework.Parameter`)
        under ``dirname``: ``<name>.npy`` for dense, ``<name>.table`` for sparse.
        True when the program's persistable scope state (auc counters) was
        written with them (a Fleet checkpoint), so the caller does not again."""
        raise NotImplementedError(f"{type(self).__name__} cannot save parameters")

    def save_dir(self, dirname):
        """The directory :meth:`save` writes for ``dirname``, where fluid.io puts
        the program's local state (auc counters) beside the parameters: a
        relative ``dirname`` is relative to the working directory here, to the
        checkpoint root for a Fleet worker's program (where its servers write)."""
        return dirname

    def load(self, dirname, params):
        """Read what :meth:`save` wrote, creating missing parameters."""
        raise NotImplementedError(f"{type(self).__name__} cannot load parameters")

    def inference_source(self):
        """The parameters as a source for :func:`pyfleet.fluid.inference.save`
        (what ``fluid.io.save_inference_model`` writes); a backend whose
        parameters live elsewhere raises, naming how to save them."""
        raise NotImplementedError(f"{type(self).__name__} cannot save an inference model")


class LocalBackend(Backend):
    """Parameters held in this process by :class:`pyfleet.SparseTable` and
    :class:`pyfleet.DenseTable`. Thread-safe (the tables are)."""

    # batch_norm's moving statistics and data_norm's summaries are set by the
    # executor after each step (set_dense). Only a class that declares this
    # itself keeps them: a subclass that moves parameters elsewhere (where
    # each process would keep its own copy) must decide for itself.
    keeps_op_statistics = True

    def __init__(self):
        self.sparse = {}
        self.dense = {}

    def create_sparse(self, name, dim, optimizer, initializer, seed):
        self.sparse[name] = SparseTable(dim, optimizer, initializer=initializer, seed=seed,
                                        name=name)

    def create_dense(self, name, initial_value, optimizer):
        initial_value = np.asarray(initial_value, dtype=np.float32)
        self.dense[name] = DenseTable(initial_value.shape, optimizer, initial=initial_value,
                                      name=name)

    def _sparse(self, name):
        try:
            return self.sparse[name]
        except KeyError:
            raise ValueError(f"sparse table {name!r} does not exist: run the startup "
                             "program before the main program") from None

    def _dense(self, name):
        try:
            return self.dense[name]
        except KeyError:
            raise ValueError(f"parameter {name!r} does not exist: run the startup "
                             "program before the main program") from None

    def pull_sparse(self, name, keys, create=True):
        return self._sparse(name).pull(keys, create=create)

    def push_sparse(self, name, keys, grads):
        try:
            self._sparse(name).push(keys, grads)
        except ValueError as e:
            raise ValueError(f"sparse table {name!r}: {e}") from None

    def pull_dense(self, name):
        return self._dense(name).pull()

    def push_dense(self, name, grad):
        try:
            self._dense(name).push(grad)
        except ValueError as e:
            raise ValueError(f"parameter {name!r}: {e}") from None

    def set_dense(self, name, value):
        self._dense(name).set(value)

    def inference_source(self):
        return LocalSource(self)

    def save(self, dirname, params):
        os.makedirs(dirname, exist_ok=True)
        for p in params:
            path = param_path(dirname, p)
            if p.is_sparse_table:
                self._sparse(p.name).save(path)
            else:
                _atomic.save_npy(path, self._dense(p.name).pull())

    def load(self, dirname, params):
        """Dense values replace the parameter (its optimizer state restarts);
        a sparse table is replaced by the file's rows, with their optimizer
        state. A parameter not yet created is created with its recorded optimizer."""
        for p in params:
            path = param_path(dirname, p)
            if not os.path.exists(path):
                raise ValueError(f"no saved value for parameter {p.name!r}: {path} is missing"
                                 f"{_old_name_hint(dirname, p)}")
            if p.is_sparse_table:
                # A checkpoint replaces the whole table, as Fluid's load does:
                # rows trained since must not survive beside the loaded ones.
                old = self.sparse.get(p.name)
                if p.optimizer is None and not getattr(p, "_saved_optimizer", None):
                    rule = _file_rule(path) or _placeholder_optimizer(p)   # inference
                    self.create_sparse(p.name, p.dim, rule, p.initializer, p.seed)
                elif old is None:
                    self.create_sparse(p.name, p.dim, _placeholder_optimizer(p), p.initializer,
                                       p.seed)
                else:
                    self.create_sparse(p.name, old.dim, old.optimizer, old.initializer,
                                       old.seed)
                self.sparse[p.name].load(path)
                continue
            value = np.load(path, allow_pickle=False)
            if tuple(value.shape) != tuple(p.shape):
                raise ValueError(f"{path} holds shape {value.shape}, parameter {p.name!r} "
                                 f"has shape {p.shape}")
            if p.name in self.dense:
                self.dense[p.name].set(value)
            else:
                self.create_dense(p.name, value, _placeholder_optimizer(p))


class LocalSource:
    """The parameters of a :class:`LocalBackend` as a source for
    :func:`pyfleet.fluid.inference.save`: dense values, each sparse table's
    config, and its rows in pages of ``page_rows`` (optimizer state dropped)."""

    def __init__(self, backend, page_rows=65536):
        if not hasattr(backend, "sparse") or not hasattr(backend, "dense"):
            raise ValueError(f"LocalSource needs a LocalBackend, got {backend!r}")
        self.backend = backend
        self.page_rows = int(page_rows)

    def dense(self, name):
        return self.backend.pull_dense(name)

    def sparse_config(self, param):
        t = self.backend._sparse(param.name)
        return {"dim": t.dim, "initializer": t.initializer.to_config(), "seed": t.seed,
                "storage": t.storage}

    def sparse_pages(self, name):
        t = self.backend._sparse(name)
        keys = t.keys()
        for a in range(0, keys.shape[0], self.page_rows):
            rows = t.export(keys[a:a + self.page_rows])
            yield rows["keys"], rows["weights"]
