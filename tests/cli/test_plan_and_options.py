"""`pyfleet plan` (table sizing from the C++ table's own accounting), the options every
command refuses by name (no prefix matching, the nearest flag suggested), `pyfleet
--help` listing each command once, and `mpiexec` found beside the interpreter."""

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from support.cli import pyfleet

from pyfleet import optimizer
from pyfleet.launch.collective import find_mpiexec
from pyfleet.table import SparseTable


@pytest.mark.slow  # builds tables of 1.25M rows
def test_plan_rows_and_servers_follow_the_tables_own_accounting(tmp_path):
    r = pyfleet("plan", "--rows", 50_000_000, "--dim", 16, "--optimizer", "adam",
                "--storage", "fp16", "--memory-budget", "2G", "--servers", 4, "--json",
                cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    kinds = p["storage_types"]
    assert set(kinds) == {"fp32", "fp16", "bf16", "fp16_q8", "bf16_q8"}
    # A table of the same kind, ten times larger than plan's probe, measured here
    # through one growth of its index: within 3%.
    for kind in ("fp32", "fp16_q8"):
        t = SparseTable(16, optimizer.Adam(learning_rate=0.01), storage=kind)
        empty = t.memory_bytes()
        keys = np.arange(1, 1_250_001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        ref, done = [], 0
        for n in (1_000_000, 1_060_000, 1_120_000, 1_180_000, 1_250_000):
            t.pull(keys[done:n])
            done = n
            ref.append((t.memory_bytes() - empty) / n)
        ref = float(np.mean(ref))
        assert abs(kinds[kind]["row_bytes"] - ref) / ref < 0.03, (kind, kinds[kind], ref)
    # a row holds at least its weights and Adam's state in its element type
    st = kinds["fp32"]["state_dim"]
    assert kinds["fp32"]["row_bytes"] >= 4 * (16 + st)
    assert kinds["fp32"]["row_bytes"] > kinds["fp16"]["row_bytes"] > kinds["fp16_q8"]["row_bytes"]
    for e in kinds.values():
        budget = 2 << 30
        fit = e["rows_in_budget"]
        assert e["table_bytes"] + fit * e["row_bytes"] <= budget
        assert e["table_bytes"] + (fit + 1) * e["row_bytes"] > budget
        assert e["servers_needed"] == math.ceil(50_000_000 / fit)
        assert e["rows_a_server"] == 12_500_000
    text = pyfleet("plan", "--rows", 50_000_000, "--storage", "fp16", "--memory-budget", "2G",
                   cwd=tmp_path, timeout=120)
    assert text.returncode == 0, text.stderr
    need = kinds["fp16"]["servers_needed"]
    assert f"--storage fp16: {need} server(s) of 2.00 GiB" in text.stdout
    assert "fp16 *" in text.stdout


def test_plan_refuses_what_it_cannot_size(tmp_path):
    r = pyfleet("plan", "--rows", 1000, "--optimizer", "sgd", "--storage", "fp16_q8",
                cwd=tmp_path)
    assert r.returncode != 0 and "--optimizer sgd is not supported" in r.stderr
    r = pyfleet("plan", "--rows", 0, cwd=tmp_path)
    assert r.returncode != 0 and "--rows must be >= 1" in r.stderr
    r = pyfleet("plan", "--rows", 10, "--memory-budget", "0", cwd=tmp_path)
    assert r.returncode != 0 and "byte count must be > 0" in r.stderr


@pytest.mark.parametrize("argv, wrong, right", [
    (["train", "--trian", "x"], "--trian", "--train"),
    (["train", "--epoch", "2"], "--epoch", "--epochs"),  # a prefix is not taken as --epochs
    (["plan", "--rows", "5", "--memry-budget", "1G"], "--memry-budget", "--memory-budget"),
])
def test_unknown_options_are_refused_with_the_nearest_one(tmp_path, argv, wrong, right):
    r = pyfleet(*argv, cwd=tmp_path)
    assert r.returncode == 2
    assert f"{wrong}: did you mean {right}?" in r.stderr
    assert not os.listdir(tmp_path)  # nothing started, nothing written


def test_help_lists_each_command_once(tmp_path):
    r = pyfleet("--help", cwd=tmp_path)
    assert r.returncode == 0
    for command in ("train", "gen-data", "predict", "plan", "keygen"):
        lines = [ln for ln in r.stdout.splitlines() if ln.split()[:1] == [command]]
        assert len(lines) == 1, (command, r.stdout)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_mpiexec_beside_the_interpreter_is_used_when_path_has_none(tmp_path):
    real = find_mpiexec()
    if real is None:
        pytest.skip("no mpiexec in this installation (the mpi extra is not installed)")
    # A venv whose bin/ has mpiexec, run with a PATH that has none.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                    str(venv)], check=True, timeout=60)
    site = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    import site as this_site
    with open(os.path.join(site, "pyfleet_under_test.pth"), "w") as f:
        # this interpreter's packages (pyfleet itself) in the new venv
        f.write("import site; " + "; ".join(f"site.addsitedir({d!r})"
                                            for d in this_site.getsitepackages()) + "\n")
    os.symlink(os.path.realpath(real), venv / "bin" / "mpiexec")
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent("""
        import os
        print("rank", os.environ.get("OMPI_COMM_WORLD_RANK"), flush=True)
    """))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = "/usr/bin:/bin"
    env["PYTHONPATH"] = os.getcwd()  # tests.support and a source checkout's pyfleet
    r = subprocess.run([str(venv / "bin" / "python"), "-m", "pyfleet.launch", "--collective",
                        "--workers", "2", str(script)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stderr
    assert f"through {venv / 'bin' / 'mpiexec'}" in r.stderr
    assert sorted(ln for ln in r.stdout.splitlines() if ln.startswith("rank")) == [
        "rank 0", "rank 1"]
    r = subprocess.run([str(venv / "bin" / "python"), "-m", "pyfleet.cli", "train", "--mode",
                        "collective", "--workers", "2", "--rows", "2000", "--layers", "8",
                        "--embedding-dim", "4", "--run-dir", str(tmp_path / "run")],
                       cwd=tmp_path, env={**env, "PYFLEET_CACHE_DIR": str(tmp_path / "cache")},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"(workers through {venv / 'bin' / 'mpiexec'})" in r.stdout


@pytest.mark.slow
def test_quiet_prints_the_summary_only(tmp_path):
    r = pyfleet("train", "--rows", 2000, "--layers", "8", "--embedding-dim", 4, "-q",
                "--run-dir", tmp_path / "run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # no launcher line, no progress, no phase (warnings may be there)
    assert "pyfleet.launch" not in r.stderr and "pass 1" not in r.stderr + r.stdout
    assert "starting" not in r.stdout and "test AUC" in r.stdout


def test_a_mistyped_command_names_the_nearest_one(tmp_path):
    r = pyfleet("trian", "--rows", 10, cwd=tmp_path)
    assert r.returncode == 2 and "no command 'trian': did you mean train?" in r.stderr
    r = pyfleet("zzz", cwd=tmp_path)
    assert r.returncode == 2 and "(commands: train, gen-data" in r.stderr
