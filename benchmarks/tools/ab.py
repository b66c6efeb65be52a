"""Compare two revisions of pyfleet with one benchmark, run alternately.

    python benchmarks/tools/ab.py BASE [--new REV] [--rounds 3] -- COMMAND...

On a shared machine the absolute speed drifts by tens of percent between
runs, more than most changes are worth, so two builds are only comparable
when measured in the same minutes: this builds ``BASE`` and ``--new``
(default: the working tree's HEAD) each in a git worktree of its own (C++
core and Cython parser, Release), then runs ``COMMAND`` ``--rounds`` times
for each, alternating base, new, base, new..., with ``PYTHONPATH`` pointing at
that worktree so ``import pyfleet`` takes its code. Every output line is
printed prefixed with ``base`` or ``new``. Example::

    python benchmarks/tools/ab.py HEAD~1 -- python benchmarks/service/bench_service.py --sizes 16000

A developer's tool, not a benchmark of its own: it prints what the command
prints. The worktrees are removed at the end (``--keep`` keeps them).
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout


def _git(*args, cwd=ROOT):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def build(rev, where):
    """A worktree of ``rev`` at ``where`` with its extensions built in place."""
    _git("worktree", "add", "--detach", where, rev)
    import pybind11
    b = os.path.join(where, "build-ab")
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", where, "-B", b, *gen, "-DCMAKE_BUILD_TYPE=Release",
                    f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
                    f"-DPython_EXECUTABLE={sys.executable}"],
                   check=True, capture_output=True)
    subprocess.run(["cmake", "--build", b, "--target", "_core", "_parse"], check=True,
                   capture_output=True)
    for name, dest in (("_core", "pyfleet"), ("_parse", os.path.join("pyfleet", "data"))):
        found = glob.glob(os.path.join(b, f"{name}*.so"))
        if not found:
            raise SystemExit(f"ab.py: no {name} module built for {rev} in {b}")
        shutil.copy(found[0], os.path.join(where, dest))
    return where


# Put first on PYTHONPATH: an editable install of pyfleet (scikit-build-core's
# redirecting finder) would otherwise win over the worktree on sys.path.
_SITECUSTOMIZE = """import sys
sys.meta_path[:] = [f for f in sys.meta_path
                    if not type(f).__module__.startswith("_editable_")]
for _m in [m for m in sys.modules if m == "pyfleet" or m.startswith("pyfleet.")]:
    del sys.modules[_m]
"""


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: ab.py BASE [--new REV] [--rounds N] [--keep] -- COMMAND...")
    cut = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("--new", default="HEAD")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args(argv[:cut])
    command = argv[cut + 1:]
    if not command:
        raise SystemExit("ab.py: nothing to run after --")
    tmp = tempfile.mkdtemp(prefix="pyfleet-ab-")
    shim = os.path.join(tmp, "shim")
    os.makedirs(shim)
    with open(os.path.join(shim, "sitecustomize.py"), "w") as f:
        f.write(_SITECUSTOMIZE)
    trees = {}
    try:
        for label, rev in (("base", a.base), ("new", a.new)):
            print(f"building {label} = {rev} ({_git('rev-parse', '--short', rev)}) ...",
                  flush=True)
            trees[label] = build(rev, os.path.join(tmp, label))
        for r in range(a.rounds):
            for label, tree in trees.items():
                env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                    [shim, tree, os.environ.get("PYTHONPATH", "")]))
                out = subprocess.run(command, env=env, capture_output=True, text=True,
                                     check=False)
                for line in (out.stdout + out.stderr).splitlines():
                    print(f"{label} r{r + 1}  {line}", flush=True)
                if out.returncode:
                    print(f"{label} r{r + 1}  (exit code {out.returncode})", flush=True)
    finally:
        if not a.keep:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=ROOT,
                               capture_output=True, check=False)
            shutil.rmtree(tmp, ignore_errors=True)
            subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True,
                           check=False)
        else:
            print(f"worktrees kept in {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
