"""Self-healing ``pyfleet train``: a SIGKILLed server and a SIGKILLed worker are restarted
(the whole job, from the latest checkpoint inside the pass, at every worker's recorded
position), and the job ends with exit 0 having trained exactly the examples of an
uninterrupted run; a job whose role keeps dying fails after N restarts with the history."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from support.wait import wait_until

from pyfleet.metrics import MetricStats
from pyfleet.service import checkpoint as _checkpoint


def _state_dir(ckpt):
    """Where checkpoint ``ckpt`` keeps the saving worker's auc counters (checked)."""
    ckpt = os.fspath(ckpt)
    return _checkpoint.state_dir(ckpt, _checkpoint.read_manifest(ckpt))


pytestmark = pytest.mark.slow  # real multi-process jobs, killed and restarted

DEADLINE = 400


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _role_pids(pid):
    """``{"server.0": pid, "worker.1": pid, ...}`` of the launcher's live roles."""
    roles = {}
    for child in _children(pid):
        try:
            with open(f"/proc/{child}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        role = env.get(b"PYFLEET_ROLE", b"").decode()
        index = env.get(b"PYFLEET_SERVER_INDEX" if role == "server"
                        else b"PYFLEET_WORKER_INDEX", b"").decode()
        if role:
            roles[f"{role}.{index}"] = child
    return roles


def _round_position(run_dir):
    try:
        m = _checkpoint.read_manifest(os.path.join(run_dir, "checkpoint"))
    except ValueError:
        return None
    return ((m or {}).get("meta") or {}).get("position")


def _train(tmp_path, run, *flags):
    cmd = [sys.executable, "-m", "pyfleet.cli", "train", "--rows", "60000", "--batch-size",
           "128", "--layers", "32,16", "--embedding-dim", "8", "--servers", "2",
           "--workers", "2", "--run-dir", str(tmp_path / run), "--cache-dir",
           str(tmp_path.parent / "heal-cache"), "--quiet", "--json", "--timeout",
           str(DEADLINE - 30), *flags]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(tmp_path))


def _kill_when(proc, run_dir, role, ready):
    """SIGKILL ``role`` of the running job once ``ready()``; the position of the
    checkpoint it will restart from."""
    def target():
        assert proc.poll() is None, "the job ended before the kill: " + proc.stderr.read()
        return ready() and _role_pids(proc.pid).get(role)

    os.kill(wait_until(target, DEADLINE, f"{role} to kill"), signal.SIGKILL)


