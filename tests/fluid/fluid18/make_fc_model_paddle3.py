"""Run under paddlepaddle 3.x: write ``data/paddle3_fc`` (two fc layers saved by
``paddle.static.save_inference_model`` in the ProgramDesc layout,
``FLAGS_enable_pir_api=0``: ``m.pdmodel`` and the combined ``m.pdiparams``) and
``io.npz`` (an input and Paddle's prediction). Argument: the output directory."""

import os
import sys

os.environ["FLAGS_ENABLE_PIR_API"] = "0"

import numpy as np  # noqa: E402
import paddle  # noqa: E402

out = sys.argv[1]
paddle.enable_static()
main, start = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, start):
    x = paddle.static.data("x", [-1, 4], "float32")
    h = paddle.static.nn.fc(x, 8, activation="relu")
    y = paddle.static.nn.fc(h, 1, activation="sigmoid")
exe = paddle.static.Executor(paddle.CPUPlace())
exe.run(start)
xv = np.random.rand(3, 4).astype("float32")
(ref,) = exe.run(main, feed={"x": xv}, fetch_list=[y])
paddle.static.save_inference_model(os.path.join(out, "m"), [x], [y], exe, program=main)
np.savez(os.path.join(out, "io.npz"), x=xv, ref=ref)
