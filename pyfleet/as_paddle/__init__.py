"""Zero-edit mode: ``paddle`` resolves to pyfleet, in this process and every
Python process it starts.

Fleet-era code imports ``paddle``: ``import paddle.fluid as fluid``, ``from
paddle import fluid``, ``from paddle.fluid.incubate.fleet.parameter_server.
distribute_transpiler import fleet``, ``paddle.dataset``, ``paddle.reader``.
Under this mode every such name is pyfleet's module of the same path
(``paddle.fluid`` *is* ``pyfleet.fluid``, the same object), so the code runs
with no edit at all.

How it is switched on, opt-in only (``pip install .`` installs nothing named
``paddle``):

- ``pyfleet run script.py args...`` / ``pyfleet run -m module args...`` and
  ``python -m pyfleet.launch --paddle ...`` put :data:`SHIM_DIR` first on
  ``PYTHONPATH``. That directory holds one package, ``paddle``, whose import
  calls :func:`activate`. Every interpreter started from there inherits the
  variable (PaddleRec's ``local_cluster`` engine starts its roles as new
  interpreters), so the rule holds in all of them.
- :func:`activate` (from Python) installs the import hook in this process only.

Under this mode ``fleet.stop_worker()`` follows Fluid's lifecycle: the worker may
call ``init_worker()`` and train again while its process lives, and the servers
serve until then (:mod:`pyfleet.distributed.worker_return`).

Which ``paddle`` wins: under this mode, pyfleet, always (the shim directory
comes before site-packages and before any other ``PYTHONPATH`` entry, and the
hook sits first in ``sys.meta_path``); outside it, whatever ``import paddle``
finds, pyfleet never interferes. :func:`real_paddle` says where a real one is.

Fluid's ``paddle.fluid.layers.<module>`` paths (``layers.nn``, ``layers.tensor``,
``layers.control_flow``, ...) are one namespace in pyfleet: each is a module
reading ``pyfleet.fluid.layers``'s names (then ``pyfleet.fluid.framework``'s:
Fluid's ``layers.tensor`` re-exports ``Variable``). A path pyfleet does not have is a
``ModuleNotFoundError`` naming both the ``paddle`` path and the pyfleet module
it looked for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

__all__ = ["ENV_FLAG", "SHIM_DIR", "PaddleAliasFinder", "activate", "active", "child_env",
           "real_paddle"]

SHIM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim")
#: Set to "1" in the environment of zero-edit processes (informational: the
#: shim directory on PYTHONPATH is what switches the mode on).
ENV_FLAG = "PYFLEET_AS_PADDLE"

# Fluid packages whose sub-modules pyfleet keeps in one module: a path under
# one of them that pyfleet lacks resolves to the module itself.
_FLAT = ("fluid.layers",)
# Their sub-modules in Fluid 1.8 (each also an attribute of the package there).
_FLAT_SUBMODULES = {"fluid.layers": (
    "collective", "control_flow", "detection", "device", "distributions", "io",
    "layer_function_generator", "learning_rate_scheduler", "loss", "math_op_patch",
    "metric_op", "nn", "ops", "rnn", "sequence_lod", "tensor", "utils")}


class _AliasLoader(importlib.abc.Loader):
    """Hands out pyfleet's module (already imported) as the ``paddle`` module; for a
    Fluid sub-module pyfleet keeps flat, a module reading that flat module's names
    (then ``pyfleet.fluid.framework``'s, as Fluid's ``layers.tensor`` re-exports
    ``Variable``)."""

    def __init__(self, alias, target, flat=False):
        self.alias = alias
        self.target = target
        self.flat = flat

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        if not self.flat:
            return module
        view = types.ModuleType(spec.name, f"Fluid's {spec.name}: names of {self.target}")
        sources = (module, importlib.import_module("pyfleet.fluid.framework"))

        def __getattr__(name):
            for source in sources:
                if hasattr(source, name):
                    return getattr(source, name)
            raise AttributeError(f"module {spec.name!r} (pyfleet's {self.target} in "
                                 f"zero-edit mode) has no attribute {name!r}")
        view.__getattr__ = __getattr__
        view.__dir__ = lambda: sorted(set(dir(sources[0])))
        return view

    def exec_module(self, module):
        # pyfleet's module is already executed. A flat one stands for a Fluid package
        # whose sub-modules Fluid code also reaches as attributes (fluid.layers.nn.topk):
        # they are made here, as importing that package made them in Fluid.
        if self.flat:
            return
        rest = self.alias[len("paddle."):]
        for flat in _FLAT:
            if flat.rpartition(".")[0] == rest:       # paddle.fluid: paddle.fluid.layers
                importlib.import_module(f"paddle.{flat}")
        for sub in _FLAT_SUBMODULES.get(rest, ()):    # paddle.fluid.layers: its .nn, ...
            importlib.import_module(f"{self.alias}.{sub}")


class PaddleAliasFinder(importlib.abc.MetaPathFinder):
    """``paddle`` → ``pyfleet``, ``paddle.X.Y`` → ``pyfleet.X.Y`` (see the module doc)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "paddle" and not fullname.startswith("paddle."):
            return None
        rest = fullname[len("paddle"):]
        name = "pyfleet" + rest
        found = _exists(name)
        if not found:   # a module the parent re-exports (pyfleet.fluid.initializer)
            name = _reexported(name) or name
            found = name != "pyfleet" + rest
        flat = None
        if not found:
            flat = next((f for f in _FLAT if rest.startswith("." + f + ".")), None)
            if flat is None:
                raise ModuleNotFoundError(
                    f"No module named {fullname!r}: in zero-edit mode paddle is pyfleet, "
                    f"and pyfleet has no {name!r}", name=fullname)
            name = "pyfleet." + flat
        is_package = rest[1:] in _FLAT or (found and _is_package(name))
        return importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(fullname, name, flat=flat is not None), is_package=is_package)


