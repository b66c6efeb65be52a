"""``fluid.clip``: Fluid's gradient clip rules (kept, with the step that applies
them and regularization, in :mod:`pyfleet.fluid.gradient_rules`) and
:func:`set_gradient_clip`, which sets a rule on a program's parameters."""

from pyfleet.fluid import framework
from pyfleet.fluid import gradient_rules as _rules
from pyfleet.fluid import refusals as _refusals
from pyfleet.fluid.gradient_rules import *  # noqa: F403 (the rules: this module is their face)
from pyfleet.fluid.gradient_rules import check_clip

__all__ = [*_rules.__all__, "set_gradient_clip"]


def set_gradient_clip(clip, param_list=None, program=None):
    """Fluid's ``set_gradient_clip``: ``clip`` for every parameter of ``program``
    (default: the default main program), or those of ``param_list`` (Variables
    or names). It takes effect from the next run."""
    check_clip(clip, "set_gradient_clip's clip")
    if clip is None:
        raise ValueError("set_gradient_clip needs a clip rule, got None")
    program = program or framework.default_main_program()
    params = program.all_parameters()
    if param_list is not None:
        names = {p.name if hasattr(p, "name") else str(p) for p in param_list}
        unknown = names - {p.name for p in params}
        if unknown:
            raise ValueError(f"set_gradient_clip: {sorted(unknown)} are not parameters of "
                             "the program")
        params = [p for p in params if p.name in names]
    for p in params:
        p.gradient_clip_attr = clip
    program._plan_cache.clear()


_refusals.install(globals(), "paddle.fluid.clip")
