"""Run Paddle's own Fleet unit tests (python/paddle/fluid/tests/unittests/ of a
Fluid 1.x release) unchanged under pyfleet's zero-edit mode and print a table.

    python tools/paddle_fleet_tests.py --tests-dir fleet-tests [--only test_dist_fleet_ctr]

``--tests-dir`` holds one directory per release (``1.5/``, ``1.7/``: its name
labels the rows), each with that release's test files as Paddle's repository
has them (``test_dist_fleet_base.py``, ``dist_fleet_ctr.py``,
``ctr_dataset_reader.py``, ``test_dist_fleet_*.py``, ...), or the test files
themselves. Nothing there is written: each release is copied to ``--work``.

Every ``test_*.py`` file other than a base is run one test class at a time, as
``pyfleet run -m unittest -v FILE.CLASS`` in the copy, so ``import paddle``
is pyfleet there and in the servers and trainers the test starts. A model file
(``dist_fleet_*.py``) no test file of its release names, or named by ``--drive``,
is driven the way Paddle's own ``test_dist_fleet_*.py`` drove it: the release's
``TestFleetBase.check_with_place(model)``, once in sync and once in async mode
(a 1.7-style base: also geo), through the base's PyReader path.

Paddle's bases of that era never look at their trainers' exit codes: a test
whose trainers died still reports OK. So a class passes here only when
unittest reports OK **and** none of the role logs the base writes
(``ps0_err.log`` ... ``tr1_err.log``, in ``$TMPDIR`` or ``/tmp``) holds a
Python traceback; the table gives the last line of the first traceback met.
A class is refused when that line is pyfleet's ``UnsupportedError`` (the name
and the reason).

Data: ``ctr_dataset_reader.py`` fetches ``avazu_ctr_data.tgz`` from Paddle's
download server through ``paddle.dataset.common.download``, which pyfleet never
does. Put the real file (MD5 ``c11df99f...``) where Paddle caches it,
``~/.cache/paddle/dataset/avazu_ctr_data/``, to run on it;
without it the roles get a synthetic file of the same format (the ``.meta``
dimensions, ``ids<TAB>id:1 ...<TAB>click`` lines) from a ``sitecustomize``
the tool puts on ``PYTHONPATH`` that answers that one download, and the table
says so.
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time

import numpy as np

from pyfleet.dataset.common import DATA_HOME, md5file  # Paddle's cache directory too

AVAZU_URL = "http://paddle-ctr-data.bj.bcebos.com/avazu_ctr_data.tgz"
AVAZU_MD5 = "c11df99fbd14e53cd4bfa6567344b26e"
BASES = ("test_dist_fleet_base.py", "test_dist_base.py", "test_dist_fleet_heter_base.py")
ROLE_LOGS = ("ps0_err.log", "ps1_err.log", "tr0_err.log", "tr1_err.log")

SITECUSTOMIZE = '''\
"""Written by tools/paddle_fleet_tests.py: answers Paddle's download of the avazu
CTR sample with a synthetic file of its format (the download server is out of
reach). Any other download goes to pyfleet's paddle.dataset.common.download.
The patch is made when the code under test imports that module, never before."""
import importlib.abc
import importlib.machinery
import sys

_STANDIN = {standin!r}
_URL = {url!r}
_MODULE = "pyfleet.dataset.common"


class _Patch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            download = module.download

            def standin(url, module_name, md5sum, save_name=None):
                if url == _URL:
                    return _STANDIN
                return download(url, module_name, md5sum, save_name)

            module.download = standin

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Patch())
'''


def write_standin_avazu(root, rows=4000, dnn_dim=10000, lr_dim=10000, seed=0):
    """``root/avazu_ctr_data.tgz`` holding ``avazu_ctr_data/{data.meta.txt,
    train.txt, test.txt, infer.txt}`` in the layout ctr_dataset_reader reads; the
    label depends on the ids, so a model can learn something."""
    rng = np.random.default_rng(seed)
    src = os.path.join(root, "avazu_ctr_data")
    os.makedirs(src, exist_ok=True)
    with open(os.path.join(src, "data.meta.txt"), "w") as f:
        f.write(f"dnn_input_dim: {dnn_dim}\nlr_input_dim: {lr_dim}\n")
    for name, n in (("train.txt", rows), ("test.txt", rows // 4), ("infer.txt", rows // 4)):
        deep = rng.integers(0, dnn_dim, size=(n, 16))
        wide = rng.integers(0, lr_dim, size=(n, 8))
        click = ((deep[:, 0] % 7 + wide[:, 0] % 5) > 6).astype(int)
        with open(os.path.join(src, name), "w") as f:
            for d, w, c in zip(deep, wide, click):
                f.write(" ".join(map(str, d)) + "\t" + " ".join(f"{i}:1" for i in w)
                        + f"\t{c}\n")
    tgz = os.path.join(root, "avazu_ctr_data.tgz")
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(src, arcname="avazu_ctr_data")
    return tgz       # the extracted directory stays beside it, as after Paddle's first run


def _test_classes(path):
    """Names of the classes of ``path`` that define a ``test_*`` method."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    return [node.name for node in tree.body if isinstance(node, ast.ClassDef)
            and any(isinstance(f, ast.FunctionDef) and f.name.startswith("test")
                    for f in node.body)]


