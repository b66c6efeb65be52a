# ruff: noqa: UP031  (the era's % formatting, kept as users wrote it)
"""A Fluid 1.5-era CTR DNN trainer fed by py_reader, with L2 regularization
and global-norm gradient clipping, written as the Fluid model repositories of
the time wrote it. Only the two imports differ from the Paddle original:

    import paddle                     ->  import pyfleet as paddle
    import paddle.fluid as fluid      ->  import pyfleet.fluid as fluid

Usage: python ctr_py_reader_train.py --train_data_path train.csv --model_output_dir out
"""

import argparse
import csv
import math
import sys
import zlib

import numpy as np

import pyfleet as paddle
from pyfleet import fluid

dense_feature_dim = 13
hash_dim_ = 1000001


def parse_args():
    parser = argparse.ArgumentParser(description="PaddlePaddle CTR example")
    parser.add_argument('--train_data_path', type=str, required=True)
    parser.add_argument('--batch_size', type=int, default=100)
    parser.add_argument('--embedding_size', type=int, default=10)
    parser.add_argument('--num_passes', type=int, default=2)
    parser.add_argument('--model_output_dir', type=str, default='models')
    parser.add_argument('--sparse_feature_dim', type=int, default=hash_dim_)
    parser.add_argument('--clip_norm', type=float, default=5.0)
    parser.add_argument('--l2', type=float, default=1e-4)
    return parser.parse_args()


def ctr_reader(path):
    def reader():
        with open(path) as f:
            for row in csv.DictReader(f):
                dense = [math.log1p(max(float(row["I%d" % j]), 0.0)) if row["I%d" % j] else 0.0
                         for j in range(1, 14)]
                sparse = [[zlib.crc32(("%d%s" % (j, row["C%d" % j])).encode()) % hash_dim_]
                          for j in range(1, 27)]
                yield [dense] + sparse + [[int(row["Label"])]]
    return reader


def ctr_dnn_model(embedding_size, sparse_feature_dim, l2=1e-4):
    py_reader = fluid.layers.py_reader(
        capacity=64,
        shapes=[[-1, dense_feature_dim]] + [[-1, 1]] * 26 + [[-1, 1]],
        lod_levels=[0] + [1] * 26 + [0],
        dtypes=["float32"] + ["int64"] * 26 + ["int64"],
        name="train_reader",
        use_double_buffer=True)
    words = fluid.layers.read_file(py_reader)
    dense_input = words[0]
    sparse_input_ids = words[1:27]
    label = words[-1]

    def embedding_layer(input):
        emb = fluid.layers.embedding(
            input=input,
            is_sparse=True,
            size=[sparse_feature_dim, embedding_size],
            param_attr=fluid.ParamAttr(
                name="SparseFeatFactors",
                initializer=fluid.initializer.Uniform(-0.05, 0.05),
                regularizer=fluid.regularizer.L2Decay(10 * l2)))
        return fluid.layers.sequence_pool(input=emb, pool_type='sum')

    sparse_embed_seq = list(map(embedding_layer, sparse_input_ids))
    concated = fluid.layers.concat(sparse_embed_seq + [dense_input], axis=1)
    fc1 = fluid.layers.fc(input=concated, size=40, act='relu',
                          param_attr=fluid.ParamAttr(initializer=fluid.initializer.Normal(
                              scale=1 / math.sqrt(concated.shape[1]))))
    fc2 = fluid.layers.fc(input=fc1, size=20, act='relu',
                          param_attr=fluid.ParamAttr(initializer=fluid.initializer.Normal(
                              scale=1 / math.sqrt(fc1.shape[1]))))
    predict = fluid.layers.fc(input=fc2, size=2, act='softmax',
                              param_attr=fluid.ParamAttr(initializer=fluid.initializer.Normal(
                                  scale=1 / math.sqrt(fc2.shape[1]))))
    cost = fluid.layers.cross_entropy(input=predict, label=label)
    avg_cost = fluid.layers.mean(x=cost)
    auc_var, batch_auc_var, _auc_states = fluid.layers.auc(
        input=predict, label=label, num_thresholds=2 ** 12, slide_steps=20)
    return avg_cost, auc_var, batch_auc_var, py_reader, words


def set_optimizer(avg_cost, clip_norm, l2, learning_rate=1e-2):
    fluid.clip.set_gradient_clip(fluid.clip.GradientClipByGlobalNorm(clip_norm=clip_norm))
    optimizer = fluid.optimizer.SGD(
        learning_rate=learning_rate,
        regularization=fluid.regularizer.L2DecayRegularizer(regularization_coeff=l2))
    optimizer.minimize(avg_cost)
    return optimizer


def train(args):
    avg_cost, auc_var, batch_auc_var, py_reader, _words = ctr_dnn_model(
        args.embedding_size, args.sparse_feature_dim, args.l2)
    set_optimizer(avg_cost, args.clip_norm, args.l2)

    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(fluid.default_startup_program())

    train_reader = paddle.batch(
        paddle.reader.shuffle(ctr_reader(args.train_data_path), buf_size=args.batch_size * 10),
        batch_size=args.batch_size)
    py_reader.decorate_paddle_reader(train_reader)

    exec_strategy = fluid.ExecutionStrategy()
    build_strategy = fluid.BuildStrategy()
    exec_strategy.num_threads = 1
    build_strategy.reduce_strategy = fluid.BuildStrategy.ReduceStrategy.AllReduce
    pe = fluid.compiler.CompiledProgram(fluid.default_main_program()).with_data_parallel(
        loss_name=avg_cost.name, build_strategy=build_strategy, exec_strategy=exec_strategy)

    for pass_id in range(args.num_passes):
        pass_losses = []
        py_reader.start()
        batch_id = 0
        try:
            while True:
                loss_val, auc_val, batch_auc_val = exe.run(
                    pe, fetch_list=[avg_cost.name, auc_var.name, batch_auc_var.name])
                pass_losses.append(float(loss_val))
                if batch_id % 5 == 0:
                    print("pass: %d, batch: %d, loss: %f, auc: %f, batch_auc: %f"
                          % (pass_id, batch_id, loss_val, auc_val, batch_auc_val))
                batch_id += 1
        except fluid.core.EOFException:
            py_reader.reset()
        print("pass %d mean loss %f auc %f" % (pass_id, np.mean(pass_losses), auc_val))
        model_dir = args.model_output_dir + '/pass-' + str(pass_id)
        fluid.io.save_persistables(executor=exe, dirname=model_dir)
    sys.stdout.flush()


if __name__ == '__main__':
    train(parse_args())
