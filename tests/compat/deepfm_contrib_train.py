# ruff: noqa: UP031  (the era's % formatting, kept as users wrote it)
"""A Fluid 1.6-era DeepFM trainer with fluid.contrib imports, batch_norm on the
dense features and dropout in the deep part, written as the model repositories
of the time wrote it. Only the imports differ from the Paddle original:

    import paddle                     ->  import pyfleet as paddle
    import paddle.fluid as fluid      ->  import pyfleet.fluid as fluid
    from paddle.fluid.contrib...      ->  from pyfleet.fluid.contrib...

Usage: python deepfm_contrib_train.py --train_data_path train.csv --num_passes 2
"""

import argparse
import csv
import math
import zlib

import numpy as np

import pyfleet as paddle
from pyfleet import fluid
from pyfleet.fluid.contrib.layers import fused_embedding_seq_pool
from pyfleet.fluid.contrib.utils import lookup_table_utils  # noqa: F401 (as infer.py shares it)

fluid.require_version('1.6.0')

num_field = 26
dense_dim = 13
hash_dim = 1000001


def parse_args():
    parser = argparse.ArgumentParser(description="PaddlePaddle DeepFM example")
    parser.add_argument('--train_data_path', type=str, required=True)
    parser.add_argument('--batch_size', type=int, default=100)
    parser.add_argument('--embedding_size', type=int, default=8)
    parser.add_argument('--num_passes', type=int, default=2)
    parser.add_argument('--learning_rate', type=float, default=1e-3)
    parser.add_argument('--model_output_dir', type=str, default='')
    return parser.parse_args()


def data_reader(path):
    def reader():
        with open(path) as f:
            for row in csv.DictReader(f):
                dense = [math.log1p(max(float(row["I%d" % j]), 0.0)) if row["I%d" % j] else 0.0
                         for j in range(1, 14)]
                sparse = [[zlib.crc32(("%d%s" % (j, row["C%d" % j])).encode()) % hash_dim]
                          for j in range(1, 27)]
                yield [dense] + sparse + [[int(row["Label"])]]
    return reader


def deepfm(embedding_size, is_test=False):
    dense_input = fluid.layers.data(name="dense_input", shape=[dense_dim], dtype='float32')
    sparse_inputs = [fluid.layers.data(name="C" + str(i), shape=[1], lod_level=1,
                                       dtype='int64') for i in range(1, num_field + 1)]
    label = fluid.layers.data(name='label', shape=[1], dtype='int64')

    # first order: one weight per feature, summed per slot by the fused op
    first_weights = [fused_embedding_seq_pool(
        input=s, size=[hash_dim, 1], is_sparse=True,
        param_attr=fluid.ParamAttr(name="first_order_weight",
                                   initializer=fluid.initializer.Uniform(-0.01, 0.01)))
        for s in sparse_inputs]
    y_first_order = fluid.layers.reduce_sum(fluid.layers.concat(first_weights, axis=1),
                                            dim=1, keep_dim=True)

    # second order: the factorization machine over the slots' embeddings
    embs = [fluid.layers.sequence_pool(input=fluid.layers.embedding(
        input=s, size=[hash_dim, embedding_size], is_sparse=True,
        param_attr=fluid.ParamAttr(name="feat_embeddings",
                                   initializer=fluid.initializer.Uniform(-0.05, 0.05))),
        pool_type='sum') for s in sparse_inputs]
    feat_embeddings = fluid.layers.reshape(fluid.layers.concat(embs, axis=1),
                                           [-1, num_field, embedding_size])
    summed_features_emb_square = fluid.layers.square(
        fluid.layers.reduce_sum(feat_embeddings, dim=1))
    squared_sum_features_emb = fluid.layers.reduce_sum(fluid.layers.square(feat_embeddings),
                                                       dim=1)
    y_second_order = 0.5 * fluid.layers.reduce_sum(
        summed_features_emb_square - squared_sum_features_emb, dim=1, keep_dim=True)

    # deep part: normalized dense features beside the embeddings
    dense_bn = fluid.layers.batch_norm(input=dense_input, is_test=is_test, momentum=0.99)
    y_dnn = fluid.layers.concat(
        [fluid.layers.reshape(feat_embeddings, [-1, num_field * embedding_size]), dense_bn],
        axis=1)
    for size in (64, 32):
        y_dnn = fluid.layers.fc(input=y_dnn, size=size, act='relu',
                                param_attr=fluid.ParamAttr(
                                    initializer=fluid.initializer.Normal(
                                        scale=1 / math.sqrt(y_dnn.shape[1]))))
        y_dnn = fluid.layers.dropout(y_dnn, dropout_prob=0.1, is_test=is_test,
                                     dropout_implementation="upscale_in_train")
    y_dnn = fluid.layers.fc(input=y_dnn, size=1, act=None)

    predict = fluid.layers.sigmoid(y_first_order + y_second_order + y_dnn)
    cost = fluid.layers.log_loss(input=predict,
                                 label=fluid.layers.cast(label, dtype="float32"))
    avg_cost = fluid.layers.mean(x=cost)
    predict_2d = fluid.layers.concat([1 - predict, predict], 1)
    auc_var, batch_auc_var, _auc_states = fluid.layers.auc(input=predict_2d, label=label,
                                                          num_thresholds=2 ** 12,
                                                          slide_steps=20)
    return [dense_input] + sparse_inputs + [label], avg_cost, auc_var, batch_auc_var, predict


def train(args):
    feed_vars, avg_cost, auc_var, batch_auc_var, predict = deepfm(args.embedding_size)
    test_program = fluid.default_main_program().clone(for_test=True)
    optimizer = fluid.optimizer.Adam(learning_rate=args.learning_rate)
    optimizer.minimize(avg_cost)

    place = fluid.CPUPlace()
    exe = fluid.Executor(place)
    exe.run(fluid.default_startup_program())
    feeder = fluid.DataFeeder(feed_list=feed_vars, place=place)
    train_reader = paddle.batch(
        paddle.reader.shuffle(data_reader(args.train_data_path), buf_size=args.batch_size * 5),
        batch_size=args.batch_size)

    for pass_id in range(args.num_passes):
        losses = []
        for batch_id, data in enumerate(feeder.decorate_reader(train_reader,
                                                               multi_devices=False)()):
            loss_val, auc_val, batch_auc_val = exe.run(
                fluid.default_main_program(), feed=data,
                fetch_list=[avg_cost, auc_var, batch_auc_var])
            losses.append(float(loss_val))
            if batch_id % 5 == 0:
                print("pass: %d, batch: %d, loss: %f, auc: %f, batch_auc: %f"
                      % (pass_id, batch_id, loss_val, auc_val, batch_auc_val))
        print("pass %d mean loss %f auc %f" % (pass_id, np.mean(losses), auc_val[0]))

    test_reader = paddle.batch(data_reader(args.train_data_path), batch_size=500)
    preds = []
    for data in test_reader():
        p, = exe.run(test_program, feed=feeder.feed(data), fetch_list=[predict])
        preds.append(p)
    print("test predictions %d mean %f" % (sum(len(p) for p in preds),
                                           np.concatenate(preds).mean()))
    if args.model_output_dir:
        fluid.io.save_inference_model(args.model_output_dir,
                                      [v.name for v in feed_vars[:-1]], [predict], exe)


if __name__ == '__main__':
    args = parse_args()
    train(args)
