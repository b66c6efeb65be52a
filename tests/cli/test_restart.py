"""``--max-restarts``: a role's death restarts the whole job (same endpoints, the restart
variables set), and a job whose role keeps dying fails with the history of its deaths."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from support import TESTS

pytestmark = pytest.mark.slow  # real multi-process jobs, killed and restarted

ROLE = f"import sys; sys.path.insert(0, {str(TESTS)!r})\n" + textwrap.dedent("""
    import json, os, signal, sys, time
    from support.wait import wait_until
    out, plan = sys.argv[1], sys.argv[2]
    env = os.environ
    role = env["PYFLEET_ROLE"]
    idx = env["PYFLEET_SERVER_INDEX" if role == "server" else "PYFLEET_WORKER_INDEX"]
    label = f"{role}.{idx}"
    attempt = int(env["PYFLEET_RESTART_COUNT"])
    # Whole or absent: the launcher may stop this role mid-write when another dies.
    path = os.path.join(out, f"{label}.{attempt}.json")
    tmp = os.path.join(out, f".{label}.{attempt}.tmp")
    with open(tmp, "w") as f:
        json.dump({"endpoints": env["PYFLEET_SERVER_ENDPOINTS"],
                   "port": env.get("PADDLE_PORT"),
                   "restore": env.get("PYFLEET_RESTORE_DIR")}, f)
    os.replace(tmp, path)
    if role == "server":
        sys.exit(0)
    # plan: "LABEL:HOW:ATTEMPTS" -- LABEL dies (HOW: kill or an exit code) in those attempts
    target, how, attempts = plan.split(":")
    if label == target and (attempts == "all" or str(attempt) in attempts.split(",")):
        # Die only once every role of this attempt has written its record: the launcher
        # stops the others when this one dies, and a role still starting up would leave none.
        wait_until(lambda: sum(n.endswith(f".{attempt}.json") for n in os.listdir(out))
                   >= int(sys.argv[4]), 60, "every role's record")
        if attempt == 0 and sys.argv[3]:  # a committed checkpoint before the death
            os.makedirs(sys.argv[3], exist_ok=True)
            open(os.path.join(sys.argv[3], "MANIFEST.json"), "w").write("{}")
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(int(how))
    sys.exit(0)
