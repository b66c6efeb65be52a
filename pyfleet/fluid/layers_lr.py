"""Fluid 1.8's learning-rate schedules (``fluid.layers.exponential_decay``, ...).

Each returns a float32 ``[1]`` Variable computed from the step counter
``@LR_DECAY_COUNTER@`` (:func:`~pyfleet.fluid.layers_tensor.autoincreased_step_counter`,
0 on the first training step, as Fluid), to be given to an optimizer as its
``learning_rate``. The Variable carries ``lr_schedule_start``, its rate at
the first step: the rule is configured with it, and each step's gradient is
scaled by ``rate / start`` before the push (exact for SGD, which is all
``Program.attach_optimizer`` accepts a schedule with; see
:func:`check_schedule`).
"""

import math

from pyfleet.fluid import framework, unique_name
from pyfleet.fluid.layers_tensor import autoincreased_step_counter

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


def schedule_value(kind, step, a):
    """The rate of schedule ``kind`` with attributes ``a`` at ``step`` (Fluid's formulas)."""
    step = float(step)
    if kind in ("exponential_decay", "natural_exp_decay", "inverse_time_decay"):
        div = step / a["decay_steps"]
        if a["staircase"]:
            div = math.floor(div)
        lr = a["learning_rate"]
        if kind == "exponential_decay":
            return lr * a["decay_rate"] ** div
        if kind == "natural_exp_decay":
            return lr * math.exp(-a["decay_rate"] * div)
        return lr / (1 + a["decay_rate"] * div)
    if kind == "polynomial_decay":
        steps = a["decay_steps"]
        if a["cycle"]:
            steps = steps * max(math.ceil(step / steps), 1)
        else:
            step = min(step, steps)
        return ((a["learning_rate"] - a["end_learning_rate"])
                * (1 - step / steps) ** a["power"] + a["end_learning_rate"])
    if kind == "piecewise_decay":
        for b, v in zip(a["boundaries"], a["values"]):
            if step < b:
                return v
        return a["values"][-1]
    if kind == "noam_decay":
        return a["learning_rate"] * a["d_model"] ** -0.5 * min(
            step ** -0.5 if step > 0 else math.inf, a["warmup_steps"] ** -1.5 * step)
    if kind == "cosine_decay":
        epoch = math.floor(step / a["step_each_epoch"])
        return a["learning_rate"] * 0.5 * (math.cos(epoch * math.pi / a["epochs"]) + 1)
    raise ValueError(f"unknown learning-rate schedule {kind!r}")


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


def check_schedule(program, optimizer):
    """A learning-rate schedule (``fluid.layers.exponential_decay``, ...) is
    applied as the ratio of its rate at this step to its first rate, scaling
    the gradient before it is pushed: exact for plain SGD (``w -= lr_t * g``).
    For another rule, or with a regularizer added to the gradient where the
    row lives, scaling the gradient is not the same update: refused."""
    sched = getattr(optimizer, "lr_schedule", None)
    if sched is None:
        return
    if not isinstance(sched, framework.Variable) or sched.block.program is not program:
        raise ValueError("the optimizer's learning_rate schedule must be a Variable of the "
                         "loss's program (build it under the same program_guard)")
    if optimizer.kind != "SGD":
        raise ValueError(f"a learning-rate schedule with {type(optimizer).__name__} is not "
                         "supported: pyfleet's tables run the update rule with a fixed rate, "
                         "and only SGD's update scales exactly with the gradient; use SGD, "
                         "or a constant learning_rate")
    regs = [p.name for p in program.all_parameters() if getattr(p, "regularizer", None)]
    if optimizer.regularization is not None or regs:
        raise ValueError("a learning-rate schedule together with regularization is not "
                         "supported (the decay would not follow the schedule): drop the "
                         "regularizer or use a constant learning_rate")
