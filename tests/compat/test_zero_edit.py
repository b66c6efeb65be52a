"""Zero-edit mode (pyfleet.as_paddle): under ``pyfleet run`` and ``pyfleet.launch
--paddle`` every import form of ``paddle`` is pyfleet, in the process and in
every Python process it starts; outside them nothing named ``paddle`` comes from
pyfleet, and a real ``paddle`` (a stand-in package here) is what Python finds.
Every check runs real interpreters."""

import os
import re
import subprocess
import sys
import textwrap

import pytest
from support import REPO

JOB = REPO / "tests" / "compat" / "paddle_unchanged_fleet_job.py"
PYFLEET = [sys.executable, "-m", "pyfleet.cli"]


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYFLEET_", "PADDLE_", "TRAINING_ROLE"))}
    env.pop("PYTHONPATH", None)
    env.update(OPENBLAS_NUM_THREADS="1", **extra)
    return env


def _run(cmd, cwd, env=None, timeout=120):
    r = subprocess.run(cmd, cwd=cwd, env=env or _env(), capture_output=True, text=True,
                       timeout=timeout, check=False)
    return r.returncode, r.stdout, r.stderr


SCRIPT = textwrap.dedent('''
    import subprocess, sys
    import paddle
    import paddle.fluid as fluid
    from paddle import fluid as fluid2
    from paddle.fluid.incubate.fleet.parameter_server.distribute_transpiler import fleet
    from paddle.fluid.incubate.fleet.parameter_server.distribute_transpiler.distributed_strategy import StrategyFactory
    from paddle.fluid.layers.tensor import Variable
    import paddle.fluid.layers.nn as nn
    import paddle.fluid.incubate.data_generator as dg
    from paddle.fluid.initializer import Constant      # pyfleet.fluid re-exports it
    from paddle.fluid.layer_helper import LayerHelper
    import pyfleet, pyfleet.fluid, pyfleet.reader
    from pyfleet.distributed import strategy
    checks = {
        "paddle": paddle is pyfleet, "fluid": fluid is pyfleet.fluid and fluid2 is fluid,
        "fleet": fleet is pyfleet.fleet, "strategy": StrategyFactory is strategy.StrategyFactory,
        "reader": paddle.reader is pyfleet.reader, "batch": paddle.batch is pyfleet.batch,
        "variable": Variable is pyfleet.fluid.framework.Variable, "nn": nn.fc is fluid.layers.fc,
        "dg": dg.MultiSlotDataGenerator is not None,
        "layers.nn": fluid.layers.nn.topk is fluid.layers.topk,   # attributes, as in Fluid
        "layer_helper": LayerHelper("x").layer_type == "x",
        "initializer": Constant is pyfleet.initializer.Constant
        and sys.modules["paddle.fluid.initializer"] is pyfleet.initializer,
    }
    print("argv", sys.argv[1:])
    print("checks", sorted(k for k, v in checks.items() if not v) or "all true")
    if len(sys.argv) > 1 and sys.argv[1] == "nest":   # a child, which starts a grandchild
        out = subprocess.run([sys.executable, __file__, "leaf"], capture_output=True,
                             text=True, check=True).stdout
        print("child:", out.replace("\\n", " | "))
    sys.exit(3 if len(sys.argv) > 2 else 0)
''')


def test_pyfleet_run_makes_every_import_form_pyfleet_in_children_too(tmp_path):
    (tmp_path / "script.py").write_text(SCRIPT)
    code, out, err = _run([*PYFLEET, "run", "script.py", "nest"], tmp_path)
    assert code == 0, err
    assert "argv ['nest']" in out
    assert out.count("checks all true") == 2, out        # the script and its child
    assert "child: argv ['leaf'] | checks all true" in out
    code, out, err = _run([*PYFLEET, "run", "script.py", "nest", "x"], tmp_path)
    assert code == 3, "the script's exit code is pyfleet run's"


def test_pyfleet_run_dash_m_runs_a_module(tmp_path):
    (tmp_path / "mymod.py").write_text(SCRIPT)
    code, out, err = _run([*PYFLEET, "run", "-m", "mymod", "a", "-m", "b"], tmp_path,
                          env=_env(PYTHONPATH=str(tmp_path)))
    assert code == 3, err                                # (three arguments: exit 3)
    assert "argv ['a', '-m', 'b']" in out and "checks all true" in out


def test_pyfleet_run_usage_errors_name_the_problem(tmp_path):
    for argv, match in ((["run"], "name a script"), (["run", "missing.py"], "no such script"),
                        (["run", "-m"], "name the module"), (["run", "--x", "s.py"],
                                                             "unknown option '--x'")):
        code, _, err = _run([*PYFLEET, *argv], tmp_path)
        assert code == 2 and match in err, (argv, err)


