"""Run under Paddle 1.8.5 (Python 3.7): open a model directory pyfleet wrote with
Fluid's own ``load_inference_model`` and print how far its prediction is from
pyfleet's. Arguments: DIR [MODEL_FILENAME PARAMS_FILENAME] FEED_NPZ (x, ids,
big: one id per sample, ref: pyfleet's prediction)."""

import sys

import numpy as np
import paddle.fluid as fluid

d, *names, feed_path = sys.argv[1:]
kw = dict(zip(("model_filename", "params_filename"), names))
exe = fluid.Executor(fluid.CPUPlace())
prog, feeds, fetches = fluid.io.load_inference_model(d, exe, **kw)
data = np.load(feed_path)
feed = {}
for n in feeds:
    if n == "x":
        feed[n] = data[n]
    else:
        feed[n] = fluid.create_lod_tensor(data[n], [[1] * len(data[n])], fluid.CPUPlace())
(out,) = exe.run(prog, feed=feed, fetch_list=fetches)
print("feeds", feeds, "fetches", [v.name for v in fetches])
print("max |diff| vs pyfleet:", float(np.abs(out - data["ref"]).max()))
