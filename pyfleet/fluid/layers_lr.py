"""Fluid 1.8's learning-rate schedules (``fluid.layers.exponential_decay``, ...).

Each returns a float32 ``[1]`` Variable computed from the step counter
``@LR_DECAY_COUNTER@`` (:func:`~pyfleet.fluid.layers_tensor.autoincreased_step_counter`,
0 on the first training step, as Fluid), to be given to an optimizer as its
``learning_rate``. The Variable carries ``lr_schedule_start``, its rate at
the first step: the rule is configured with it, and each step's gradient is
scaled by ``rate / start`` before the push (exact for SGD, which is all
``Program.attach_optimizer`` accepts a schedule with; see
:func:`~pyfleet.fluid.lr_schedules.check_schedule`).
"""

from pyfleet.fluid import framework, unique_name
from pyfleet.fluid.layers_tensor import autoincreased_step_counter
from pyfleet.fluid.lr_schedules import check_schedule, schedule_value

__all__ = ["check_schedule", "cosine_decay", "exponential_decay", "inverse_time_decay", "natural_exp_decay",
           "noam_decay", "piecewise_decay", "polynomial_decay"]

_COUNTER = "@LR_DECAY_COUNTER@"


def _rate(kind, first_step, **attrs):
    for k, v in attrs.items():
        if isinstance(v, framework.Variable):
            raise ValueError(f"{kind}: {k} must be a number (a Variable is not supported)")
    counter = autoincreased_step_counter(_COUNTER, begin=first_step, step=1)
    block = framework.default_main_program().global_block()
    out = block.create_var(unique_name.generate(kind + ".tmp"), (1,), "float32",
                           stop_gradient=True)
    block.append_op("lr_schedule", {"Step": [counter]}, {"Out": [out]},
                    {"kind": kind, **attrs})
    out.lr_schedule_start = schedule_value(kind, first_step, attrs)
    return out


def exponential_decay(learning_rate, decay_steps, decay_rate, staircase=False):
    """``learning_rate * decay_rate ** (step / decay_steps)`` (floored with ``staircase``)."""
    return _rate("exponential_decay", 0, learning_rate=float(learning_rate),
                 decay_steps=float(decay_steps), decay_rate=float(decay_rate),
                 staircase=bool(staircase))


def natural_exp_decay(learning_rate, decay_steps, decay_rate, staircase=False):
    """``learning_rate * exp(-decay_rate * step / decay_steps)``."""
    return _rate("natural_exp_decay", 0, learning_rate=float(learning_rate),
                 decay_steps=float(decay_steps), decay_rate=float(decay_rate),
                 staircase=bool(staircase))


def inverse_time_decay(learning_rate, decay_steps, decay_rate, staircase=False):
    """``learning_rate / (1 + decay_rate * step / decay_steps)``."""
    return _rate("inverse_time_decay", 0, learning_rate=float(learning_rate),
                 decay_steps=float(decay_steps), decay_rate=float(decay_rate),
                 staircase=bool(staircase))


def polynomial_decay(learning_rate, decay_steps, end_learning_rate=0.0001, power=1.0,
                     cycle=False):
    return _rate("polynomial_decay", 0, learning_rate=float(learning_rate),
                 decay_steps=float(decay_steps), end_learning_rate=float(end_learning_rate),
                 power=float(power), cycle=bool(cycle))


def piecewise_decay(boundaries, values):
    """``values[i]`` while ``step < boundaries[i]``, then ``values[-1]``."""
    if len(values) != len(boundaries) + 1:
        raise ValueError(f"piecewise_decay: {len(values)} values for {len(boundaries)} "
                         "boundaries (need one more value than boundaries)")
    return _rate("piecewise_decay", 0, boundaries=[float(b) for b in boundaries],
                 values=[float(v) for v in values])


def noam_decay(d_model, warmup_steps, learning_rate=1.0):
    """``learning_rate * d_model**-0.5 * min(step**-0.5, warmup_steps**-1.5 * step)``,
    counting steps from 1 as Fluid."""
    return _rate("noam_decay", 1, d_model=float(d_model), warmup_steps=float(warmup_steps),
                 learning_rate=float(learning_rate))


def cosine_decay(learning_rate, step_each_epoch, epochs):
    """``learning_rate * (cos(floor(step / step_each_epoch) * pi / epochs) + 1) / 2``."""
    return _rate("cosine_decay", 0, learning_rate=float(learning_rate),
                 step_each_epoch=float(step_each_epoch), epochs=float(epochs))