""")


def _launch(tmp_path, plan, *flags, ckpt=None):
    script = tmp_path / "role.py"
    script.write_text(ROLE)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "pyfleet.launch", "--server_num", "2", "--worker_num", "2",
           "--timeout", "120", *flags, str(script), str(out), plan, str(ckpt or ""), "4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                          cwd=str(tmp_path))
    return proc, out


def _seen(out):
    return {name[:-5]: json.loads((out / name).read_text()) for name in os.listdir(out)
            if name.endswith(".json")}


def test_a_killed_worker_restarts_the_whole_job_on_the_same_endpoints(tmp_path):
    ckpt = tmp_path / "ckpt"
    proc, out = _launch(tmp_path, "worker.1:kill:0", "--max-restarts", "2",
                        "--restore-dir", str(ckpt), ckpt=ckpt)
    assert proc.returncode == 0, proc.stderr
    seen = _seen(out)
    # every role ran twice: attempt 0 and attempt 1, nothing more
    assert sorted(seen) == sorted(f"{r}.{a}" for r in ("server.0", "server.1", "worker.0",
                                                       "worker.1") for a in (0, 1))
    for r in ("server.0", "server.1"):
        assert seen[f"{r}.0"]["port"] == seen[f"{r}.1"]["port"]
    assert seen["worker.0.0"]["endpoints"] == seen["worker.0.1"]["endpoints"]
    # attempt 0 had no checkpoint; attempt 1 restores the one committed before the kill
    assert seen["worker.0.0"]["restore"] is None
    assert seen["server.1.1"]["restore"] == str(ckpt)
    assert "worker.1 was killed by SIGKILL; restarting the whole job (restart 1 of at " \
           "most 2" in proc.stderr


def test_without_max_restarts_the_first_death_fails_the_job(tmp_path):
    proc, out = _launch(tmp_path, "worker.0:7:0")
    assert proc.returncode == 7
    assert "worker.0 exited with code 7; stopping the other roles" in proc.stderr
    assert not any(name.endswith(".1.json") for name in os.listdir(out))


def test_a_role_that_keeps_dying_fails_after_n_restarts_with_the_history(tmp_path):
    proc, out = _launch(tmp_path, "worker.0:3:all", "--max-restarts", "2")
    assert proc.returncode == 3
    err = proc.stderr
    assert "3 role death(s); more than 2 restart(s) within 3600 s, so the job fails" in err
    history = [line for line in err.splitlines() if " UTC  attempt " in line]
    assert [h.split("UTC  ")[1] for h in history] == [
        f"attempt {a}: worker.0 exited with code 3" for a in range(3)]
    assert sorted(n for n in os.listdir(out) if n.startswith("worker.0")) == [
        "worker.0.0.json", "worker.0.1.json", "worker.0.2.json"]


def test_deaths_older_than_the_window_do_not_count(tmp_path):
    # Attempts are at least 0.5 s apart (the pause between them), so with a 0.3 s window
    # no two deaths fall in one window: 1 restart allowed, 3 deaths, the job still succeeds.
    proc, out = _launch(tmp_path, "worker.0:kill:0,1,2", "--max-restarts", "1",
                        "--restart-window", "0.3")
    assert proc.returncode == 0, proc.stderr
    assert "worker.0.3" in _seen(out)


@pytest.mark.parametrize("flags, message", [
    (["--max-restarts", "-1"], "--max-restarts must be >= 0"),
    (["--max-restarts", "1", "--restart-window", "0"], "--restart-window must be > 0"),
    (["--restore-dir", "x"], "--restore-dir is read when the job restarts"),
])
def test_bad_restart_options_are_refused_by_name(tmp_path, flags, message):
    proc, _ = _launch(tmp_path, "worker.0:0:none", *flags)
    assert proc.returncode == 2
    assert message in proc.stderr


FLEET_SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, time
    from pyfleet import fluid
    from pyfleet.distributed.fleet import fleet
    from pyfleet.trainer import JOB_DEFAULTS, build_program, feed_of, optimizer_of, strategy_of
    from pyfleet.trainer import job_dataset
    data, out = sys.argv[1], sys.argv[2]
    job = {**JOB_DEFAULTS, "train": data, "format": "csv", "embedding_dim": 4,
           "layers": [8], "batch_size": 64, "lr": 0.01}
    ds = job_dataset(job, data, int(os.environ.get("PYFLEET_WORKER_INDEX", 0)), 2)
    main, startup, model = build_program(job, ds.schema.n_dense, ds.schema.n_slots)
    fleet.init()
    with fluid.program_guard(main, startup):
        fleet.distributed_optimizer(optimizer_of(job), strategy_of(job)).minimize(
            model.avg_cost)
    attempt = int(os.environ["PYFLEET_RESTART_COUNT"])
    if fleet.is_server():
        fleet.init_server()  # restores PYFLEET_RESTORE_DIR when the launcher set it
        fleet.run_server()
        sys.exit(0)
    fleet.init_worker()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(fleet.startup_program)
    wi = fleet.worker_index()
    if attempt == 0:
        for batch in ds:
            exe.run(main, feed=feed_of(batch, model), fetch_list=[model.avg_cost])
        fleet.barrier_worker()
        if wi == 0:
            fleet.save_persistables(exe, "ckpt", meta={"pass": 1})
        fleet.barrier_worker()
        if wi == 1:  # dies once the checkpoint is committed
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # parked: worker 1's death ends the attempt (the launcher stops it)
    rows = sum(int(t.get("rows", 0)) for s in fleet.stats()
               for t in s.get("tables", {}).values())
    with open(os.path.join(out, f"worker{wi}.attempt{attempt}.json"), "w") as f:
        json.dump({"rows": rows, "restore": os.environ.get("PYFLEET_RESTORE_DIR")}, f)
    fleet.stop_worker()
""")


def test_a_fleet_scripts_servers_restore_the_checkpoint_when_the_job_restarts(tmp_path):
    from support import DATA
    script = tmp_path / "train.py"
    script.write_text(FLEET_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "pyfleet.launch", "--server_num", "2", "--worker_num", "2",
         "--timeout", "240", "--max-restarts", "1", "--restore-dir", str(tmp_path / "ckpt"),
         str(script), str(DATA / "criteo-kaggle-tiny" / "train.tiny.csv"), str(out)],
        capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
        env={**os.environ, "PYFLEET_CHECKPOINT_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "worker.1 was killed by SIGKILL; restarting the whole job" in proc.stderr
    got = {n: json.loads((out / n).read_text()) for n in os.listdir(out)}
    # Only the restarted attempt got this far, and its servers hold the saved rows without
    # any training: the checkpoint was restored.
    assert sorted(got) == ["worker0.attempt1.json", "worker1.attempt1.json"]
    saved = json.loads((tmp_path / "ckpt" / "MANIFEST.json").read_text())
    sparse_rows = saved["chain"][-1]["rows"]["SparseFeatFactors"]
    assert sparse_rows > 1000
    for w in (0, 1):
        assert got[f"worker{w}.attempt1.json"] == {"rows": sparse_rows,
                                                   "restore": str(tmp_path / "ckpt")}
