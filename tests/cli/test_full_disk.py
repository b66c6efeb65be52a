"""A full disk under the logs (issue 18): the launcher keeps draining every role's
output, says so in one line, and cleans up without a traceback. The disk is a real
64 KiB tmpfs mounted in a private mount namespace (``unshare -m``, root only)."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

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
