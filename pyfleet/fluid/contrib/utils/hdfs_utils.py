"""``fluid.contrib.utils.hdfs_utils``: importable; using HDFS is refused by
name (pyfleet reads and writes local paths only: copy the files first)."""

from pyfleet.errors import ConfigError

__all__ = ["HDFSClient", "multi_download", "multi_upload"]


def _refuse(what):
    return ConfigError(f"fluid.contrib.utils.hdfs_utils.{what}: HDFS is not supported by "
                       "pyfleet (it reads and writes local paths only); copy the files to a "
                       "local or mounted directory and give that path")


class HDFSClient:
    """Refused when created: see the module doc."""

    def __init__(self, hadoop_home, configs):
        raise _refuse("HDFSClient")


def multi_download(client, hdfs_path, local_path, trainer_id, trainers, multi_processes=5):
    """Refused: see the module doc."""
    raise _refuse("multi_download")


def multi_upload(client, hdfs_path, local_path, multi_processes=5, overwrite=False,
                 sync=True):
    """Refused: see the module doc."""
    raise _refuse("multi_upload")
