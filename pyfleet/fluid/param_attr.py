"""Fluid's ``ParamAttr`` and the creation of a parameter in a main program
with its initialization registered in the startup program."""

import numpy as np

from pyfleet import initializer as _init
from pyfleet.fluid import unique_name

__all__ = ["ParamAttr", "create_parameter_in"]


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
        if isinstance(arg, _init.Initializer):
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
    if isinstance(init, _init.Xavier):
        fan_in = init.fan_in or shape[0]
        fan_out = init.fan_out or shape[1]
        if init.uniform:
            limit = float(np.sqrt(6.0 / (fan_in + fan_out)))
            return _init.Uniform(-limit, limit)
        return _init.Normal(0.0, float(np.sqrt(2.0 / (fan_in + fan_out))))
    return init
