"""Hadoop file systems (``hdfs:``, ``afs:`` paths) through the ``hadoop`` command, as Fluid.

Fluid 1.x never linked an HDFS client: its data feed read a remote file by
piping ``hadoop fs -D fs.default.name=NAME -D hadoop.job.ugi=UGI -cat PATH``
(``-text`` for a ``.gz`` file, which hadoop decompresses) into the dataset's
pipe command, and ``fluid.contrib.utils.HDFSClient`` and PSLib's saves shelled
out the same way. pyfleet does the same: :class:`HadoopFS` builds those
commands (``hadoop`` is looked up on ``PATH``; ``fs_name``/``fs_ugi`` become
the two ``-D`` options ``Dataset.set_hdfs_config`` and
``fleet.set_hdfs_config`` set, other Hadoop settings ``-Dkey=value``).
A path is remote when it starts with ``hdfs:`` or ``afs:`` (Fluid's rule);
everything else is a local path.

A failing command is a :class:`HadoopError` (a ValueError) naming the path,
the command and the tail of its stderr. Commands other than a streamed read
are bounded by ``timeout`` seconds (default ``PYFLEET_HADOOP_TIMEOUT`` or 600):
a hung name node is an error, never a hang.
"""

import os
import shlex
import subprocess
import tempfile

__all__ = ["REMOTE_PREFIXES", "HadoopError", "HadoopFS", "is_remote"]

REMOTE_PREFIXES = ("hdfs:", "afs:")


def is_remote(path):
    """True for an ``hdfs:``/``afs:`` path (Fluid's test: the prefix, case as written)."""
    return isinstance(path, str) and path.startswith(REMOTE_PREFIXES)


class HadoopError(ValueError):
    """A hadoop command failed (``missing``: it is not installed)."""

    missing = False


def _tail(data):
    text = data.decode(errors="replace") if isinstance(data, bytes) else str(data or "")
    return text.strip()[-2000:] or "(no stderr)"


class HadoopFS:
    """The ``hadoop fs`` commands of one configuration.

    ``fs_name``/``fs_ugi``: ``-D fs.default.name=...`` / ``-D hadoop.job.ugi=...``
    (None: hadoop's own configuration); ``configs``: more ``-Dkey=value``;
    ``hadoop_bin``: the executable (default ``hadoop`` on ``PATH``);
    ``download_cmd``: Fluid's ``set_download_cmd``, a command reading a remote
    path to stdout used instead of ``hadoop fs -cat``."""

    def __init__(self, fs_name=None, fs_ugi=None, configs=None, hadoop_bin=None,
                 download_cmd=None, timeout=None):
        self.prefix = [hadoop_bin or "hadoop", "fs"]
        if fs_name:
            self.prefix += ["-D", f"fs.default.name={fs_name}"]
        if fs_ugi:
            self.prefix += ["-D", f"hadoop.job.ugi={fs_ugi}"]
        for key, value in (configs or {}).items():
            self.prefix.append(f"-D{key}={value}")
        self.download_cmd = download_cmd or None
        self.timeout = float(timeout if timeout is not None
                             else os.environ.get("PYFLEET_HADOOP_TIMEOUT", 600))

    def read_command(self, path):
        """The argv that writes remote ``path`` to stdout."""
        if self.download_cmd:
            return [*shlex.split(self.download_cmd), path]
        return [*self.prefix, "-text" if path.endswith(".gz") else "-cat", path]

    def _spawn(self, argv, path, **kwargs):
        try:
            return subprocess.Popen(argv, **kwargs)
        except FileNotFoundError:
            where = ("does not exist" if os.sep in argv[0] else
                     "is not on PATH (put $HADOOP_HOME/bin on PATH)")
            e = HadoopError(f"cannot read or write {path}: the command {argv[0]!r} {where}: "
                            f"hdfs:/afs: paths go through Hadoop's client")
            e.missing = True
            raise e from None

    def open_read(self, path):
        """``(process, stderr file)`` streaming remote ``path`` on ``process.stdout``;
        :meth:`check` afterwards."""
        err = tempfile.TemporaryFile()
        try:
            proc = self._spawn(self.read_command(path), path, stdout=subprocess.PIPE,
                               stderr=err, stdin=subprocess.DEVNULL)
        except BaseException:
            err.close()
            raise
        return proc, err

    def check(self, proc, err, path):
        """Wait for a reading process; HadoopError naming ``path`` if it failed."""
        with err:
            code = proc.wait()
            if code != 0:
                err.seek(0)
                raise HadoopError(f"reading {path} failed: {shlex.join(proc.args)} exited "
                                  f"{code}: {_tail(err.read())}")

    def run(self, *args, path):
        """stdout of ``hadoop fs ARGS``; HadoopError naming ``path`` on failure."""
        argv = [*self.prefix, *args]
        proc = self._spawn(argv, path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           stdin=subprocess.DEVNULL)
        try:
            out, err = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise HadoopError(f"{shlex.join(argv)} did not finish within {self.timeout:g} s "
                              f"(PYFLEET_HADOOP_TIMEOUT) for {path}") from None
        if proc.returncode != 0:
            raise HadoopError(f"{path}: {shlex.join(argv)} exited {proc.returncode}: "
                              f"{_tail(err)}")
        return out

    def exists(self, path):
        argv = [*self.prefix, "-test", "-e", path]
        proc = self._spawn(argv, path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           stdin=subprocess.DEVNULL)
        try:
            return proc.wait(timeout=self.timeout) == 0
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise HadoopError(f"{shlex.join(argv)} did not finish within {self.timeout:g} s "
                              f"(PYFLEET_HADOOP_TIMEOUT)") from None

    def ls(self, path):
        """Names of the entries of remote directory ``path`` (``hadoop fs -ls``)."""
        names = []
        for line in self.run("-ls", path, path=path).decode(errors="replace").splitlines():
            fields = line.split()
            if len(fields) >= 8 and fields[0][:1] in "d-":
                names.append(fields[-1].rstrip("/").rsplit("/", 1)[-1])
        return names

    def mkdir(self, path):
        self.run("-mkdir", "-p", path, path=path)

    def put(self, local, remote):
        """Copy local file or directory ``local`` to ``remote`` (replacing it)."""
        self.run("-put", "-f", local, remote, path=remote)

    def get(self, remote, local):
        """Copy remote file or directory ``remote`` to the new local path ``local``."""
        self.run("-get", remote, local, path=remote)

    def rm(self, path):
        self.run("-rm", "-r", "-f", path, path=path)
