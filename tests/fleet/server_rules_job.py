"""A small sync Fleet job whose server state a numpy reference can follow
(tests/fleet/test_server_rules.py): a logistic model over one distributed
embedding table (``emb``, summed per sequence) plus a dense ``bias`` on the
servers, trained by ``--optimizer`` with ``--reg`` as Fluid scripts set it
(``regularization=`` of the optimizer). Each worker feeds the same batch
every step (``batch(worker)``): worker 0's ids lie in [0, 12), worker 1's in
[6, 18), so rows 6..11 are touched by both and the others by one.

Workers write ``<out>/worker<i>.json`` (their losses); with ``--save`` the
first worker saves the checkpoint (fleet.save_persistables) and writes its
auc counters to ``<out>/auc_saved.npz``; with ``--load`` the servers load the
checkpoint (init_server) and every worker calls fleet.load_persistables and
writes its auc counters, before any step, to ``<out>/auc_loaded<i>.npz``.

``--save-at K`` saves after step K instead (``meta={"step": K}``, then a
worker barrier) and trains on; with ``--die-after-save`` worker 1 of the
job's first attempt is SIGKILLed there, so that a launcher with
``--max-restarts`` restarts the job from the checkpoint: the restarted
workers start at the saved step. Every worker writes its auc counters and
its running AUC after the last step to ``<out>/final<i>.npz``.
"""

import argparse
import json
import os
import signal

import numpy as np

from pyfleet import fluid
from pyfleet.fluid.incubate.fleet.parameter_server.distribute_transpiler import fleet

L = fluid.layers
DIM, VOCAB, LR, MU = 3, 1000, 0.1, 0.9
REG = {"none": None, "l2": ("L2Decay", 0.05), "l1": ("L1Decay", 0.02)}
BIAS0 = 0.3


def batch(worker, n=8):
    """``(ids, lengths, labels)`` of worker ``worker``'s batch."""
    rng = np.random.default_rng(100 + worker)
    lengths = rng.integers(1, 4, n)
    ids = rng.integers(6 * worker, 6 * worker + 12, int(lengths.sum()))
    labels = (rng.random(n) < 0.5).astype(np.int64).reshape(-1, 1)
    return ids, lengths, labels


def optimizer(name, reg):
    r = None
    if REG[reg] is not None:
        kind, coeff = REG[reg]
        r = getattr(fluid.regularizer, kind)(coeff)
    if name == "momentum":
        return fluid.optimizer.Momentum(LR, MU, regularization=r)
    return fluid.optimizer.SGD(LR, regularization=r)


def build():
    """``(loss, auc_states, auc)`` in the current program."""
    ids = L.data(name="ids", shape=[1], dtype="int64", lod_level=1)
    label = L.data(name="label", shape=[1], dtype="int64")
    emb = L.embedding(ids, [VOCAB, DIM], is_distributed=True, param_attr=fluid.ParamAttr(
        name="emb", initializer=fluid.initializer.Uniform(-0.5, 0.5, seed=7)))
    bias = L.create_parameter([1], "float32", attr=fluid.ParamAttr(
        name="bias", initializer=fluid.initializer.Constant(BIAS0)))
    logit = L.elementwise_add(L.reduce_sum(L.sequence_pool(emb, "sum"), dim=1, keep_dim=True),
                              bias)
    loss = L.mean(L.sigmoid_cross_entropy_with_logits(logit, L.cast(label, "float32")))
    prob = L.sigmoid(logit)
    auc, _, states = L.auc(L.concat([1 - prob, prob], axis=1), label)
    return loss, states, auc


def feed(worker):
    ids, lengths, labels = batch(worker)
    return {"ids": fluid.create_lod_tensor(ids.reshape(-1, 1), [lengths.tolist()],
                                           fluid.CPUPlace()),
            "label": labels}


def auc_state(states):
    scope = fluid.global_scope()
    return {v.name: np.array(scope.find_var(v.name).get_tensor()) for v in states}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--reg", default="none", choices=sorted(REG))
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save")
    p.add_argument("--load")
    p.add_argument("--out", default=".")
    p.add_argument("--save-at", type=int)
    p.add_argument("--die-after-save", action="store_true")
    p.add_argument("--no-init-worker", action="store_true",
                   help="as sync scripts of the era that never call it")
    a = p.parse_args()
    fleet.init()
    loss, states, auc = build()
    config = fluid.DistributeTranspilerConfig()
    config.sync_mode = True
    fleet.distributed_optimizer(optimizer(a.optimizer, a.reg), config).minimize(loss)
    if fleet.is_server():
        fleet.init_server(a.load)
        fleet.run_server()
        return
    if not a.no_init_worker:
        fleet.init_worker()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(fleet.startup_program)
    w = fleet.worker_index()
    if a.load:
        fleet.load_persistables(exe, a.load)
        np.savez(os.path.join(a.out, f"auc_loaded{w}.npz"), **auc_state(states))
    restore = os.environ.get("PYFLEET_RESTORE_DIR")
    first = 0
    if restore and os.path.exists(os.path.join(restore, "MANIFEST.json")):
        with open(os.path.join(restore, "MANIFEST.json")) as f:
            first = json.load(f)["meta"]["step"]
    losses, value_auc = [], None
    for step in range(first, a.steps):
        value, value_auc = exe.run(fleet.main_program, feed=feed(w), fetch_list=[loss, auc])
        losses.append(float(value))
        if a.save_at == step + 1:
            if fleet.is_first_worker():
                fleet.save_persistables(exe, a.save, meta={"step": step + 1})
            fleet.barrier_worker()
            if a.die_after_save and w == 1 and os.environ.get("PYFLEET_RESTART_COUNT", "0") == "0":
                os.kill(os.getpid(), signal.SIGKILL)
    with open(os.path.join(a.out, f"worker{w}.json"), "w") as f:
        json.dump(losses, f)
    np.savez(os.path.join(a.out, f"final{w}.npz"), auc=np.float64(value_auc),
             **auc_state(states))
    if a.save and a.save_at is None and fleet.is_first_worker():
        fleet.save_persistables(exe, a.save)
        np.savez(os.path.join(a.out, "auc_saved.npz"), **auc_state(states))
    fleet.stop_worker()


if __name__ == "__main__":
    main()
