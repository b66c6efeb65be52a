# ruff: noqa: UP031, RUF059, SIM117  (the era's style, kept as users wrote it)
"""The era's infer.py (PaddleRec ctr/dnn): builds the network in a plain local
program, loads the Fleet job's checkpoint with ``fluid.io.load_persistables``,
resets the AUC states through the scope and evaluates without servers. Only the
imports differ from the Paddle original. Prints ``infer auc: A``."""


import argparse
import os
import sys

import numpy as np

import pyfleet as paddle
from pyfleet import fluid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import criteo_reader as reader
from ctr_dataset_fleet_train import ctr_dnn_model


def parse_args():
    parser = argparse.ArgumentParser(description="PaddlePaddle CTR infer")
    parser.add_argument('--test_data_path', type=str, required=True)
    parser.add_argument('--model_path', type=str, default='models')
    parser.add_argument('--batch_size', type=int, default=64)
    parser.add_argument('--embedding_size', type=int, default=8)
    parser.add_argument('--sparse_feature_dim', type=int, default=1000001)
    return parser.parse_args()


def infer():
    args = parse_args()
    place = fluid.CPUPlace()
    inference_scope = fluid.Scope()

    dataset = reader.CriteoDataset()
    test_reader = paddle.batch(dataset.test([args.test_data_path]),
                               batch_size=args.batch_size)

    startup_program = fluid.framework.Program()
    test_program = fluid.framework.Program()
    with fluid.scope_guard(inference_scope):
        with fluid.framework.program_guard(test_program, startup_program):
            loss, auc_var, batch_auc_var, auc_states, data_list = ctr_dnn_model(
                args.embedding_size, args.sparse_feature_dim)

            exe = fluid.Executor(place)
            feeder = fluid.DataFeeder(feed_list=data_list, place=place)
            fluid.io.load_persistables(executor=exe, dirname=args.model_path,
                                       main_program=fluid.default_main_program())

            def set_zero(var_name):
                param = inference_scope.var(var_name).get_tensor()
                param_array = np.zeros(param._get_dims()).astype("int64")
                param.set(param_array, place)

            for var in auc_states:
                set_zero(var.name)

            for batch_id, data in enumerate(test_reader()):
                loss_val, auc_val = exe.run(test_program, feed=feeder.feed(data),
                                            fetch_list=[loss, auc_var])
                if batch_id % 10 == 0:
                    print(f"TEST --> batch: {batch_id} loss: {loss_val / args.batch_size} auc: {auc_val}")
            print("infer auc: %.9f" % auc_val)


if __name__ == '__main__':
    infer()
