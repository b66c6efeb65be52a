"""``fluid.contrib.utils.hdfs_utils``: Fluid 1.x's HDFS client, through ``hadoop fs``.

As Fluid's, :class:`HDFSClient` runs ``<hadoop_home>/bin/hadoop fs -Dkey=value ...``
for each call (``configs``: e.g. ``fs.default.name`` and ``hadoop.job.ugi``) and
answers True/False (or a list), logging a failure with the command's stderr
rather than raising. Calls that touch the remote side are bounded by
``PYFLEET_HADOOP_TIMEOUT`` seconds (:mod:`pyfleet.fluid.hadoop`).

Where Fluid's did something other than its documentation says, this one does
what the documentation says: ``upload(overwrite=True)`` replaces the one file
(Fluid's deleted the whole target directory first), ``lsr(sort=True)`` sorts by
modification time (Fluid's sort had no effect), ``rename(overwrite=False)``
refuses an existing target. ``download(unzip=True)`` and
``multi_upload(sync=False)`` are refused by name: Fluid accepted them and did
neither (it never unzipped, and always waited).
"""

import logging
import os
from concurrent.futures import ThreadPoolExecutor

from pyfleet.fluid.hadoop import HadoopError, HadoopFS

__all__ = ["HDFSClient", "multi_download", "multi_upload"]

_log = logging.getLogger("pyfleet.fluid.hdfs_utils")


class HDFSClient:
    """``HDFSClient(hadoop_home, configs)``: ``hadoop_home`` holds ``bin/hadoop``;
    ``configs`` a dict of Hadoop settings passed as ``-Dkey=value``."""

    def __init__(self, hadoop_home, configs):
        self.fs = HadoopFS(configs=dict(configs or {}),
                           hadoop_bin=os.path.join(str(hadoop_home), "bin", "hadoop"))
        self.pre_commands = list(self.fs.prefix)

    def _run(self, *args, path, retry_times=0):
        """stdout of ``hadoop fs ARGS`` (tried ``retry_times`` more times), or
        None after logging the failure."""
        for attempt in range(int(retry_times) + 1):
            try:
                return self.fs.run(*args, path=path)
            except HadoopError as e:
                _log.warning("HDFSClient: attempt %d: %s", attempt + 1, e)
                if e.missing:
                    break
        return None

    def is_exist(self, hdfs_path=None):
        return self._run("-test", "-e", hdfs_path, path=hdfs_path) is not None

    def is_dir(self, hdfs_path=None):
        return self._run("-test", "-d", hdfs_path, path=hdfs_path) is not None

    def upload(self, hdfs_path, local_path, overwrite=False, retry_times=5):
        """Copy the local file ``local_path`` into the HDFS directory ``hdfs_path``
        (made if missing). An existing file there: replaced with ``overwrite``,
        else False. A local directory: False (as Fluid's)."""
        if local_path is None or not os.path.exists(local_path):
            raise ValueError(f"HDFSClient.upload: local path {local_path!r} does not exist")
        if os.path.isdir(local_path):
            _log.error("HDFSClient.upload: %s is a directory (use multi_upload)", local_path)
            return False
        target = _join(hdfs_path, os.path.basename(local_path))
        if not self.is_exist(hdfs_path):
            self.makedirs(hdfs_path)
        elif self.is_exist(target) and not overwrite:
            _log.error("HDFSClient.upload: %s exists and overwrite is False", target)
            return False
        args = ("-put", "-f", local_path, hdfs_path) if overwrite else \
            ("-put", local_path, hdfs_path)
        return self._run(*args, path=hdfs_path, retry_times=retry_times) is not None

    def download(self, hdfs_path, local_path, overwrite=False, unzip=False):
        """Copy ``hdfs_path`` into the local directory ``local_path`` (made if
        missing). False if it does not exist, or its copy exists and not ``overwrite``."""
        if unzip:
            raise ValueError("HDFSClient.download(unzip=True): nothing is unzipped (Fluid's "
                             "accepted the flag and did not either); unpack the file after "
                             "downloading it")
        if not self.is_exist(hdfs_path):
            _log.error("HDFSClient.download: HDFS path %s does not exist", hdfs_path)
            return False
        local_file = os.path.join(local_path, os.path.basename(hdfs_path.rstrip("/")))
        if os.path.exists(local_file):
            if not overwrite:
                _log.error("HDFSClient.download: %s exists and overwrite is False",
                           local_file)
                return False
            os.remove(local_file)
        self.make_local_dirs(local_path)
        return self._run("-get", hdfs_path, local_path, path=hdfs_path) is not None

    def delete(self, hdfs_path):
        """True when ``hdfs_path`` is gone (also if it never existed)."""
        if not self.is_exist(hdfs_path):
            return True
        args = ("-rm", "-r", hdfs_path) if self.is_dir(hdfs_path) else ("-rm", hdfs_path)
        return self._run(*args, path=hdfs_path) is not None

    def rename(self, hdfs_src_path, hdfs_dst_path, overwrite=False):
        if self.is_exist(hdfs_dst_path):
            if not overwrite:
                _log.error("HDFSClient.rename: %s exists and overwrite is False",
                           hdfs_dst_path)
                return False
            self.delete(hdfs_dst_path)
        return self._run("-mv", hdfs_src_path, hdfs_dst_path, path=hdfs_src_path,
                         retry_times=1) is not None

    @staticmethod
    def make_local_dirs(local_path):
        os.makedirs(local_path, exist_ok=True)

    def makedirs(self, hdfs_path):
        return self._run("-mkdir", "-p", hdfs_path, path=hdfs_path, retry_times=1) is not None

    def _listing(self, hdfs_path, *args):
        """``[(path, "date time", is_dir)]`` of ``hadoop fs -ls ARGS``'s 8-field lines."""
        if not self.is_exist(hdfs_path):
            return []
        out = self._run("-ls", *args, hdfs_path, path=hdfs_path, retry_times=1)
        rows = []
        for line in (out or b"").decode(errors="replace").splitlines():
            f = line.split()
            if len(f) == 8:
                rows.append((f[7], f"{f[5]} {f[6]}", f[0].startswith("d")))
        return rows

    def ls(self, hdfs_path):
        """The paths in ``hdfs_path`` (as ``hadoop fs -ls`` prints them)."""
        return [p for p, _, _ in self._listing(hdfs_path)]

    def lsr(self, hdfs_path, only_file=True, sort=True):
        """Every path under ``hdfs_path`` (files only with ``only_file``), oldest
        first with ``sort``."""
        rows = [r for r in self._listing(hdfs_path, "-R") if not (only_file and r[2])]
        if sort:
            rows.sort(key=lambda r: r[1])
        return [p for p, _, _ in rows]


