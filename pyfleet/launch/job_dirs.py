"""A job's private directories (CURVE keys, Unix sockets), and those a killed
launcher left behind.

A launcher removes the directories it made when the job ends; a SIGKILLed one
cannot, and a key directory holds the job's secret keys. Every such directory
is named after the host and the process that made it
(``<prefix><host>-<pid>-<random>``), so the next launcher on the same host
removes those whose maker is gone, before it makes its own: only directories
of this user, of this host, whose process no longer exists.
"""

import os
import re
import shutil
import socket
import stat
import tempfile

from pyfleet.service import auth

__all__ = ["job_key_dir", "make_job_dir", "sweep_stale"]


def _host():
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's process: alive
        pass
    return True


def sweep_stale(prefix, where=None):
    """Remove the directories ``prefix<host>-<pid>-*`` in ``where`` (default: the
    temporary directory) that this user's launchers on this host made and whose
    process is gone; returns their paths."""
    where = where or tempfile.gettempdir()
    pattern = re.compile(re.escape(prefix + _host()) + r"-(\d+)-[^/]+")
    removed = []
    try:
        names = os.listdir(where)
    except OSError:
        return removed
    for name in names:
        m = pattern.fullmatch(name)
        path = os.path.join(where, name)
        if not m or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid == os.getuid() and stat.S_ISDIR(st.st_mode):   # lstat: no link
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def make_job_dir(prefix, where=None):
    """A fresh directory (mode 0700) ``prefix<host>-<pid>-<random>`` in ``where``
    (default: the temporary directory), after sweeping the stale ones."""
    sweep_stale(prefix, where)
    return tempfile.mkdtemp(prefix=f"{prefix}{_host()}-{os.getpid()}-", dir=where)


def job_key_dir(where=None):
    """A fresh ``pyfleet keygen`` directory (mode 0700) in ``where`` (a directory
    the hosts share, where it is hidden; default: the temporary directory)."""
    path = make_job_dir(".pyfleet-keys-" if where else "pyfleet-keys-", where)
    try:
        auth.keygen(path)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path