DRIVER = '''\
"""Written by tools/paddle_fleet_tests.py: drives {model} the way Paddle's
test_dist_fleet_*.py files of this release drove their model files."""
import unittest
from test_dist_fleet_base import TestFleetBase
{classes}

if __name__ == "__main__":
    unittest.main()
'''

DRIVEN_CLASS = '''

class {name}(TestFleetBase):
    def _setup_config(self):
        self._sync_mode = {sync}
        self._mode = "{mode}"
        self._reader = "{reader}"

    def test_dist_train(self):
        self.check_with_place("{model}", delta=1e-5, check_error_log=False)
'''


def driver_source(model, base_text):
    """A test file driving ``model``: sync and async; with a 1.7-style base (modes and
    readers) also geo, each through the base's PyReader path, which no test file of the
    dataset-reader kind covers."""
    modes = ["sync", "async"]
    if "geo_sgd_need_push_nums" in base_text:
        modes.append("geo")
    classes = "".join(DRIVEN_CLASS.format(name=m.capitalize(), sync=m == "sync", mode=m,
                                          reader="pyreader", model=model) for m in modes)
    return DRIVER.format(model=model, classes=classes)

TRACE_END = re.compile(r"^(\w+(?:\.\w+)*(?:Error|Exception|Exit|Interrupt|Refused)\b.*)$", re.M)


def _first_traceback(logs):
    """``(log name, last line of its first traceback)`` or None."""
    for path in logs:
        try:
            text = open(path, errors="replace").read()
        except OSError:
            continue
        if "Traceback (most recent call last)" not in text:
            continue
        tail = text.split("Traceback (most recent call last)", 1)[1]
        found = TRACE_END.search(tail)
        line = found.group(1) if found else tail.strip().splitlines()[-1]
        return os.path.basename(path), line.strip()
    return None


def _unittest_outcome(text):
    ran = re.search(r"Ran (\d+) tests?", text)
    if ran is None:
        return "errors", 0
    if re.search(r"^OK\b", text, re.M):
        skipped = re.search(r"skipped=(\d+)", text)
        return ("skipped" if skipped and int(skipped.group(1)) == int(ran.group(1))
                else "passed"), int(ran.group(1))
    if re.search(r"failures=\d+", text) and not re.search(r"errors=\d+", text):
        return "failed", int(ran.group(1))
    return "errors", int(ran.group(1))


