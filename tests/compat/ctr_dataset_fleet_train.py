# ruff: noqa: UP031, RUF059  (the era's % formatting and unpacking, kept as users wrote them)
"""A Fluid 1.6-era distributed CTR DNN trainer (PaddleRec ctr/dnn style): a
QueueDataset fed by a pipe command over this worker's share of the files
(``fleet.split_files``), a StrategyFactory strategy, ``fluid.io.save_persistables``
on the first worker. Only the imports differ from the Paddle original.

Options reproduce the era's variants: ``--no_init_worker`` (sync scripts that
never called it), ``--no_stop_worker`` (scripts that end without it).
After training, the first worker evaluates the servers' model on
``--test_data_path`` and prints ``servers auc: A`` (what the infer script's
local AUC must equal).
"""


import argparse
import logging
import os
import sys

import numpy as np

from pyfleet import fluid
from pyfleet.fluid.incubate.fleet.base import role_maker
from pyfleet.fluid.incubate.fleet.parameter_server.distribute_transpiler import fleet
from pyfleet.fluid.incubate.fleet.parameter_server.distribute_transpiler.distributed_strategy import (
    StrategyFactory,
)

logging.basicConfig(format='%(asctime)s - %(levelname)s - %(message)s')
logger = logging.getLogger("fluid")
logger.setLevel(logging.INFO)


def parse_args():
    parser = argparse.ArgumentParser(description="PaddlePaddle CTR example")
    parser.add_argument('--train_data_path', type=str, required=True)
    parser.add_argument('--test_data_path', type=str, required=True)
    parser.add_argument('--model_path', type=str, default='models')
    parser.add_argument('--batch_size', type=int, default=64)
    parser.add_argument('--num_epoch', type=int, default=1)
    parser.add_argument('--embedding_size', type=int, default=8)
    parser.add_argument('--sparse_feature_dim', type=int, default=1000001)
    parser.add_argument('--learning_rate', type=float, default=0.01)
    parser.add_argument('--strategy', type=str, default='sync')
    parser.add_argument('--no_init_worker', action='store_true')
    parser.add_argument('--no_stop_worker', action='store_true')
    return parser.parse_args()


def ctr_dnn_model(embedding_size, sparse_feature_dim):
    dense_input = fluid.layers.data(name="dense_input", shape=[13], dtype='float32')
    sparse_input_ids = [
        fluid.layers.data(name="C" + str(i), shape=[1], lod_level=1, dtype='int64')
        for i in range(1, 27)]
    label = fluid.layers.data(name='label', shape=[1], dtype='int64')

    def embedding_layer(input):
        return fluid.layers.embedding(
            input=input,
            is_sparse=True,
            is_distributed=False,
            size=[sparse_feature_dim, embedding_size],
            param_attr=fluid.ParamAttr(
                name="SparseFeatFactors",
                initializer=fluid.initializer.Uniform()))

    sparse_embed_seq = list(map(embedding_layer, sparse_input_ids))
    concated = fluid.layers.concat(
        [fluid.layers.sequence_pool(e, pool_type='sum') for e in sparse_embed_seq]
        + [dense_input], axis=1)
    fc1 = fluid.layers.fc(input=concated, size=32, act='relu')
    fc2 = fluid.layers.fc(input=fc1, size=16, act='relu')
    predict = fluid.layers.fc(input=fc2, size=2, act='softmax')
    cost = fluid.layers.cross_entropy(input=predict, label=label)
    avg_cost = fluid.layers.reduce_sum(cost)
    auc_var, batch_auc_var, auc_states = fluid.layers.auc(
        input=predict, label=label, num_thresholds=2 ** 12, slide_steps=20)
    data_list = [dense_input] + sparse_input_ids + [label]
    return avg_cost, auc_var, batch_auc_var, auc_states, data_list


def make_dataset(data_list, files, batch_size):
    here = os.path.dirname(os.path.abspath(__file__))
    dataset = fluid.DatasetFactory().create_dataset("QueueDataset")
    dataset.set_use_var(data_list)
    dataset.set_pipe_command("PYTHONHASHSEED=0 %s %s/criteo_reader.py"
                             % (sys.executable, here))
    dataset.set_batch_size(batch_size)
    dataset.set_thread(1)
    dataset.set_filelist(files)
    return dataset


def train(args):
    avg_cost, auc_var, batch_auc_var, auc_states, data_list = ctr_dnn_model(
        args.embedding_size, args.sparse_feature_dim)
    test_program = fluid.default_main_program().clone(for_test=True)

    role = role_maker.PaddleCloudRoleMaker()
    fleet.init(role)
    if args.strategy == 'sync':
        strategy = StrategyFactory.create_sync_strategy()
    elif args.strategy == 'async':
        strategy = StrategyFactory.create_async_strategy()
    else:
        strategy = StrategyFactory.create_geo_strategy(10)
    optimizer = fluid.optimizer.Adam(args.learning_rate)
    optimizer = fleet.distributed_optimizer(optimizer, strategy)
    optimizer.minimize(avg_cost)

    if fleet.is_server():
        logger.info("run pserver %d", fleet.server_index())
        fleet.init_server()
        fleet.run_server()
    elif fleet.is_worker():
        logger.info("run trainer %d", fleet.worker_index())
        if not args.no_init_worker:
            fleet.init_worker()
        exe = fluid.Executor(fluid.CPUPlace())
        exe.run(fleet.startup_program)

        whole_filelist = ["%s/%s" % (args.train_data_path, x)
                          for x in sorted(os.listdir(args.train_data_path))]
        file_list = fleet.split_files(whole_filelist)
        logger.info(f"file list: {file_list}")
        dataset = make_dataset(data_list, file_list, args.batch_size)
        for epoch in range(args.num_epoch):
            exe.train_from_dataset(program=fleet.main_program, dataset=dataset,
                                   fetch_list=[auc_var], fetch_info=["auc"],
                                   print_period=10, debug=False)
            logger.info("epoch %d finished", epoch)
        fleet.barrier_worker()   # every worker's updates are in before the evaluation

        if fleet.is_first_worker():
            fluid.io.save_persistables(exe, args.model_path, fleet.main_program)
            scope = fluid.global_scope()
            for var in auc_states:     # the servers' model on the test rows, from zero
                tensor = scope.find_var(var.name).get_tensor()
                tensor.set(np.zeros(tensor._get_dims()).astype("int64"), fluid.CPUPlace())
            test = make_dataset(data_list, [args.test_data_path], args.batch_size)
            last = exe.infer_from_dataset(program=test_program, dataset=test,
                                          fetch_list=[auc_var], fetch_info=["auc"])
            print("servers auc: %.9f" % last[0][0])
            sys.stdout.flush()
        fleet.barrier_worker()   # the others wait for the save before they leave
        if not args.no_stop_worker:
            fleet.stop_worker()
        logger.info("Distributed Train Success!")


if __name__ == '__main__':
    train(parse_args())
