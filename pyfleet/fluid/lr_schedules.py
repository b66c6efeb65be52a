"""The rules of Fluid 1.8's learning-rate schedules, below the program that runs them:
the rate of each schedule at a step (the ``lr_schedule`` op's kernel computes it;
the layers that build one are in :mod:`pyfleet.fluid.layers_lr`) and which
optimizers a schedule may drive (:meth:`Program.attach_optimizer` checks it)."""

import math

__all__ = ["check_schedule", "schedule_value"]


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


def check_schedule(program, optimizer):
    """A learning-rate schedule (``fluid.layers.exponential_decay``, ...) is
    applied as the ratio of its rate at this step to its first rate, scaling
    the gradient before it is pushed: exact for plain SGD (``w -= lr_t * g``).
    For another rule, or with a regularizer added to the gradient where the
    row lives, scaling the gradient is not the same update: refused."""
    sched = getattr(optimizer, "lr_schedule", None)
    if sched is None:
        return
    if getattr(getattr(sched, "block", None), "program", None) is not program:
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
