"""Run under a current paddlepaddle (3.x): open a model directory pyfleet wrote
with ``paddle.static.load_inference_model`` (its loader of Fluid's ProgramDesc
layout, ``FLAGS_enable_pir_api=0``) and with the C++ predictor
(``paddle.inference``, combined parameters only) and print how far each
prediction is from pyfleet's. Arguments: DIR [MODEL_FILENAME PARAMS_FILENAME]
FEED_NPZ (x, ids, big: one id per sample, ref: pyfleet's prediction)."""

import os
import sys

os.environ.setdefault("FLAGS_enable_pir_api", "0")

import numpy as np  # noqa: E402
import paddle  # noqa: E402

d, *names, feed_path = sys.argv[1:]
data = np.load(feed_path)
paddle.enable_static()
exe = paddle.static.Executor(paddle.CPUPlace())
kw = dict(zip(("model_filename", "params_filename"), names)) or {"model_filename": None}
prog, feeds, fetches = paddle.static.load_inference_model(d, exe, **kw)
feed = {}
for n in feeds:
    if n == "x":
        feed[n] = data[n]
    else:
        t = paddle.base.core.LoDTensor()
        t.set(data[n], paddle.CPUPlace())
        t.set_recursive_sequence_lengths([[1] * len(data[n])])
        feed[n] = t
(out,) = exe.run(prog, feed=feed, fetch_list=fetches)
print("paddle", paddle.__version__, "load_inference_model: max |diff| vs pyfleet:",
      float(np.abs(np.asarray(out) - data["ref"]).max()))
if names:
    import paddle.inference as pi
    cfg = pi.Config(os.path.join(d, names[0]), os.path.join(d, names[1]))
    cfg.disable_gpu()
    pred = pi.create_predictor(cfg)
    for n in pred.get_input_names():
        h = pred.get_input_handle(n)
        h.copy_from_cpu(data[n])
        if n != "x":
            h.set_lod([list(range(len(data[n]) + 1))])
    pred.run()
    out = pred.get_output_handle(pred.get_output_names()[0]).copy_to_cpu()
    print("paddle.inference predictor: max |diff| vs pyfleet:",
          float(np.abs(out - data["ref"]).max()))