def _exists(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:   # a parent is missing, or is not a package
        return False


def _reexported(name):
    """The real name of module ``name`` when its parent package holds it as an
    attribute without it being a sub-module (``pyfleet.fluid.initializer`` is
    ``pyfleet.initializer``), else None."""
    parent, _, child = name.rpartition(".")
    try:
        value = getattr(importlib.import_module(parent), child, None)
    except ImportError:
        return None
    return value.__name__ if isinstance(value, types.ModuleType) else None


def _is_package(name):
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.submodule_search_locations is not None


_FINDER = PaddleAliasFinder()


def active() -> bool:
    """True when ``paddle`` resolves to pyfleet in this process."""
    return _FINDER in sys.meta_path


def activate():
    """Make ``paddle`` (and every ``paddle.*``) resolve to pyfleet in this process.
    Idempotent. Modules a real ``paddle`` already loaded here are not touched:
    call it before anything imports ``paddle``."""
    # The package itself, as every alias here is: by name (this module sits below it).
    pyfleet = importlib.import_module("pyfleet")
    if not active():
        sys.meta_path.insert(0, _FINDER)
    current = sys.modules.get("paddle")
    if current is not pyfleet:
        origin = getattr(current, "__file__", None) or ""
        if current is not None and not origin.startswith(SHIM_DIR):
            raise ImportError(f"a real paddle ({origin or current!r}) is imported already in "
                              f"this process: activate zero-edit mode before importing it")
        sys.modules["paddle"] = pyfleet
    # Fluid's trainer lifecycle: a worker that stopped may start again while its
    # process lives (its pservers served until killed).
    importlib.import_module("pyfleet.distributed.worker_return").fluid_lifecycle()


def child_env(env=None) -> dict:
    """A copy of ``env`` (default ``os.environ``) under which every Python process
    started resolves ``paddle`` to pyfleet: :data:`SHIM_DIR` first on PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != SHIM_DIR]
    env["PYTHONPATH"] = os.pathsep.join([SHIM_DIR, *parts])
    env[ENV_FLAG] = "1"
    return env


def real_paddle(search_path=None) -> str | None:
    """Where a real ``paddle`` would be imported from (outside zero-edit mode) on
    ``search_path`` (default ``sys.path``), or None."""
    paths = [p for p in (sys.path if search_path is None else search_path)
             if os.path.abspath(p or os.curdir) != SHIM_DIR]
    spec = importlib.machinery.PathFinder.find_spec("paddle", paths)
    if spec is None:
        return None
    return spec.origin if spec.origin not in (None, "namespace") else \
        next(iter(spec.submodule_search_locations or []), None)
