"""Plain numpy references of the optimizer rules (float32, as the C++ core computes).

Used by the tests only: each function updates one row (or a dense block) in place.
"""

import numpy as np

__all__ = ["decayed", "init_state", "state_dim", "update"]

f32 = np.float32


def state_dim(opt, dim):
    if opt.kind == "RMSProp":
        return (3 if opt.centered else 2) * dim
    return {"SGD": 0, "Adagrad": dim, "Adam": 2 * dim + 2, "FTRL": 2 * dim,
            "Momentum": dim}[opt.kind]


def decayed(regularizer, w, g):
    """Fluid's regularizers: ``g + c*w`` (L2Decay) or ``g + c*sign(w)``
    (L1Decay), ``regularizer`` a table's config (None: ``g``)."""
    if regularizer is None:
        return g
    c = f32(regularizer["regularization_coeff"])
    if regularizer["type"] == "L2Decay":
        return g + c * w
    return g + c * np.sign(w).astype(f32)


def init_state(opt, dim):
    s = np.zeros(state_dim(opt, dim), dtype=f32)
    if opt.kind == "Adagrad":
        s[:] = f32(opt.initial_accumulator_value)
    if opt.kind == "Adam":
        s[2 * dim] = f32(opt.beta1)
        s[2 * dim + 1] = f32(opt.beta2)
    return s


def update(opt, w, s, g, regularizer=None):
    """One step of ``opt`` on weights ``w`` and state ``s`` (both float32, in
    place), the gradient ``g`` first decayed by ``regularizer`` (see :func:`decayed`)."""
    g = decayed(regularizer, w, g)
    lr = f32(opt.learning_rate)
    n = w.shape[0]
    if opt.kind == "SGD":
        w -= lr * g
    elif opt.kind == "Adagrad":
        s += g * g
        w -= lr * g / (np.sqrt(s) + f32(opt.epsilon))
    elif opt.kind == "Adam":
        b1, b2 = f32(opt.beta1), f32(opt.beta2)
        m, v = s[:n], s[n:2 * n]
        b1p, b2p = s[2 * n], s[2 * n + 1]
        lr_t = lr * np.sqrt(f32(1) - b2p) / (f32(1) - b1p)
        eps = f32(opt.epsilon) * np.sqrt(f32(1) - b2p)
        m[:] = b1 * m + (f32(1) - b1) * g
        v[:] = b2 * v + (f32(1) - b2) * g * g
        w -= lr_t * (m / (np.sqrt(v) + eps))
        s[2 * n] = b1p * b1
        s[2 * n + 1] = b2p * b2
    elif opt.kind == "FTRL":
        sq, lin = s[:n], s[n:]
        p = f32(opt.lr_power)
        new_sq = sq + g * g
        if p == f32(-0.5):
            sigma = (np.sqrt(new_sq) - np.sqrt(sq)) / lr
            y = np.sqrt(new_sq) / lr + f32(2) * f32(opt.l2)
        else:
            sigma = (new_sq ** -p - sq ** -p) / lr
            y = new_sq ** -p / lr + f32(2) * f32(opt.l2)
        lin += g - sigma * w
        l1 = f32(opt.l1)
        x = np.sign(lin) * l1 - lin
        w[:] = np.where(np.abs(lin) > l1, x / y, f32(0))
        sq[:] = new_sq
    elif opt.kind == "Momentum":  # Fluid's momentum op
        mu = f32(opt.momentum)
        v = s[:n]
        v[:] = mu * v + g
        if opt.use_nesterov:
            w -= (g + mu * v) * lr
        else:
            w -= lr * v
    elif opt.kind == "RMSProp":   # Fluid's rmsprop op
        rho, eps, mu = f32(opt.rho), f32(opt.epsilon), f32(opt.momentum)
        ms, mom = s[:n], s[n:2 * n]
        ms[:] = rho * ms + (f32(1) - rho) * g * g
        if opt.centered:
            mg = s[2 * n:]
            mg[:] = rho * mg + (f32(1) - rho) * g
            mom[:] = mu * mom + lr * g / np.sqrt(ms - mg * mg + eps)
        else:
            mom[:] = mu * mom + lr * g / np.sqrt(ms + eps)
        w -= mom
    else:
        raise ValueError(opt.kind)
