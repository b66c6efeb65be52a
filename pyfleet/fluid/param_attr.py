"""Fluid's ``ParamAttr`` and the creation of a parameter in a main program
with its initialization registered in the startup program."""

import numpy as np

from pyfleet import initializer as _init
from pyfleet.fluid import unique_name
from pyfleet.fluid.gradient_rules import check_clip
from pyfleet.fluid.regularizer import check_regularizer

__all__ = ["ParamAttr", "create_parameter_in"]


class ParamAttr:
    """Fluid's ParamAttr: a parameter's name, initializer, learning-rate
    multiplier, ``regularizer`` (wins over the optimizer's ``regularization``)
    and ``gradient_clip`` (see :mod:`pyfleet.fluid.clip`).

    ``do_model_average`` (Fluid's default True) only marks the parameter for
    ``fluid.optimizer.ModelAverage``, which pyfleet refuses by name; like
    Fluid without ModelAverage it changes nothing, so any bool is accepted.
    """

    def __init__(self, name=None, initializer=None, learning_rate=1.0, regularizer=None,
                 trainable=True, gradient_clip=None, do_model_average=True):
        self.name = name
        self.initializer = initializer
        self.learning_rate = float(learning_rate)
        self.regularizer = check_regularizer(regularizer, "ParamAttr regularizer")
        self.trainable = bool(trainable)
        self.gradient_clip = check_clip(gradient_clip, "ParamAttr gradient_clip")
        if do_model_average is not None and not isinstance(do_model_average, bool):
            raise ValueError(f"ParamAttr do_model_average must be a bool, got "
                             f"{do_model_average!r}")
        self.do_model_average = do_model_average

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
    # A shared parameter keeps the first rule given to it, as Fluid's does.
    if attr.regularizer is not None and p.regularizer is None:
        p.regularizer = attr.regularizer
    if attr.gradient_clip is not None and p.gradient_clip_attr is None:
        p.gradient_clip_attr = attr.gradient_clip
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
    if isinstance(init, _init.MSRA):
        return _init.MSRA(init.uniform, init.fan_in or shape[0])
    return init
