"""``pyfleet run``: run Fleet-era code unchanged, with ``paddle`` resolving to pyfleet.

    pyfleet run script.py [args...]
    pyfleet run -m paddlerec.run -m config.yaml

The command replaces itself with ``python script.py args...`` (or ``python -m
module args...``), this Python, with pyfleet's ``paddle`` shim first on
PYTHONPATH (:mod:`pyfleet.as_paddle`): ``import paddle``, ``import
paddle.fluid as fluid``, ``from paddle import fluid``, the Fleet import paths,
``paddle.reader``, ``paddle.dataset`` are pyfleet there and in every Python
process the script starts. The exit code is the script's.
"""

from __future__ import annotations

import os
import sys

USAGE = ("usage: pyfleet run [-h] (SCRIPT.py | -m MODULE) [ARGS...]\n\n"
         "Run a Fleet-era script (or module) unchanged: `paddle` resolves to pyfleet in it\n"
         "and in every Python process it starts (docs/fleet.md, 'Zero edits').\n")


def run_argv(argv):
    """``(python argv, environment)`` of ``pyfleet run argv``; ValueError on bad usage."""
    from pyfleet import as_paddle
    argv = list(argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        raise ValueError("pyfleet run: name a script (script.py) or a module (-m MODULE)")
    if argv[0] == "-m":
        if len(argv) < 2:
            raise ValueError("pyfleet run -m: name the module to run")
        cmd = [sys.executable, "-m", argv[1], *argv[2:]]
    elif argv[0].startswith("-"):
        raise ValueError(f"pyfleet run: unknown option {argv[0]!r} (the script's own "
                         f"options go after the script)")
    else:
        if not os.path.isfile(argv[0]):
            raise ValueError(f"pyfleet run: no such script {argv[0]!r}")
        cmd = [sys.executable, *argv]
    return cmd, as_paddle.child_env()


def cmd_run(argv) -> int:
    from pyfleet import as_paddle
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE, end="")
        return 0
    try:
        cmd, env = run_argv(argv)
    except ValueError as exc:
        print(USAGE + str(exc), file=sys.stderr)
        return 2
    real = as_paddle.real_paddle()
    if real is not None:
        print(f"pyfleet run: a paddle is installed ({real}); in this job `paddle` is pyfleet",
              file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(cmd[0], cmd, env)
    return 127  # not reached