def run_class(work, module, cls, env, timeout):
    tmp = os.path.join(work, "tmp", f"{module}.{cls}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    legacy = [os.path.join("/tmp", name) for name in ROLE_LOGS]   # 1.5's bases write there
    before = {p: os.path.getmtime(p) for p in legacy if os.path.exists(p)}
    cmd = [sys.executable, "-m", "pyfleet.cli", "run", "-m", "unittest", "-v", f"{module}.{cls}"]
    t = time.time()
    try:
        r = subprocess.run(cmd, cwd=work, env=dict(env, TMPDIR=tmp), capture_output=True,
                           text=True, timeout=timeout, check=False)
        text, code = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout or b""
        text = (out.decode(errors="replace") if isinstance(out, bytes) else out) + \
            f"\ntimed out after {timeout} s"
        code = 124
    secs = time.time() - t
    logs = [os.path.join(tmp, name) for name in ROLE_LOGS]
    for path in legacy:
        if os.path.exists(path) and os.path.getmtime(path) != before.get(path):
            shutil.copy(path, os.path.join(tmp, "legacy_" + os.path.basename(path)))
            logs.append(os.path.join(tmp, "legacy_" + os.path.basename(path)))
    with open(os.path.join(tmp, "unittest.log"), "w") as f:
        f.write(text)
    outcome, ran = _unittest_outcome(text)
    if code == 124:
        outcome = "errors"
    why = None
    role = _first_traceback(logs)
    if outcome == "passed" and role is not None:
        outcome = "errors"
    if outcome != "passed":
        if role is not None:
            why = f"{role[0].replace('legacy_', '').replace('_err.log', '')}: {role[1]}"
        else:
            found = TRACE_END.findall(text)
            why = found[-1] if found else ("timed out" if code == 124 else f"exit code {code}")
    if why and "UnsupportedError" in why:
        outcome = "refused"
    return {"module": module, "class": cls, "outcome": outcome, "ran": ran, "why": why,
            "seconds": round(secs, 1)}


def run_release(label, src, work, env, timeout, only, drive=()):
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(src, work)
    files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(work, "*.py")))
    tests = [f for f in files if f.startswith("test_") and f not in BASES]
    text = {f: open(os.path.join(work, f), encoding="utf-8").read() for f in tests}
    if "test_dist_fleet_base.py" in files:
        base = open(os.path.join(work, "test_dist_fleet_base.py"), encoding="utf-8").read()
        for model in (f for f in files if f.startswith("dist_fleet_")):
            if model in drive or not any(model in t for t in text.values()):
                driver = f"test_drive_{model}"
                with open(os.path.join(work, driver), "w") as f:
                    f.write(driver_source(model, base))
                tests.append(driver)
    rows = []
    for test in tests:
        module = test[:-3]
        if only and not any(o in module for o in only):
            continue
        for cls in _test_classes(os.path.join(work, test)) or ["(none)"]:
            print(f"{label} {module}.{cls} ...", file=sys.stderr, flush=True)
            if cls == "(none)":
                row = {"module": module, "class": cls, "outcome": "errors", "ran": 0,
                       "why": "no test class", "seconds": 0}
            else:
                row = run_class(work, module, cls, env, timeout)
            row["release"] = label
            rows.append(row)
            print(f"  {row['outcome']} {row['why'] or ''}", file=sys.stderr, flush=True)
    return rows


def table(rows, standin):
    lines = ["| release | test file | class | result | first failure (role: last line) |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        name = r["module"] + ".py"
        if name.startswith("test_drive_"):
            name = name[len("test_drive_"):] + " (driven by the release's TestFleetBase)"
        why = " ".join(str(r["why"] or "").split())[:170]
        lines.append(f"| {r['release']} | {name} | {r['class']} | {r['outcome']} | {why} |")
    counts = {}
    for r in rows:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    lines.append("")
    lines.append(", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) +
                 (" (avazu data: the synthetic stand-in)" if standin else " (avazu data: real)"))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tests-dir", required=True,
                   help="one directory per release (or the test files of one)")
    p.add_argument("--work", default="paddle-fleet-tests", help="work directory (recreated)")
    p.add_argument("--only", nargs="*", default=None, help="test files whose name holds one")
    p.add_argument("--timeout", type=float, default=300, help="seconds a test class may take")
    p.add_argument("--drive", nargs="*", default=["dist_fleet_ctr.py"],
                   help="model files driven through the base even when a test file names "
                        "them (default: dist_fleet_ctr.py, whose PyReader path 1.7's "
                        "test_dist_fleet_ctr.py covered)")
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    a = p.parse_args(argv)
    work = os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    src = os.path.abspath(a.tests_dir)
    releases = [(os.path.basename(src), src)] if glob.glob(os.path.join(src, "*.py")) else \
        [(d, os.path.join(src, d)) for d in sorted(os.listdir(src))
         if os.path.isdir(os.path.join(src, d))]

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYFLEET_", "PADDLE_", "TRAINING_ROLE"))}
    # The tests' pipe commands say `python`: this interpreter's.
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    real = os.path.join(DATA_HOME, "avazu_ctr_data", "avazu_ctr_data.tgz")
    standin = not (os.path.isfile(real) and md5file(real) == AVAZU_MD5)
    if standin:
        site = os.path.join(work, "standin")
        os.makedirs(site)
        tgz = write_standin_avazu(site)
        with open(os.path.join(site, "sitecustomize.py"), "w") as f:
            f.write(SITECUSTOMIZE.format(standin=tgz, url=AVAZU_URL))
        env["PYTHONPATH"] = os.pathsep.join([site, *[q for q in env.get("PYTHONPATH", "")
                                                     .split(os.pathsep) if q]])
    rows = []
    for label, path in releases:
        rows += run_release(label, path, os.path.join(work, label), env, a.timeout, a.only,
                            a.drive)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(table(rows, standin))
    print(f"\n(logs under {work}/<release>/tmp/; load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
