"""A full disk. Under the logs: the launcher keeps draining every role's
output, says so in one line, and cleans up without a traceback. Under ``pyfleet
train``'s run directory, at each stage (job.json, the logs and progress files, a
checkpoint the servers save, the inference model): one line naming the file and
"No space left on device", a non-zero exit, no traceback, nothing half-written left
as if complete. The disk is a real small tmpfs mounted in a private mount namespace
(``unshare -m``, root only)."""

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from pyfleet.service import checkpoint

pytestmark = pytest.mark.slow


def _can_mount_tmpfs():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    r = subprocess.run(["unshare", "-m", "sh", "-c",
                        "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d && umount $d"
                        " && rmdir $d"], capture_output=True, timeout=30)
    return r.returncode == 0


needs_tmpfs = pytest.mark.skipif(not _can_mount_tmpfs(),
                                 reason="needs root and unshare -m to mount a small tmpfs")


def full_disk(mount, *argv, timeout=120):
    """Run ``argv`` with a 64 KiB tmpfs mounted at ``mount`` (seen by it alone)."""
    cmd = (f"mount -t tmpfs -o size=64k tmpfs {mount} && exec \"$@\"")
    return subprocess.run(["unshare", "-m", "sh", "-c", cmd, "sh", *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout)


ROLE = textwrap.dedent("""
    import os, sys
    # Far more than a pipe holds (64 KiB) and than the disk holds: a role blocks
    # for good when nobody drains its pipe.
    line = os.environ["PYFLEET_ROLE"] * 100 + "\\n"
    for i in range(20000):
        sys.stdout.write(f"{i} {line}")
    sys.stdout.flush()
    print("done", os.environ["PYFLEET_ROLE"], flush=True)
""")


@needs_tmpfs
def test_the_launcher_keeps_draining_roles_when_its_log_disk_is_full(tmp_path):
    (tmp_path / "role.py").write_text(ROLE)
    logs = tmp_path / "logs"
    logs.mkdir()
    r = full_disk(logs, sys.executable, "-m", "pyfleet.launch", "--servers", "1",
                  "--workers", "2", "--log_dir", logs, "--timeout", "100",
                  tmp_path / "role.py")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    full = [x for x in r.stderr.splitlines() if "No space left on device" in x]
    assert full, r.stderr[-3000:]
    for line in full:  # one line per role's log, naming it
        assert line.startswith(f"pyfleet.launch: cannot write {logs}/"), line
        assert line.endswith("output is no longer copied there"), line
    assert len(full) <= 3
    # every role was drained to its end: its last lines were echoed
    for role in ("server.0", "worker.0", "worker.1"):
        assert f"[{role}] 19999 " in r.stdout
        assert f"[{role}] done " in r.stdout


def train_on_full_disk(tmp_path, size, fill_kb, *args, timeout=180):
    """``pyfleet train`` with its run directory on a tmpfs of ``size`` of which
    ``fill_kb`` KiB are taken first; returns the finished process and a copy of
    what the run directory held at the end (the tmpfs is gone with its namespace)."""
    mount, copy = tmp_path / "disk", tmp_path / "copy"
    mount.mkdir()
    fill = (f"dd if=/dev/zero of={mount}/fill bs=1k count={fill_kb} status=none 2>/dev/null; "
            if fill_kb else "")
    cmd = (f"mount -t tmpfs -o size={size} tmpfs {mount} && {fill}\"$@\"; rc=$?; "
           f"cp -r {mount}/run {copy} 2>/dev/null; exit $rc")
    argv = [sys.executable, "-m", "pyfleet.cli", "train", "--run-dir", mount / "run", *args]
    r = subprocess.run(["unshare", "-m", "sh", "-c", cmd, "sh", *map(str, argv)],
                       capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    return r, copy


@pytest.fixture(scope="module")
def small_job(tmp_path_factory):
    """The options of a small job (2 servers, 2 workers, 3,000 generated rows in a
    cache outside the small disk): a checkpoint of about 1 MiB, a model of 290 KiB."""
    cache = tmp_path_factory.mktemp("cache")
    return ["--rows", "3000", "--cache-dir", cache, "--servers", "2", "--workers", "2",
            "--embedding-dim", "4", "--layers", "8", "--timeout", "150"]


def _one_line_naming(r, where):
    """The full disk was said in one line naming a file under ``where``; no traceback."""
    assert r.returncode != 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr[-5000:]
    lines = [x for x in r.stderr.splitlines() if "No space left on device" in x]
    assert any(f"cannot write {where}" in x for x in lines), r.stderr[-3000:]
    return lines


def _whole_lines(path):
    if path.exists():
        for line in path.read_text().splitlines():
            json.loads(line)  # no torn line


@needs_tmpfs
def test_train_on_a_full_disk_says_so_for_job_json(tmp_path, small_job):
    r, copy = train_on_full_disk(tmp_path, "256k", 256, *small_job)
    lines = _one_line_naming(r, tmp_path / "disk/run/job.json")
    assert lines == [f"pyfleet train: cannot write {tmp_path}/disk/run/job.json: "
                     f"No space left on device"]
    assert not (copy / "job.json").exists()  # not half-written: not there at all
    assert not any(copy.glob("job.json*"))


@needs_tmpfs
def test_train_on_a_full_disk_says_so_for_logs_and_progress(tmp_path, small_job):
    # room for job.json (a page), not for the logs and the workers' progress files
    r, copy = train_on_full_disk(tmp_path, "1m", 1010, *small_job)
    run = tmp_path / "disk/run"
    lines = _one_line_naming(r, run)
    assert any(x.startswith(("[worker.0] pyfleet worker 0: cannot write ",
                             "[worker.1] pyfleet worker 1: cannot write "))
               for x in lines), r.stderr[-3000:]
    assert "pyfleet train: the job failed" in r.stderr
    json.loads((copy / "job.json").read_text())  # written whole before the disk filled
    _whole_lines(copy / "progress/events.jsonl")
    _whole_lines(copy / "metrics.jsonl")
    for f in (copy / "progress").glob("worker*.json"):
        json.loads(f.read_text())
    assert not (copy / "checkpoint/MANIFEST.json").exists()


@needs_tmpfs
def test_train_on_a_full_disk_says_so_for_a_checkpoint_the_servers_save(tmp_path, small_job):
    r, copy = train_on_full_disk(tmp_path, "512k", 0, *small_job)
    lines = _one_line_naming(r, tmp_path / "disk/run/checkpoint/g000001-full/")
    # the worker that asked says it in one line: which server, which file
    assert any(x.startswith("[worker.0] pyfleet worker 0: server ") and "refused SAVE" in x
               for x in lines), r.stderr[-3000:]
    # not committed (no manifest), no temporary file left
    assert not (copy / "checkpoint/MANIFEST.json").exists()
    assert not list((copy / "checkpoint").glob("*/*.tmp.*"))
    assert not (copy / "model").exists()


@needs_tmpfs
def test_train_on_a_full_disk_says_so_for_the_inference_model(tmp_path, small_job):
    # room for the checkpoint and the rest (about 1.25 MiB), not for the model after it
    # (about 290 KiB)
    r, copy = train_on_full_disk(tmp_path, "1400k", 0, *small_job)
    lines = _one_line_naming(r, tmp_path / "disk/run/model/")
    assert any(x.startswith("[worker.0] pyfleet worker 0: cannot write ") for x in lines)
    assert not (copy / "model").exists()  # a failed export leaves no directory
    manifest = checkpoint.read_manifest(str(copy / "checkpoint"))  # the pass's checkpoint
    assert manifest is not None and manifest["meta"]["pass"] == 1


def test_the_train_log_reports_a_failed_write_once_in_one_line(tmp_path, capsys):
    from pyfleet.cli.report import _LogFile

    class Full:  # the log file on a full disk
        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def flush(self):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        close = flush

    path = tmp_path / "pyfleet.log"
    handler = _LogFile(str(path))
    handler.stream.close()
    handler.stream = Full()
    log = logging.getLogger("pyfleet.test-full-log")
    log.addHandler(handler)
    log.propagate = False
    try:
        for i in range(3):
            log.warning("record %d", i)
    finally:
        log.removeHandler(handler)
        handler.close()
    err = capsys.readouterr().err
    assert err == (f"pyfleet train: cannot write {path}: No space left on device; the job's log "
                   f"is no longer written there\n")


@needs_tmpfs
def test_train_with_a_full_spill_disk_says_so_in_one_line(tmp_path, small_job):
    # The attack: the disk tier's directory fills up. It ended the job with seven server
    # tracebacks (82 console lines); now each role that meets it says so in one line
    # naming the spill directory, as a full checkpoint disk does.
    spill = tmp_path / "spill"
    spill.mkdir()
    r = full_disk(spill, sys.executable, "-m", "pyfleet.cli", "train", "--run-dir",
                  tmp_path / "run", *small_job, "--memory-budget", "128k", "--spill-dir",
                  spill, timeout=180)
    assert r.returncode != 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr[-5000:]
    lines = [x for x in r.stderr.splitlines() if "No space left on device" in x]
    assert lines, r.stderr[-3000:]
    assert all(f"cannot write a spill file in {spill}" in x for x in lines), lines
    # one line from each role that met it (2 servers, 2 workers) at most
    assert len(lines) <= 4, lines
    assert any(x.startswith(("[worker.0] pyfleet worker 0: server ",
                             "[worker.1] pyfleet worker 1: server ")) for x in lines), lines
    assert "pyfleet train: the job failed" in r.stderr
