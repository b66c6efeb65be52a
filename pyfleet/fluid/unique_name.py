"""Fluid's ``unique_name`` and the naming rules of its layers.

``generate(key)`` gives ``key_0``, ``key_1``, ... (one counter per key);
``guard()`` starts every counter again (``guard("A")`` also prefixes the names
with ``A``), as ``switch()`` does until it is switched back.

A layer call is named as Fluid's ``LayerHelper`` names it: its ``name=`` when
given, else ``generate(layer_type)`` (``fc_0``, ``cos_sim_0``). Its parameters
are ``generate("<layer>.w")`` / ``generate("<layer>.b")`` (``fc_0.w_0``,
``l3.b_0``) and the variables it makes ``generate("<layer>.tmp")``
(``l3.tmp_0`` .. ``l3.tmp_2`` for an fc with a bias and an activation);
``Variable`` arithmetic makes ``tmp_<n>``. Fetch lists, inference models and
checkpoints written against Fluid's names find the same variables here.
"""

import contextlib

__all__ = ["generate", "guard", "switch"]


class UniqueNameGenerator:
    """The counters of one naming context: ``generate("fc")`` gives ``fc_0``, ``fc_1``, ..."""

    def __init__(self, prefix=None):
        self.ids = {}
        self.prefix = prefix or ""

    def __call__(self, key):
        n = self.ids.get(key, 0)
        self.ids[key] = n + 1
        return f"{self.prefix}{key}_{n}"


# The process-wide generator every layer and program names its variables with.
generator = UniqueNameGenerator()


def generate(key):
    return generator(key)


def switch(new_generator=None):
    """Make ``new_generator`` (a fresh one when None) current; returns the previous one."""
    global generator
    old, generator = generator, new_generator or UniqueNameGenerator()
    return old


@contextlib.contextmanager
def guard(new_generator=None):
    """A context in which names start again from ``_0`` (a str: prefixed with it)."""
    if isinstance(new_generator, bytes):
        new_generator = new_generator.decode()
    if isinstance(new_generator, str):
        new_generator = UniqueNameGenerator(new_generator)
    old = switch(new_generator)
    try:
        yield
    finally:
        switch(old)


class LayerName(str):
    """The name of one layer call (Fluid's ``LayerHelper.name``)."""


def layer(layer_type, name=None):
    """The name of a new call of layer ``layer_type``: ``name``, else ``<layer_type>_<k>``."""
    return LayerName(name if name is not None else generate(layer_type))


def tmp(layer_or_type):
    """The name of a variable a layer call makes (Fluid's
    ``create_variable_for_type_inference``): ``<layer>.tmp_<n>``. A layer type
    (a plain str) stands for a call of its own."""
    name = layer_or_type if isinstance(layer_or_type, LayerName) else layer(layer_or_type)
    return generate(name + ".tmp")


def param(layer_name, is_bias=False):
    """The default name of a parameter of a layer call: ``<layer>.w_<n>`` / ``<layer>.b_<n>``."""
    return generate(f"{layer_name}.{'b' if is_bias else 'w'}")
