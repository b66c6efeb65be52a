"""Criteo CTR DNN trained with Fleet, as in PaddlePaddle Fluid 1.5's documented flow.

The network and the reader follow the Criteo DNN example of Paddle's models
repository (dense_input, 26 sparse slots C1..C26 hashed into ids and sharing
the table "SparseFeatFactors", three ReLU layers, softmax, cross-entropy,
AUC). Only the import lines differ from a Paddle script, plus one fix: ids
are hashed with zlib.crc32 instead of Python's hash(), which differs between
processes (every worker must map a value to the same id). The Paddle script
itself, its ``import paddle.fluid as fluid`` lines kept, runs the same way with
``--paddle`` added to the launcher (or ``pyfleet run`` for one process;
docs/fleet.md, "Zero edits"): this copy shows the import rule instead.

    python -m pyfleet.launch --servers 2 --workers 2 examples/fleet_ctr.py \
        --data ../shared/data/criteo-kaggle-tiny/train.tiny.csv --mode async
    python examples/fleet_ctr.py --local --data ...          # one process, no servers

Without the launcher, give the role on the command line (UserDefinedRoleMaker):
``--role server|worker --current-id I --worker-num W --endpoints h:p,h:p``.
Each worker prints ``pass P batch B loss L auc A batch_auc BA`` lines and, at
the end, ``pass P done: examples N loss L auc A``.
"""

import argparse
import math
import sys
import zlib

# Paddle: import paddle.fluid as fluid
import pyfleet.fluid as fluid  # noqa: PLR0402 (the spelling Paddle scripts use)

# Paddle: from paddle.fluid.incubate.fleet.base.role_maker import ...
from pyfleet.fluid.incubate.fleet.base.role_maker import (
    PaddleCloudRoleMaker,
    Role,
    UserDefinedRoleMaker,
)

# Paddle: from paddle.fluid.incubate.fleet.parameter_server.distribute_transpiler import fleet
from pyfleet.fluid.incubate.fleet.parameter_server.distribute_transpiler import fleet

# Paddle: from paddle.fluid.transpiler.distribute_transpiler import DistributeTranspilerConfig
from pyfleet.fluid.transpiler.distribute_transpiler import DistributeTranspilerConfig