def _run_killing(proc, run_dir, *kills):
    """SIGKILL each ``(role, ready)`` of ``kills`` in turn, then wait for the job:
    its ``(stdout, stderr)``. A job still running when this leaves is killed."""
    try:
        for role, ready in kills:
            _kill_when(proc, run_dir, role, ready)
        return proc.communicate(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _rounds_of(run_dir, attempt):
    d = os.path.join(run_dir, "progress", "rounds")
    return [n for n in os.listdir(d) if n.startswith(f"a{attempt}.") and n.endswith(".done")] \
        if os.path.isdir(d) else []


@pytest.mark.timeout(DEADLINE + 60)
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_killed_server_and_a_killed_worker_heal_and_train_every_example_once(tmp_path,
                                                                               mode):
    run = str(tmp_path / "run")
    proc = _train(tmp_path, "run", "--epochs", "2", "--checkpoint-steps", "20",
                  "--max-restarts", "2", "--mode", mode)
    out, err = _run_killing(
        proc, run,
        # 1. a server, once a checkpoint inside pass 1 was committed by attempt 0
        ("server.1", lambda: len(_rounds_of(run, 0)) >= 2),
        # 2. a worker, once the restarted job committed a checkpoint of its own
        ("worker.0", lambda: len(_rounds_of(run, 1)) >= 2))
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert [(r["role"], r["description"], r["attempt"]) for r in summary["restarts"]] == [
        ("server.1", "was killed by SIGKILL", 0), ("worker.0", "was killed by SIGKILL", 1)]
    # Exactly the examples of an uninterrupted run: 2 passes over the 90% train split.
    assert summary["train_examples"] == 2 * 54000
    # Each restart resumed every worker at the position its checkpoint recorded.
    restored = {}
    for w in (0, 1):
        with open(os.path.join(run, "logs", f"worker.{w}.log")) as f:
            restored[w] = [line.split("restored at ")[1].strip() for line in f
                           if "restored at " in line]
    assert len(restored[0]) == len(restored[1]) == 2
    rounds = os.path.join(run, "progress", "rounds")
    for w in (0, 1):
        for attempt, line in enumerate(restored[w]):
            # "pass P batch B (E examples of the pass)": a position attempt 0 or 1 recorded
            # in one of its checkpoint rounds, inside pass 1 (not its start)
            p, b = int(line.split()[1]), int(line.split()[3])
            recorded = set()
            for name in os.listdir(rounds):
                if name.startswith(f"a{attempt}.p{p}.") and name.endswith(f".w{w}"):
                    with open(os.path.join(rounds, name)) as f:
                        recorded.add(json.load(f)["batches"])
            assert p == 1 and b > 0 and b in recorded, (w, attempt, line, recorded)
    if mode == "sync":  # equal shares: the step barrier resumes at one step for both
        assert [line.split(" (")[0] for line in restored[0]] == [
            line.split(" (")[0] for line in restored[1]]
    with open(os.path.join(run, "worker0.json")) as f:
        result = json.load(f)
    assert result["restarts"] == 2
    assert result["checkpoint_rounds"]["rounds"] >= 1
    assert summary["test_auc"] > 0.6


def test_a_role_that_keeps_dying_fails_the_job_after_n_restarts(tmp_path):
    # A role that cannot start: its checkpoint to restore from is damaged. Attempt 0
    # trains and commits a round; then server.0 is killed, and every restart's servers
    # refuse the damaged checkpoint and exit 1.
    run = str(tmp_path / "run")
    proc = _train(tmp_path, "run", "--checkpoint-steps", "10", "--max-restarts", "2")
    def damaged():
        if len(_rounds_of(run, 0)) < 1:
            return False
        m = _checkpoint.read_manifest(os.path.join(run, "checkpoint"))
        gen = m["chain"][0]["dir"]
        files = sorted(os.listdir(os.path.join(run, "checkpoint", gen)))
        path = os.path.join(run, "checkpoint", gen, next(f for f in files
                                                     if f.endswith(".bin")))
        with open(path, "r+b") as f:
            f.seek(40)
            f.write(b"\xff\xff\xff\xff")
        return True
    out, err = _run_killing(proc, run, ("server.0", damaged))
    assert proc.returncode != 0
    assert "3 role death(s); more than 2 restart(s) within 3600 s, so the job fails" in err
    history = [line.split("UTC  ")[1] for line in err.splitlines() if " UTC  attempt " in line]
    assert history[0] == "attempt 0: server.0 was killed by SIGKILL"
    assert len(history) == 3 and all(" exited with code 1" in h for h in history[1:])
    assert "is damaged" in err


def test_checkpoints_by_time_record_positions_and_bad_durations_are_refused(tmp_path):
    proc = _train(tmp_path, "run", "--checkpoint-every", "0.05s")
    out, err = proc.communicate(timeout=DEADLINE)
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["train_examples"] == 54000 and summary["restarts"] == []
    with open(tmp_path / "run" / "worker0.json") as f:
        rounds = json.load(f)["checkpoint_rounds"]
    assert rounds["rounds"] >= 1 and rounds["pause_seconds_max"] > 0
    for flag, value, message in [("--checkpoint-every", "5x", "--checkpoint-every expects a "
                                  "positive duration"),
                                 ("--checkpoint-every", "0m", "positive duration"),
                                 ("--checkpoint-steps", "0", "--checkpoint-steps must be >= 1"),
                                 ("--max-restarts", "-2", "--max-restarts must be >= 0")]:
        bad = _train(tmp_path, f"bad{flag}{value}", flag, value)
        _, err = bad.communicate(timeout=120)
        assert bad.returncode != 0 and message in err, err
        assert not (tmp_path / f"bad{flag}{value}").exists()


def test_a_restart_from_a_pass_end_checkpoint_keeps_every_workers_counts(tmp_path):
    # No checkpoint inside passes: a worker killed in pass 2 restarts pass 2 from its start,
    # from pass 1's checkpoint, whose meta holds every worker's counts at the pass end.
    run = str(tmp_path / "run")
    proc = _train(tmp_path, "run", "--epochs", "2", "--max-restarts", "1")

    def pass_one_saved():
        pos = _round_position(run)
        return pos is not None and pos["pass"] == 2
    out, err = _run_killing(proc, run, ("worker.1", pass_one_saved))
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert [r["role"] for r in summary["restarts"]] == ["worker.1"]
    assert summary["train_examples"] == 2 * 54000
    assert sorted(summary["train_loss_by_pass"]) == ["1", "2"]
    with open(os.path.join(run, "logs", "worker.1.log")) as f:
        restored = [line for line in f if "restored at " in line]
    assert len(restored) == 1 and "restored at pass 2 batch 0 (0 examples of the pass, " \
        "27000 in all)" in restored[0]


def test_resume_of_a_checkpoint_inside_a_pass_trains_the_rest_of_it(tmp_path):
    # Without --max-restarts the kill fails the job; --resume then starts at the recorded
    # position: it trains exactly the examples the checkpoint does not hold yet.
    run = str(tmp_path / "run")
    proc = _train(tmp_path, "run", "--checkpoint-steps", "20")
    _, err = _run_killing(proc, run, ("worker.1", lambda: len(_rounds_of(run, 0)) >= 2))
    assert proc.returncode != 0
    pos = _round_position(run)
    assert pos["pass"] == 1 and pos["round"] >= 2
    held = sum(w["pass_examples"] for w in pos["workers"].values())
    assert 0 < held < 54000
    again = subprocess.run([sys.executable, "-m", "pyfleet.cli", "train", "--resume", run,
                            "--json", "--checkpoint-steps", "20"],
                           capture_output=True, text=True, timeout=DEADLINE,
                           cwd=str(tmp_path))
    assert again.returncode == 0, again.stderr
    # the counts went on from the checkpoint's: the summary covers the whole pass
    assert json.loads(again.stdout)["train_examples"] == 54000
    assert f"resuming inside pass 1 (checkpoint round {pos['round']}) of {run}: passes " \
           f"1..1" in again.stderr
    # Worker 0's auc layer states went on from its position's: its whole counters (the
    # two largest sums: positives and negatives) count the examples the checkpoint held
    # and those the resumed run trained (its examples, which went on from the
    # position's) and its share of the pass-end test (the test program shares the
    # states, as in Fluid).
    ckpt = _state_dir(os.path.join(run, "checkpoint"))
    sums = sorted(int(np.load(os.path.join(ckpt, n)).sum()) for n in os.listdir(ckpt)
                  if n.endswith(".state.npy"))
    with open(os.path.join(run, "worker0.json")) as f:
        w0 = json.load(f)
    tested = MetricStats.from_json(w0["test_stats"]).count
    assert len(sums) == 4 and pos["workers"]["0"]["examples"] < w0["examples"] < 54000
    assert tested > 0
    assert sums[-1] + sums[-2] == w0["examples"] + tested


def test_the_printed_summary_names_the_restarts_and_the_checkpoint_pauses():
    from pyfleet.cli.report import _format_summary
    s = {"test_auc": 0.8, "test_logloss": 0.4, "train_auc": 0.8, "train_logloss": 0.4,
         "train_examples": 10, "train_examples_per_sec": 5, "train_seconds": 2.0,
         "model": "dnn", "servers": 2, "workers": 2, "mode": "async", "run_dir": "r",
         "restarts": [{"role": "server.1", "description": "was killed by SIGKILL"},
                      {"role": "worker.0", "description": "exited with code 1",
                       "host": "10.0.0.2"}],
         "checkpoint_rounds": {"rounds": 3, "pause_seconds_total": 0.5,
                               "pause_seconds_max": 0.25}}
    text = _format_summary(s).splitlines()
    assert "restarts               2 (server.1 was killed by SIGKILL, worker.0 on 10.0.0.2 " \
           "exited with code 1)" in text
    assert "checkpoints in passes  3, pausing the job 0.5 s in all (at most 0.25 s)" in text
    del s["restarts"], s["checkpoint_rounds"]
    assert not [line for line in _format_summary(s).splitlines()
                if line.startswith(("restarts", "checkpoints in passes"))]


@pytest.mark.timeout(DEADLINE + 60)
def test_a_healed_sync_job_ends_with_the_model_of_an_undisturbed_one(tmp_path):
    # Sync training is deterministic: a job killed and restarted from its checkpoint (every
    # worker at its position, the step barrier at the checkpoint's step, the servers'
    # optimizer state restored) must end with the very model of a run never killed.
    flags = ("--mode", "sync", "--checkpoint-steps", "20")
    calm = _train(tmp_path, "calm", *flags)
    out, err = calm.communicate(timeout=DEADLINE)
    assert calm.returncode == 0, err
    calm = json.loads(out)
    run = str(tmp_path / "run")
    proc = _train(tmp_path, "run", *flags, "--max-restarts", "1")
    out, err = _run_killing(proc, run, ("server.0", lambda: len(_rounds_of(run, 0)) >= 3))
    assert proc.returncode == 0, err
    healed = json.loads(out)
    assert [r["role"] for r in healed["restarts"]] == ["server.0"]
    assert healed["train_examples"] == calm["train_examples"] == 54000
    assert healed["test_auc"] == calm["test_auc"]
    assert healed["test_logloss"] == calm["test_logloss"]
    # The running AUC went on from the checkpoint's counters: the train AUC (bucket
    # counts of every worker) and worker 0's auc layer states at the last save are
    # the undisturbed run's (the logloss sum is a float summed in other chunks).
    assert healed["train_auc"] == calm["train_auc"]
    assert healed["train_logloss"] == pytest.approx(calm["train_logloss"], rel=1e-9)
    calm_dir = _state_dir(tmp_path / "calm" / "checkpoint")
    names = sorted(n for n in os.listdir(calm_dir) if n.endswith(".state.npy"))
    assert len(names) == 4
    healed_dir = _state_dir(tmp_path / "run" / "checkpoint")
    for n in names:
        want = np.load(os.path.join(calm_dir, n))
        assert want.sum() > 0
        np.testing.assert_array_equal(np.load(os.path.join(healed_dir, n)), want)
