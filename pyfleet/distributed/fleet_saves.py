"""The arguments of Fleet's saves, checked as Fluid checks them, and where a delta save
continues its chain: what ``fleet.save_persistables`` and ``save_inference_model``
decide before any server writes."""

import json

from pyfleet.fluid.compiler import CompiledProgram
from pyfleet.fluid.executor import Executor
from pyfleet.fluid.parallel_executor import ParallelExecutor
from pyfleet.service import checkpoint as _checkpoint

__all__ = ["check_executor", "checked_meta", "delta_base"]


def check_executor(executor, main_program, what):
    """Fluid's checks of a Fleet save's arguments: an Executor (pyfleet's saves also
    run without one), never a ParallelExecutor; a Program, never a CompiledProgram."""
    if isinstance(executor, ParallelExecutor):
        raise TypeError(f"in fleet.{what}() function, executor must be as Executor type, "
                        f"ParallelExecutor is not allowed")
    if executor is not None and not isinstance(executor, Executor):
        raise TypeError(f"in fleet.{what}() function, executor must be as Executor type, "
                        f"got {executor!r}")
    if isinstance(main_program, CompiledProgram):
        raise TypeError(f"in fleet.{what}() function, main_program must be as Program type, "
                        f"CompiledProgram is not allowed")


def checked_meta(meta):
    """A save's ``meta`` (the caller's JSON object, kept as the manifest's "meta") as
    JSON would give it back; ValueError when it is not one."""
    if meta is None:
        return None
    if not isinstance(meta, dict):
        raise ValueError(f"meta must be a dict (a JSON object), got {type(meta).__name__}")
    try:
        return json.loads(json.dumps(meta, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ValueError(f"meta must be JSON-serializable: {e}") from None


def delta_base(mode, last_save, path):
    """``(mode, previous manifest, parent id)`` of a save of ``mode`` into ``path``
    after this process's last committed save ``last_save`` (``(dir, id)`` or None): a
    delta without a committed previous save, or whose directory's manifest is no
    longer that save's, is written as a full save."""
    if mode != "delta":
        return mode, None, None
    if last_save is None:
        return "full", None, None
    last_dir, last_id = last_save
    if last_dir != path:
        return "delta", None, last_id   # a chain of its own, loaded after its base
    previous = _checkpoint.read_manifest(path)
    if previous is None or previous["id"] != last_id:
        return "full", None, None
    return "delta", previous, last_id
