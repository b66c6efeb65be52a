"""``paddle.dataset.common``: the file helpers of Paddle's dataset package.

- ``DATA_HOME``: ``~/.cache/paddle/dataset``, where datasets are cached.
- ``md5file(path)``: the file's MD5 hex digest.
- ``download(url, module_name, md5sum, save_name=None)``: the path of
  ``DATA_HOME/module_name/<name>`` when it is there with that MD5. pyfleet
  never downloads: a missing or different file is a ValueError saying where
  to put it.
- ``split(reader, line_count, suffix, dumper)``: write a reader's samples in
  files of ``line_count`` samples (as Paddle, the first holds one more).
- ``cluster_files_reader(pattern, trainer_count, trainer_id, loader)``: read
  this trainer's share of those files (every ``trainer_count``-th, sorted).

Files are written and read in binary mode with the caller's ``dumper`` /
``loader``. Paddle defaulted them to ``pickle``; pyfleet holds no pickle code at
all (docs/service.md, "Security"), so without them these calls raise a
ValueError naming the argument: pass ``dumper=pickle.dump`` / ``loader=pickle.load``
yourself for files you wrote.
"""

import errno
import glob
import hashlib
import os

__all__ = ["DATA_HOME", "cluster_files_reader", "download", "md5file", "must_mkdirs", "split"]

DATA_HOME = os.path.expanduser("~/.cache/paddle/dataset")


def must_mkdirs(path):
    """``os.makedirs(path)``, an existing directory being no error."""
    try:
        os.makedirs(path)
    except OSError as exc:
        if exc.errno != errno.EEXIST:
            raise


def md5file(fname):
    h = hashlib.md5()
    with open(fname, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            h.update(chunk)
    return h.hexdigest()


def download(url, module_name, md5sum, save_name=None):
    filename = os.path.join(DATA_HOME, module_name,
                            url.split("/")[-1] if save_name is None else save_name)
    if os.path.exists(filename):
        got = md5file(filename)
        if got == md5sum:
            return filename
        raise ValueError(f"paddle.dataset.common.download: {filename} has MD5 {got}, "
                         f"expected {md5sum}; replace it with the file from {url}")
    raise ValueError(f"paddle.dataset.common.download: pyfleet does not download; put the "
                     f"file from {url} (MD5 {md5sum}) at {filename}")


def _needs(fn, name):
    if fn is None:
        raise ValueError(f"paddle.dataset.common: pyfleet has no pickle default for {name}: "
                         f"pass your own (e.g. {name}=pickle.{name[:-2]}) for your own files")
    if not callable(fn):
        raise TypeError(f"{name} should be callable.")


def split(reader, line_count, suffix="%05d.pickle", dumper=None):
    _needs(dumper, "dumper")
    lines, index = [], 0
    for i, d in enumerate(reader()):
        lines.append(d)
        if i >= line_count and i % line_count == 0:
            with open(suffix % index, "wb") as f:
                dumper(lines, f)
            lines, index = [], index + 1
    if lines:
        with open(suffix % index, "wb") as f:
            dumper(lines, f)


def cluster_files_reader(files_pattern, trainer_count, trainer_id, loader=None):
    def reader():
        _needs(loader, "loader")
        files = sorted(glob.glob(files_pattern))
        for fn in files[trainer_id::trainer_count]:
            with open(fn, "rb") as f:
                yield from loader(f)
    return reader
