"""A Fluid Fleet script (imports ``paddle``: run it in zero-edit mode) whose
trainers train, call ``fleet.stop_worker()``, then ``fleet.init_worker()`` and
train again, as Paddle 1.5's ``FleetDistRunnerBase.run_trainer`` does
(tests/fleet/test_stop_and_train_again.py). Roles come from the command line, as
Paddle's test base gives them::

    python stop_and_train_again_job.py --role pserver|trainer --endpoints E1,E2
        --current_id I --trainers N [--sync_mode] --out DIR [--wait-before-again]

A trainer feeds the same batch at every step (its own: worker ``I``'s), with
every parameter initialised to a constant, and writes ``DIR/trainer<I>.json``:
the losses of both rounds. With ``--wait-before-again`` it writes
``DIR/stopped<I>`` after its first ``stop_worker()`` and waits for
``DIR/again<I>`` before it starts again (the test kills it there, or lets it go).
"""

import argparse
import json
import logging
import os
import time

import numpy as np
import paddle.fluid as fluid
import paddle.fluid.incubate.fleet.base.role_maker as role_maker
from paddle.fluid.incubate.fleet.parameter_server.distribute_transpiler import fleet
from paddle.fluid.transpiler.distribute_transpiler import DistributeTranspilerConfig

STEPS, BATCH, FEATURES, VOCAB = 5, 16, 4, 50


def batch(worker):
    rng = np.random.RandomState(100 + worker)
    ids = rng.randint(0, VOCAB, size=(BATCH, 1)).astype("int64")
    x = rng.rand(BATCH, FEATURES).astype("float32")
    y = (x[:, 0] > 0.5).astype("int64").reshape(-1, 1)
    return {"ids": ids, "x": x, "label": y}


def net():
    ids = fluid.layers.data(name="ids", shape=[1], dtype="int64")
    x = fluid.layers.data(name="x", shape=[FEATURES], dtype="float32")
    label = fluid.layers.data(name="label", shape=[1], dtype="int64")
    const = fluid.initializer.Constant(0.1)
    emb = fluid.layers.embedding(input=ids, size=[VOCAB, 4], is_sparse=True,
                                 param_attr=fluid.ParamAttr(name="emb", initializer=const))
    hidden = fluid.layers.fc(input=[emb, x], size=8, act="relu",
                             param_attr=fluid.ParamAttr(initializer=const))
    predict = fluid.layers.fc(input=hidden, size=2, act="softmax",
                              param_attr=fluid.ParamAttr(initializer=const))
    return fluid.layers.mean(fluid.layers.cross_entropy(input=predict, label=label))


def train_round(exe, loss, feed):
    fleet.init_worker()
    exe.run(fleet.startup_program)
    losses = [float(np.asarray(exe.run(fleet.main_program, feed=feed, fetch_list=[loss])[0])
                    .mean()) for _ in range(STEPS)]
    fleet.stop_worker()
    return losses


def wait_for(path):
    while not os.path.exists(path):  # the test creates it (or kills this process)
        time.sleep(0.05)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--role", required=True, choices=["pserver", "trainer"])
    p.add_argument("--endpoints", required=True)
    p.add_argument("--current_id", type=int, default=0)
    p.add_argument("--trainers", type=int, default=1)
    p.add_argument("--sync_mode", action="store_true")
    p.add_argument("--heartbeat_timeout", type=float, default=10.0)
    p.add_argument("--out", required=True)
    p.add_argument("--wait-before-again", action="store_true")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO)  # the servers' log says what they saw
    role = role_maker.UserDefinedRoleMaker(
        current_id=args.current_id,
        role=role_maker.Role.SERVER if args.role == "pserver" else role_maker.Role.WORKER,
        worker_num=args.trainers, server_endpoints=args.endpoints.split(","))
    fleet.init(role)
    config = DistributeTranspilerConfig()
    config.sync_mode = args.sync_mode
    config.runtime.heartbeat_timeout = args.heartbeat_timeout  # pyfleet's own setting
    loss = net()
    fleet.distributed_optimizer(fluid.optimizer.SGD(1.0), config).minimize(loss)
    if args.role == "pserver":
        fleet.init_server()
        fleet.run_server()
        return
    exe = fluid.Executor(fluid.CPUPlace())
    feed = batch(args.current_id)
    first = train_round(exe, loss, feed)
    if args.wait_before_again:
        open(os.path.join(args.out, f"stopped{args.current_id}"), "w").close()
        wait_for(os.path.join(args.out, f"again{args.current_id}"))
    second = train_round(exe, loss, feed)
    with open(os.path.join(args.out, f"trainer{args.current_id}.json"), "w") as f:
        json.dump({"first": first, "second": second}, f)


if __name__ == "__main__":
    main()
