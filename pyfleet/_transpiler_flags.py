"""Fluid 1.8's mode flags of ``DistributeTranspilerConfig``: ``half_async`` and
``completely_not_async`` (bools, default False).

Fluid 1.8 trains every parameter-server mode through its communicator and
spells the mode with flags: with ``sync_mode`` False (and not geo), both True
is its sync (what ``StrategyFactory.create_sync_strategy()`` sets), so ``mode``
reads ``"sync"`` while ``sync_mode`` keeps Fluid's reading, False;
``half_async`` alone is its half-async, refused when the config is used
(:meth:`Fluid18Flags.check_supported`). Setting ``mode``, or ``sync_mode =
True``, clears both (pyfleet's explicit choice wins).
"""

from pyfleet.errors import ConfigError

FLUID18_FLAGS = ("half_async", "completely_not_async")


class Fluid18Flags:
    """Mixed into :class:`pyfleet.config.DistributeTranspilerConfig`."""

    def _fluid18(self, stored):
        """``stored`` (a stored mode) as Fluid 1.8's flags read it."""
        if stored == "async" and self.half_async and self.completely_not_async:
            return "sync"
        return stored

    def _clear_fluid18(self):
        for flag in FLUID18_FLAGS:
            object.__setattr__(self, flag, False)

    def check_supported(self):
        """ConfigError when the flags ask for Fluid 1.8's half-async mode."""
        stored = self._sparse_mode if self._mode == "hybrid" else self._mode
        if stored == "async" and self.half_async and not self.completely_not_async:
            raise ConfigError("half_async = True (Fluid's half-async mode: pushes without "
                              "waiting, merged gradients applied at barriers) has no pyfleet "
                              "equivalent; train sync (sync_mode = True) or async")

    # Fluid's setters refuse sync_mode and runtime_split_send_recv both True, from
    # either side (Paddle's test_fleet_api_input checks it).
    @property
    def runtime_split_send_recv(self):
        return self._split

    @runtime_split_send_recv.setter
    def runtime_split_send_recv(self, value):
        if not isinstance(value, (bool, int)) or value not in (0, 1):
            raise ConfigError(f"runtime_split_send_recv must be True or False, got {value!r}")
        if value and self.sync_mode:
            raise ConfigError("runtime_split_send_recv = True needs sync_mode = False first")
        object.__setattr__(self, "_split", bool(value))

    def _refuse_sync_with_split(self):
        if getattr(self, "_split", False):
            raise ConfigError("sync_mode = True needs runtime_split_send_recv = False first")

    def _restore_split(self, value):
        """A saved config's flag, as saved: a Fluid 1.8 sync strategy's config reads
        mode "sync" with the flag set (its sync_mode is False; to_dict keeps the mode)."""
        if value is not None:
            if not isinstance(value, (bool, int)) or value not in (0, 1):
                raise ConfigError(f"runtime_split_send_recv must be True or False, got {value!r}")
            object.__setattr__(self, "_split", bool(value))
