# ruff: noqa: UP031  (the era's % formatting, kept as users wrote it)
"""A Fluid 1.8-era Fleet job as PaddleRec's runner drives one, importing ``paddle``
itself (no edit): run by the tests with ``python -m pyfleet.launch --paddle``.

It creates the StrategyFactory strategy named by ``--strategy``, compiles the
main program with the strategy's build and execution strategies, calls
``fleet.init_server("")`` (PaddleRec's default ``init_model_path``), and ends
every role with ``fleet.stop_worker()`` (PaddleRec's terminal pass). Each
worker prints what it fetched as Fluid printed it, and what ``import paddle``
gives in a Python process it starts.
"""

import argparse
import subprocess
import sys

import numpy as np
import paddle
import paddle.fluid as fluid
from paddle import fluid as fluid_too
from paddle.fluid.incubate.fleet.base.role_maker import PaddleCloudRoleMaker
from paddle.fluid.incubate.fleet.parameter_server.distribute_transpiler import fleet
from paddle.fluid.incubate.fleet.parameter_server.distribute_transpiler.distributed_strategy import (  # noqa: E501
    StrategyFactory,
)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="sync")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    assert fluid is fluid_too and paddle.fluid is fluid

    x = fluid.data(name="x", shape=[None, 4], dtype="float32")
    ids = fluid.data(name="ids", shape=[None, 1], dtype="int64")
    y = fluid.data(name="y", shape=[None, 1], dtype="float32")
    emb = fluid.embedding(ids, size=[1000, 4], is_sparse=True,
                          param_attr=fluid.ParamAttr(name="emb"))
    h = fluid.layers.concat([x, fluid.layers.reshape(emb, [-1, 4])], axis=1)
    pred = fluid.layers.fc(h, 1)
    loss = fluid.layers.mean(fluid.layers.square_error_cost(pred, y))

    fleet.init(PaddleCloudRoleMaker())
    strategy = {"sync": StrategyFactory.create_sync_strategy,
                "async": StrategyFactory.create_async_strategy}[args.strategy]()
    fleet.distributed_optimizer(fluid.optimizer.SGD(0.05), strategy).minimize(loss)

    if fleet.is_server():
        fleet.init_server("")
        fleet.run_server()
    else:
        fleet.init_worker()
        exe = fluid.Executor(fluid.CPUPlace())
        exe.run(fleet.startup_program)
        program = fluid.compiler.CompiledProgram(fleet.main_program).with_data_parallel(
            loss_name=loss.name, build_strategy=strategy.get_build_strategy(),
            exec_strategy=strategy.get_execute_strategy())
        rng = np.random.default_rng(fleet.worker_index())
        w = np.array([[0.5], [-1.0], [2.0], [0.25]], dtype=np.float32)
        first = None
        for _ in range(args.steps):
            xb = rng.normal(size=(32, 4)).astype(np.float32)
            feed = {"x": xb, "ids": rng.integers(0, 1000, (32, 1)).astype(np.int64),
                    "y": xb @ w}
            out = exe.run(program, feed=feed, fetch_list=[loss])
            first = out if first is None else first
        print("first fetch: %s" % (first,))
        print("last loss: %f" % out[0])
        child = subprocess.run(
            [sys.executable, "-c", "import paddle.fluid as f, paddle; print(f.__name__, "
             "paddle.__name__)"], capture_output=True, text=True, timeout=120, check=True)
        print("child imports: %s" % child.stdout.strip())
    fleet.stop_worker()
    print("role done: %s" % ("server" if fleet.is_server() else "worker"))


if __name__ == "__main__":
    main()
