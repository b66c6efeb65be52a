"""Fluid's parameter-server dispatchers (``fluid.transpiler.ps_dispatcher``): which server
a dense block goes to, :class:`RoundRobin` or :class:`HashName`, and the stable hash and
block names they agree on across processes.

:class:`RoundRobin` counts over all blocks of all parameters; :class:`HashName` takes a
stable 64-bit FNV-1a hash of the block's name modulo the number of servers (never
Python's salted ``hash()``, so every process agrees). ``pyfleet.config`` re-exports
them (``config.split_method``), and :func:`pyfleet.config.place_dense` uses them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["HashName", "PSDispatcher", "RoundRobin", "block_name", "stable_hash"]

_FNV64_OFFSET = 0xCBF29CE484222325
_FNV64_PRIME = 0x100000001B3
_MASK64 = 0xFFFFFFFFFFFFFFFF


def stable_hash(name: str) -> int:
    """Return the 64-bit FNV-1a hash of ``name`` encoded as UTF-8.

    The same on every process, platform and Python version (unlike ``hash()``), so it can
    decide placement that several processes must agree on.
    """
    if not isinstance(name, str):
        raise TypeError(f"stable_hash expects a str, got {type(name).__name__}")
    h = _FNV64_OFFSET
    for byte in name.encode("utf-8"):
        h = ((h ^ byte) * _FNV64_PRIME) & _MASK64
    return h


def block_name(name: str, i: int) -> str:
    """Fluid's name for block ``i`` of parameter ``name``: ``"<name>.block<i>"``."""
    return f"{name}.block{i}"


class PSDispatcher:
    """Base of the dense-block dispatchers, with Fluid's interface.

    ``PSDispatcher(endpoints).dispatch(names)`` returns the endpoint chosen for each name, in
    order; ``reset()`` restarts any internal counter. Subclasses define :meth:`server_of`.
    A dispatcher object carries state (RoundRobin's counter) and is not thread-safe.
    """

    def __init__(self, pserver_endpoints: Sequence[str]):
        if isinstance(pserver_endpoints, str) or not isinstance(pserver_endpoints, Sequence):
            raise ValueError("pserver_endpoints must be a list of 'host:port' strings, "
                             f"got {pserver_endpoints!r}")
        if len(pserver_endpoints) == 0:
            raise ValueError("pserver_endpoints must not be empty")
        self._eps = list(pserver_endpoints)
        self.reset()

    @property
    def eps(self) -> list[str]:
        """The endpoints blocks are dispatched to (a copy)."""
        return list(self._eps)

    def reset(self) -> None:
        """Restart the dispatch sequence (no effect for stateless dispatchers)."""

    def server_of(self, name: str) -> int:
        """Return the index of the endpoint that the next block, named ``name``, goes to."""
        raise NotImplementedError

    def dispatch(self, varlist: Iterable) -> list[str]:
        """Return one endpoint per entry of ``varlist`` (names, or objects with ``.name``)."""
        out = []
        for var in varlist:
            name = var if isinstance(var, str) else getattr(var, "name", None)
            if callable(name):
                name = name()
            if not isinstance(name, str):
                raise ValueError(f"cannot dispatch {var!r}: expected a name or an object "
                                 "with a .name")
            out.append(self._eps[self.server_of(name)])
        return out


class RoundRobin(PSDispatcher):
    """Send blocks to servers in turn: block ``k`` (counted since ``reset()``) -> ``k % n``."""

    def reset(self) -> None:
        self._step = 0

    def server_of(self, name: str) -> int:
        index = self._step % len(self._eps)
        self._step += 1
        return index


class HashName(PSDispatcher):
    """Send a block to server ``stable_hash(block name) % n``: independent of order."""

    def server_of(self, name: str) -> int:
        return stable_hash(name) % len(self._eps)