def _join(a, b):
    return f"{str(a).rstrip('/')}/{b}"


def multi_download(client, hdfs_path, local_path, trainer_id, trainers, multi_processes=5):
    """This trainer's share (every ``trainers``-th file from ``trainer_id``) of the
    files under ``hdfs_path``, downloaded into ``local_path`` (keeping their
    sub-directories) by ``multi_processes`` concurrent ``hadoop`` commands.
    Returns the local paths."""
    if not isinstance(client, HDFSClient):
        raise ValueError(f"multi_download: client must be an HDFSClient, got {client!r}")
    client.make_local_dirs(local_path)
    mine = client.lsr(hdfs_path, sort=True)[int(trainer_id)::int(trainers)]
    root = hdfs_path.rstrip("/")

    def local_dir(remote):
        rel = os.path.relpath(os.path.dirname(remote), root) if remote.startswith(root) \
            else os.curdir
        return local_path if rel == os.curdir else os.path.join(local_path, rel)

    with ThreadPoolExecutor(max(int(multi_processes), 1)) as pool:
        list(pool.map(lambda r: client.download(r, local_dir(r)), mine))
    return [os.path.join(local_dir(r), os.path.basename(r)) for r in mine]


def multi_upload(client, hdfs_path, local_path, multi_processes=5, overwrite=False,
                 sync=True):
    """Every file under the local directory ``local_path`` uploaded into
    ``hdfs_path`` (keeping their sub-directories) by ``multi_processes``
    concurrent ``hadoop`` commands; returns when all are done."""
    if not isinstance(client, HDFSClient):
        raise ValueError(f"multi_upload: client must be an HDFSClient, got {client!r}")
    if not sync:
        raise ValueError("multi_upload(sync=False): uploads always finish before it returns "
                         "(Fluid's waited too); call it from a thread of your own")
    files = [os.path.join(d, f) for d, _, fs in os.walk(local_path) for f in fs] \
        if os.path.isdir(local_path) else []

    def upload(path):
        rel = os.path.relpath(os.path.dirname(path), local_path)
        return client.upload(hdfs_path if rel == os.curdir else _join(hdfs_path, rel), path,
                             overwrite, retry_times=5)

    with ThreadPoolExecutor(max(int(multi_processes), 1)) as pool:
        list(pool.map(upload, files))
