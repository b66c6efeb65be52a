"""``fluid.incubate``: the data generator scripts Fluid's Dataset pipes through."""

from pyfleet.fluid.incubate import data_generator

__all__ = ["data_generator"]
