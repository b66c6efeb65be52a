"""Fluid's ``paddle.fluid.layer_helper.LayerHelper``: what code outside Fluid (such
as PaddleRec's metric classes) builds layers with.

- ``create_or_get_global_variable(name, persistable=False, dtype=, shape=)``: a
  variable of the main program's global block, ``(var, created)``;
- ``set_variable_initializer(var, initializer)``: the startup program sets it
  (a ``Constant``; another initializer is refused, naming it);
- ``append_op(type=, inputs=, outputs=, attrs=)``: an operator of the main program,
  run by pyfleet's kernel of that Fluid operator (one pyfleet has no kernel for is
  refused here, naming it). An operator writing a persistable variable the startup
  program initialized updates it from run to run (the counters PaddleRec's metrics
  keep);
- ``create_variable_for_type_inference(dtype)``, ``create_variable(...)``,
  ``main_program``, ``startup_program``, ``name``, ``kwargs``.
"""

import numpy as np

from pyfleet import initializer as _initializer
from pyfleet.fluid import framework, ops, unique_name
from pyfleet.fluid.tensor import convert_dtype

__all__ = ["LayerHelper"]


class LayerHelper:
    def __init__(self, layer_type, **kwargs):
        self.kwargs = kwargs
        self.layer_type = layer_type
        self.name = unique_name.layer(layer_type, kwargs.get("name"))

    @property
    def main_program(self):
        return framework.default_main_program()

    @property
    def startup_program(self):
        return framework.default_startup_program()

    def _block(self):
        return self.main_program.global_block()

    def create_or_get_global_variable(self, name, *args, **kwargs):
        block = self._block()
        if block.has_var(name):
            return block.var(name), False
        return self.create_global_variable(*args, name=name, **kwargs), True

    def create_global_variable(self, persistable=False, *args, **kwargs):
        return self.create_variable(*args, persistable=persistable, **kwargs)

    def create_variable(self, name=None, shape=None, dtype="float32", persistable=False,
                        stop_gradient=False, lod_level=0, **kwargs):
        shape = None if shape is None else tuple(int(d) for d in shape)
        # No name: Fluid's block.create_var names it "_generated_var_<n>".
        return self._block().create_var(name, shape, dtype, lod_level,
                                        persistable=persistable, stop_gradient=stop_gradient)

    def create_variable_for_type_inference(self, dtype, stop_gradient=False):
        return self.create_variable(name=unique_name.tmp(self.name), dtype=dtype,
                                    stop_gradient=stop_gradient)

    def set_variable_initializer(self, var, initializer):
        if not isinstance(initializer, _initializer.Constant):
            raise ValueError(f"LayerHelper.set_variable_initializer({var.name!r}): only a "
                             f"Constant initializer is supported here, got "
                             f"{type(initializer).__name__}")
        if var.shape is None or any(d is None or d < 0 for d in var.shape):
            raise ValueError(f"LayerHelper.set_variable_initializer: {var.name!r} needs a "
                             f"fixed shape, has {var.shape}")
        value = np.full(var.shape, initializer.value, dtype=convert_dtype(var.dtype))
        self.startup_program._init_states.append((var.name, value))
        var.persistable = var.persistable or False

    def append_op(self, type=None, inputs=None, outputs=None, attrs=None, **kwargs):
        if type not in ops.FORWARD:
            raise ValueError(f"LayerHelper.append_op: Fluid operator {type!r} has no pyfleet "
                             f"kernel")
        return self._block().append_op(type, inputs, outputs, attrs)