def test_import_paddle_alone_reaches_paddle_dataset_reader_and_compat(tmp_path):
    """Fluid's ``import paddle`` imports ``paddle.dataset``, ``paddle.reader`` and
    ``paddle.compat``: Paddle's
    ctr_dataset_reader.py calls ``paddle.dataset.common.download`` with nothing else
    imported. A fresh interpreter, so no earlier import has set the attribute."""
    (tmp_path / "data.txt").write_bytes(b"abc")
    (tmp_path / "s.py").write_text(
        "import hashlib, paddle\n"
        "print(paddle.dataset.common.md5file('data.txt') == hashlib.md5(b'abc').hexdigest())\n"
        "print(paddle.dataset.common.DATA_HOME.endswith('.cache/paddle/dataset'))\n"
        "print(callable(paddle.reader.shuffle), callable(paddle.batch))\n"
        "print(paddle.compat.to_text(b'ok'))\n"
        "import paddle.compat as cpt\n"            # Paddle's test_dist_base.py, at import time
        "print(cpt is paddle.compat)\n")
    code, out, err = _run([*PYFLEET, "run", "s.py"], tmp_path)
    assert code == 0, err
    assert out.split() == ["True", "True", "True", "True", "ok", "True"], out


def _fake_real_paddle(tmp_path):
    real = tmp_path / "site" / "paddle"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n__version__ = '1.8.5'\n")
    return tmp_path / "site"


def test_a_real_paddle_wins_outside_the_mode_and_loses_inside(tmp_path):
    site = _fake_real_paddle(tmp_path)
    probe = "import paddle; print(getattr(paddle, 'REAL', False), paddle.__name__)"
    (tmp_path / "probe.py").write_text(probe + "\n")
    env = _env(PYTHONPATH=str(site))
    code, out, _ = _run([sys.executable, "probe.py"], tmp_path, env=env)
    assert (code, out.strip()) == (0, "True paddle")            # outside: the real one
    code, out, err = _run([*PYFLEET, "run", "probe.py"], tmp_path, env=env)
    assert (code, out.strip()) == (0, "False pyfleet")          # inside: pyfleet
    assert "a paddle is installed" in err and str(site) in err  # and says so
    # a real paddle imported before activate() is refused by name
    code, _, err = _run([sys.executable, "-c", "import paddle; from pyfleet import as_paddle; "
                         "as_paddle.activate()"], tmp_path, env=env)
    assert code != 0 and "a real paddle" in err and "imported already" in err


def test_nothing_named_paddle_comes_from_pyfleet_outside_the_mode(tmp_path):
    code, out, err = _run([sys.executable, "-c", "import importlib.util, pyfleet; "
                           "s = importlib.util.find_spec('paddle'); "
                           "print(s.origin if s else None)"], tmp_path)
    assert code == 0, err
    origin = out.strip()
    assert origin == "None" or "pyfleet" not in origin, origin


def test_a_paddle_path_pyfleet_lacks_names_the_module_it_looked_for(tmp_path):
    (tmp_path / "s.py").write_text("import paddle.fluid.no_such_module\n")
    code, _, err = _run([*PYFLEET, "run", "s.py"], tmp_path)
    assert code == 1
    assert "No module named 'paddle.fluid.no_such_module'" in err
    assert "'pyfleet.fluid.no_such_module'" in err
    (tmp_path / "t.py").write_text("import paddle.fluid.layers.tensor as t\nt.no_such_layer\n")
    code, _, err = _run([*PYFLEET, "run", "t.py"], tmp_path)
    assert code == 1 and "has no attribute 'no_such_layer'" in err


def test_fluid_layers_submodule_names_do_not_shadow_pyfleet_layers():
    """Importing ``paddle.fluid.layers.<m>`` sets ``layers.<m>``: none of Fluid's
    layers sub-module names may be one of pyfleet's working layer names (``rnn``,
    both a module and a function in Fluid 1.8, is a refused name's placeholder)."""
    import pyfleet.fluid.layers as layers
    from pyfleet.fluid.refusals import is_refused
    fluid_submodules = ("collective", "control_flow", "detection", "device", "distributions",
                        "io", "layer_function_generator", "learning_rate_scheduler", "loss",
                        "math_op_patch", "metric_op", "nn", "ops", "rnn", "sequence_lod",
                        "tensor", "utils")
    assert [m for m in fluid_submodules
            if m in vars(layers) and not is_refused(vars(layers)[m])] == []


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["sync", "async"])
def test_launcher_paddle_runs_an_unchanged_fleet_job(tmp_path, strategy):
    code, out, err = _run([sys.executable, "-m", "pyfleet.launch", "--paddle", "--servers",
                           "2", "--workers", "2", "--timeout", "200", str(JOB),
                           "--strategy", strategy], tmp_path, timeout=260)
    text = out + err
    assert code == 0, text[-4000:]
    for role in ("worker.0", "worker.1", "server.0", "server.1"):
        assert f"[{role}] role done" in text, role        # stop_worker() on every role
    firsts = re.findall(r"first fetch: \[array\(\[([-\d.e]+)\], dtype=float32\)\]", text)
    lasts = [float(v) for v in re.findall(r"last loss: ([-\d.e]+)", text)]
    assert len(firsts) == 2 and len(lasts) == 2, text[-3000:]
    assert all(last < float(first) / 4 for first, last in zip(firsts, lasts)), (firsts, lasts)
    assert text.count("child imports: pyfleet.fluid pyfleet") == 2
