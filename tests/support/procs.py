"""Finding a job's processes by their environment (the tests' namespaces and MPI jobs
share this machine's process table)."""

import os


def trainer_pid(run_dir, *env_entries):
    """The pid of a ``pyfleet.trainer`` process of the job training into ``run_dir``
    whose environment holds every ``NAME=value`` of ``env_entries``, or None."""
    want = [f"PYFLEET_CHECKPOINT_DIR={run_dir}".encode(), *(e.encode() for e in env_entries)]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if b"pyfleet.trainer" in cmdline and all(w in env for w in want):
            return int(pid)
    return None