# Scaling of the 13 integer features, as in the Criteo example's reader.
CONT_MIN = [0, -3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
CONT_DIFF = [20, 603, 100, 50, 64000, 500, 100, 50, 500, 10, 10, 10, 50]
HASH_DIM = 1000001


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", nargs="+", required=True,
                   help="Criteo files: raw TSV (label, I1..I13, C1..C26) or the Kaggle CSV")
    p.add_argument("--passes", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--embedding-size", type=int, default=10)
    p.add_argument("--hidden", type=int, default=400, help="units of each of the 3 fc layers")
    p.add_argument("--lr", type=float, default=0.0001)
    p.add_argument("--mode", choices=["sync", "async"], default=None,
                   help="default: the config's (sync, or $PYFLEET_MODE)")
    p.add_argument("--model-dir", default=None,
                   help="worker 0 saves the persistables here after the last pass")
    p.add_argument("--inference-dir", default=None,
                   help="worker 0 saves the inference model here")
    p.add_argument("--init-model-dir", default=None,
                   help="servers load the persistables saved here before training")
    p.add_argument("--predict-out", default=None,
                   help="worker 0 writes the test network's click probabilities of the first "
                        "batch here after training (one per line)")
    p.add_argument("--local", action="store_true", help="train in this process, no servers")
    p.add_argument("--role", choices=["server", "worker"], default=None,
                   help="UserDefinedRoleMaker instead of the launcher's environment")
    p.add_argument("--current-id", type=int, default=0)
    p.add_argument("--worker-num", type=int, default=1)
    p.add_argument("--endpoints", default="127.0.0.1:6000")
    return p.parse_args(argv)


def ctr_dnn_model(embedding_size, sparse_feature_dim, hidden):
    dense_input = fluid.layers.data(name="dense_input", shape=[13], dtype="float32")
    sparse_input_ids = [fluid.layers.data(name="C" + str(i), shape=[1], lod_level=1,
                                          dtype="int64") for i in range(1, 27)]
    label = fluid.layers.data(name="label", shape=[1], dtype="int64")

    def embedding_layer(input):
        emb = fluid.layers.embedding(
            input=input, is_sparse=True, is_distributed=False,
            size=[sparse_feature_dim, embedding_size],
            param_attr=fluid.ParamAttr(name="SparseFeatFactors",
                                       initializer=fluid.initializer.Uniform()))
        return fluid.layers.sequence_pool(input=emb, pool_type="sum")

    sparse_embed_seq = list(map(embedding_layer, sparse_input_ids))
    concated = fluid.layers.concat(sparse_embed_seq + [dense_input], axis=1)
    fc1 = fluid.layers.fc(input=concated, size=hidden, act="relu",
                          param_attr=fluid.ParamAttr(initializer=fluid.initializer.Normal(
                              scale=1 / math.sqrt(concated.shape[1]))))
    fc2 = fluid.layers.fc(input=fc1, size=hidden, act="relu",
                          param_attr=fluid.ParamAttr(initializer=fluid.initializer.Normal(
                              scale=1 / math.sqrt(fc1.shape[1]))))
    fc3 = fluid.layers.fc(input=fc2, size=hidden, act="relu",
                          param_attr=fluid.ParamAttr(initializer=fluid.initializer.Normal(
                              scale=1 / math.sqrt(fc2.shape[1]))))
    predict = fluid.layers.fc(input=fc3, size=2, act="softmax",
                              param_attr=fluid.ParamAttr(initializer=fluid.initializer.Normal(
                                  scale=1 / math.sqrt(fc3.shape[1]))))
    cost = fluid.layers.cross_entropy(input=predict, label=label)
    avg_cost = fluid.layers.mean(cost)
    auc_var, batch_auc_var, _auc_states = fluid.layers.auc(input=predict, label=label,
                                                         num_thresholds=2 ** 12,
                                                         slide_steps=20)
    data_list = [dense_input] + sparse_input_ids + [label]
    return avg_cost, auc_var, batch_auc_var, data_list, predict


def criteo_reader(paths, trainer_id=0, trainer_num=1):
    """A plain Python reader: one sample ``[dense, [id], ..., [label]]`` per line;
    trainer ``trainer_id`` of ``trainer_num`` keeps every ``trainer_num``-th line."""

    def reader():
        n = 0
        for path in paths:
            with open(path) as f:
                first = True
                skip_id = False
                sep = "\t"
                for lineno, line in enumerate(f, 1):
                    line = line.rstrip("\r\n")
                    if first:
                        first = False
                        if "," in line and "\t" not in line:
                            sep = ","
                            if not line[:1].isdigit():  # a header: "Id,Label,..." or "label,..."
                                skip_id = line.split(",")[0].lower() == "id"
                                continue
                    if not line:
                        continue
                    n += 1
                    if (n - 1) % trainer_num != trainer_id:
                        continue
                    features = line.split(sep)
                    if skip_id:
                        features = features[1:]
                    if len(features) != 40:  # label, 13 dense, 26 categorical
                        raise ValueError(f"{path}:{lineno}: {len(features)} fields, a Criteo "
                                         f"line has 40 (label, I1-I13, C1-C26)")
                    dense_feature = []
                    for idx in range(1, 14):
                        x = features[idx]
                        dense_feature.append(0.0 if x == "" else
                                             (float(x) - CONT_MIN[idx - 1]) / CONT_DIFF[idx - 1])
                    sparse_feature = []
                    for idx in range(14, 40):
                        key = (str(idx) + features[idx]).encode()
                        sparse_feature.append([zlib.crc32(key) % HASH_DIM])
                    yield [dense_feature] + sparse_feature + [[int(float(features[0]))]]

    return reader


def train_loop(exe, main_program, args, avg_cost, auc_var, batch_auc_var, data_list,
               trainer_id=0, trainer_num=1):
    feeder = fluid.DataFeeder(feed_list=data_list, place=fluid.CPUPlace())
    train_reader = fluid.batch(criteo_reader(args.data, trainer_id, trainer_num),
                               batch_size=args.batch_size)
    for pass_id in range(args.passes):
        examples, loss_sum, steps = 0, 0.0, 0
        auc_val = float("nan")
        for batch_id, data in enumerate(train_reader()):
            loss_val, auc_val, batch_auc_val = exe.run(
                main_program, feed=feeder.feed(data),
                fetch_list=[avg_cost, auc_var, batch_auc_var])
            loss_val, auc_val = float(loss_val[0]), float(auc_val[0])
            examples += len(data)
            loss_sum += loss_val
            steps += 1
            print(f"pass {pass_id} batch {batch_id} loss {loss_val:.9g} auc {auc_val:.6f} "
                  f"batch_auc {float(batch_auc_val[0]):.6f}", flush=True)
        print(f"pass {pass_id} done: examples {examples} loss {loss_sum / max(steps, 1):.6f} "
              f"auc {auc_val:.6f}", flush=True)


def write_predictions(exe, test_program, args, predict, data_list):
    if not args.predict_out:
        return
    feeder = fluid.DataFeeder(feed_list=data_list, place=fluid.CPUPlace())
    data = next(fluid.batch(criteo_reader(args.data), batch_size=args.batch_size)())
    (prob,) = exe.run(test_program, feed=feeder.feed(data), fetch_list=[predict])
    with open(args.predict_out, "w") as f:
        f.writelines(f"{p!r}\n" for p in prob[:, 1].tolist())


def main(argv=None):
    args = parse_args(argv)
    avg_cost, auc_var, batch_auc_var, data_list, predict = ctr_dnn_model(
        args.embedding_size, HASH_DIM, args.hidden)
    feed_names = [v.name for v in data_list[:-1]]
    test_program = fluid.default_main_program().clone(for_test=True)

    if args.local:
        fluid.optimizer.Adam(learning_rate=args.lr).minimize(avg_cost)
        exe = fluid.Executor(fluid.CPUPlace())
        exe.run(fluid.default_startup_program())
        train_loop(exe, fluid.default_main_program(), args, avg_cost, auc_var, batch_auc_var,
                   data_list)
        write_predictions(exe, test_program, args, predict, data_list)
        if args.model_dir:
            fluid.io.save_persistables(exe, args.model_dir)
        if args.inference_dir:
            fluid.io.save_inference_model(args.inference_dir, feed_names, [predict], exe)
        return 0

    if args.role is not None:
        role = UserDefinedRoleMaker(
            current_id=args.current_id,
            role=Role.SERVER if args.role == "server" else Role.WORKER,
            worker_num=args.worker_num, server_endpoints=args.endpoints.split(","))
    else:
        role = PaddleCloudRoleMaker()
    fleet.init(role)

    config = DistributeTranspilerConfig()
    if args.mode is not None:
        config.sync_mode = args.mode == "sync"
    optimizer = fluid.optimizer.Adam(learning_rate=args.lr)
    optimizer = fleet.distributed_optimizer(optimizer, config)
    optimizer.minimize(avg_cost)

    if fleet.is_server():
        if args.init_model_dir:
            fleet.init_server(args.init_model_dir)
        else:
            fleet.init_server()
        fleet.run_server()
    elif fleet.is_worker():
        fleet.init_worker()
        exe = fluid.Executor(fluid.CPUPlace())
        exe.run(fleet.startup_program)
        train_loop(exe, fleet.main_program, args, avg_cost, auc_var, batch_auc_var, data_list,
                   fleet.worker_index(), fleet.worker_num())
        if fleet.is_first_worker():
            write_predictions(exe, test_program, args, predict, data_list)
            if args.model_dir:
                fleet.save_persistables(exe, args.model_dir)
            if args.inference_dir:
                fleet.save_inference_model(exe, args.inference_dir, feed_names, [predict])
        fleet.stop_worker()
    return 0


if __name__ == "__main__":
    sys.exit(main())
