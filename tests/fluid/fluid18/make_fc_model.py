"""Run under Paddle 1.8.5 (Python 3.7): write ``data/fluid18_fc`` (a small
embedding + fc network saved by Fluid's ``save_inference_model``, one file per
parameter and combined) and ``io.npz`` (an input and Fluid's prediction)."""

import sys

import numpy as np
import paddle.fluid as fluid

out = sys.argv[1]
main, start = fluid.Program(), fluid.Program()
main.random_seed = start.random_seed = 7
with fluid.program_guard(main, start):
    x = fluid.layers.data("x", shape=[4], dtype="float32")
    ids = fluid.layers.data("ids", shape=[1], dtype="int64", lod_level=1)
    emb = fluid.layers.embedding(ids, size=[50, 3], is_sparse=True)
    pooled = fluid.layers.sequence_pool(emb, "sum")
    h = fluid.layers.fc(fluid.layers.concat([x, pooled], axis=1), 8, act="relu")
    pred = fluid.layers.fc(h, 1, act="sigmoid")
exe = fluid.Executor(fluid.CPUPlace())
exe.run(start)
rng = np.random.RandomState(0)
xv = rng.rand(5, 4).astype("float32")
lens = [1, 2, 1, 3, 1]
idv = rng.randint(0, 50, size=(sum(lens), 1)).astype("int64")
t = fluid.create_lod_tensor(idv, [lens], fluid.CPUPlace())
(ref,) = exe.run(main, feed={"x": xv, "ids": t}, fetch_list=[pred])
fluid.io.save_inference_model(out + "/separate", ["x", "ids"], [pred], exe, main)
fluid.io.save_inference_model(out + "/combined", ["x", "ids"], [pred], exe, main,
                              model_filename="model", params_filename="params")
np.savez(out + "/io.npz", x=xv, ids=idv, lens=np.array(lens), pred=ref)
