"""``fluid.executor.FetchHandler`` (Fluid 1.7): values handed to a callback
every ``period_secs`` while ``Executor.train_from_dataset`` runs.

Fluid reads the handler's variables from the worker's scope in a monitor
thread. Here they are fetched with every batch (so any variable of the
program can be watched, the last batch's value) and the handler is called in
the training thread between batches, once ``period_secs`` have passed since
the previous call (or the start): a slow handler delays training instead of
racing it. As in Fluid, a pass shorter than ``period_secs`` calls it never.
"""

import sys
import time

import numpy as np

from pyfleet.fluid.framework import Variable

__all__ = ["FetchHandler", "FetchMonitor"]


class FetchHandler:
    """``FetchHandler(var_dict, period_secs=60)``: ``var_dict`` maps a key of
    the caller's choice to a Variable (or its name); subclass and override
    :meth:`handler`, which receives ``{key: numpy array}``."""

    def __init__(self, var_dict=None, period_secs=60):
        if not isinstance(var_dict, dict) or not var_dict:
            raise ValueError("FetchHandler needs var_dict, a dict of key -> Variable")
        period = float(period_secs)
        if not period > 0:
            raise ValueError(f"FetchHandler: period_secs must be positive, got {period_secs!r}")
        self.var_dict = var_dict
        self.period_secs = period

    def handler(self, res_dict):
        """Fluid's default: print the first value of each array."""
        for key, value in res_dict.items():
            if isinstance(value, np.ndarray):
                sys.stdout.write(f"{key}[0]: {value.reshape(-1)[0]} ")
        sys.stdout.write("\n")
        sys.stdout.flush()

    @staticmethod
    def help():
        print("class FetchHandlerExample(FetchHandler):\n"
              "    def handler(self, res_dict):\n"
              "        print(res_dict['auc'])\n"
              "FetchHandlerExample(var_dict={'auc': auc_var}, period_secs=30)")


class FetchMonitor:
    """The executor's side of a :class:`FetchHandler` for one dataset pass."""

    def __init__(self, fetch_handler, program):
        if not isinstance(fetch_handler, FetchHandler):
            raise TypeError(f"fetch_handler must be a fluid.executor.FetchHandler, got "
                             f"{fetch_handler!r}")
        block = program.global_block()
        self.handler = fetch_handler
        self.keys = list(fetch_handler.var_dict)
        self.fetch_vars = []
        for key in self.keys:
            v = fetch_handler.var_dict[key]
            name = v.name if isinstance(v, Variable) else str(v)
            if name not in block.vars:
                raise ValueError(f"FetchHandler key {key!r}: {name!r} is not a variable of "
                                 "the program being run")
            self.fetch_vars.append(block.vars[name])
        self._last = time.monotonic()

    def step(self, values):
        """After one batch with the watched variables' ``values``."""
        now = time.monotonic()
        if now - self._last >= self.handler.period_secs:
            self._last = now
            self.handler.handler(dict(zip(self.keys, values)))
