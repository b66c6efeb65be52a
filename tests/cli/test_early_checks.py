"""A --memory-budget the tables cannot start with, or a --spill-dir they cannot write,
is refused by `pyfleet train` before anything starts: no run directory left behind."""

import os
import shutil
import subprocess
import sys

import pytest
from support.cli import pyfleet


def test_a_budget_below_the_tables_minimum_is_refused_first(tmp_path):
    r = pyfleet("train", "--rows", 2000, "--memory-budget", "1K", "--spill-dir",
                tmp_path / "spill", "--run-dir", tmp_path / "run", cwd=tmp_path)
    assert r.returncode != 0
    assert "cannot start with --memory-budget 1,024" in r.stderr
    assert "memory_budget must be at least" in r.stderr
    assert not (tmp_path / "run").exists()


def test_a_read_only_spill_dir_is_refused_first(tmp_path):
    spill = tmp_path / "spill"
    spill.mkdir()
    argv = [sys.executable, "-m", "pyfleet.cli", "train", "--rows", 2000,
            "--memory-budget", "64M", "--spill-dir", spill, "--run-dir", tmp_path / "run"]
    if os.geteuid() == 0:  # root writes through mode bits: a read-only bind mount instead
        if shutil.which("unshare") is None:
            pytest.skip("root needs unshare (util-linux) for a read-only mount")
        cmd = ["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"',
               str(spill), *map(str, argv)]
    else:
        spill.chmod(0o555)
        cmd = [str(a) for a in argv]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    if os.geteuid() == 0 and "mount" in r.stderr and "permission denied" in r.stderr.lower():
        pytest.skip(f"this kernel refuses a private read-only mount: {r.stderr.strip()}")
    assert r.returncode != 0
    assert f"--spill-dir {spill}" in r.stderr and "not a writable directory" in r.stderr
    assert not (tmp_path / "run").exists()
