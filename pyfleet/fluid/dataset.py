"""Fluid 1.5's ``DatasetFactory`` / ``QueueDataset`` / ``InMemoryDataset``.

As in Fluid, each file of the file list is piped through ``pipe_command``
(a shell command, e.g. ``python criteo_reader.py`` built on
:mod:`pyfleet.fluid.incubate.data_generator`; default ``cat``) and its
output, in the MultiSlot text format (per sample one line; per variable of
``set_use_var`` in order: the number of values, then the values), is cut into
batches of ``set_batch_size`` for ``Executor.train_from_dataset``.

The format is parsed by :mod:`pyfleet.data.multislot` (vectorized when every
line has the same layout). For the fastest path feed :mod:`pyfleet.data`
batches to ``Executor.run`` directly.

``set_thread`` is accepted; one background thread runs the pipe and parsing
while the executor trains in the calling thread. A failing pipe command is a
``ValueError`` naming the command, the file and its stderr.

An ``hdfs:``/``afs:`` file of the list is read as Fluid read it: ``hadoop fs
-cat PATH`` (``-text`` for ``.gz``) piped into the pipe command, with the
``-D fs.default.name``/``-D hadoop.job.ugi`` options of ``set_hdfs_config``
(or the command of ``set_download_cmd``); a failing read is a ValueError naming
the path, the command and its stderr (:mod:`pyfleet.fluid.hadoop`).
"""

import logging
import subprocess
import tempfile
import threading

import numpy as np

from pyfleet.data.multislot import concat_columns as _concat_columns
from pyfleet.data.multislot import parse_multislot
from pyfleet.data.multislot import permute_columns as _permute
from pyfleet.data.multislot import slice_columns as _slice
from pyfleet.fluid import hadoop
from pyfleet.fluid.reader import PyReader

__all__ = ["CHUNK_BYTES", "DatasetFactory", "InMemoryDataset", "QueueDataset", "parse_multislot"]

_log = logging.getLogger("pyfleet.fluid.dataset")

# Pipe output is parsed in blocks of about this many bytes (whole lines).
CHUNK_BYTES = 32 << 20


class DatasetBase:
    """Settings shared by both dataset kinds (Fluid's setter names)."""

    def __init__(self):
        self.use_vars = []
        self.pipe_command = "cat"
        self.batch_size = 1
        self.thread_num = 1
        self.filelist = []
        self._hadoop = hadoop.HadoopFS()   # hadoop's own configuration until set_hdfs_config

    def set_use_var(self, var_list):
        self.use_vars = list(var_list)

    def set_pipe_command(self, pipe_command):
        self.pipe_command = str(pipe_command)

    def set_batch_size(self, batch_size):
        batch_size = int(batch_size)
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.batch_size = batch_size

    def set_thread(self, thread_num):
        self.thread_num = max(int(thread_num), 1)

    def set_filelist(self, filelist):
        self.filelist = [str(f) for f in filelist]

    def set_hdfs_config(self, fs_name, fs_ugi):
        """Read the ``hdfs:``/``afs:`` files of the list with ``hadoop fs -D
        fs.default.name=fs_name -D hadoop.job.ugi=fs_ugi -cat`` (:mod:`pyfleet.fluid.hadoop`);
        local files are read as before."""
        self._hadoop = hadoop.HadoopFS(fs_name, fs_ugi, download_cmd=self._hadoop.download_cmd)

    def set_download_cmd(self, download_cmd):
        """Read ``hdfs:``/``afs:`` files with ``download_cmd PATH`` (its stdout)
        instead of ``hadoop fs -cat``, as Fluid's ``set_download_cmd``."""
        self._hadoop.download_cmd = str(download_cmd) or None

    def desc(self):
        return (f"{type(self).__name__}(files={len(self.filelist)}, batch_size="
                f"{self.batch_size}, pipe_command={self.pipe_command!r}, "
                f"use_var={[v.name for v in self.use_vars]})")

    def _check(self):
        if not self.use_vars:
            raise ValueError("dataset has no variables: call set_use_var([...]) first")

    def _open(self, path):
        """``(binary stream of the file, reader process or None)``: a local file,
        or the stdout of ``hadoop fs -cat`` for an ``hdfs:``/``afs:`` path."""
        if hadoop.is_remote(path):
            return self._hadoop.open_read(path)
        try:
            return open(path, "rb"), None  # noqa: SIM115 (closed by _read_file)
        except OSError as e:
            raise ValueError(f"cannot read {path}: {e}") from None

    def _read_file(self, path):
        """Yield ``(columns, n)`` per chunk of the pipe's output (bounded memory)."""
        src, reader = self._open(path)
        if reader is not None:   # (process, its stderr file)
            reader, reader_err = src, reader
            src = reader.stdout
        with src, tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(self.pipe_command, shell=True, stdin=src,
                                        stdout=subprocess.PIPE, stderr=err)
            except BaseException:
                if reader is not None:
                    reader.kill()
                    reader.wait()
                    reader_err.close()
                raise
            src.close()   # the pipe command holds it now (a reader sees it stop early)
            complete = False
            try:
                rest = b""
                while True:
                    block = proc.stdout.read(CHUNK_BYTES)
                    if not block:
                        break
                    block = rest + block
                    cut = block.rfind(b"\n") + 1
                    rest = block[cut:]
                    if cut:
                        yield self._parse(block[:cut], path)
                if rest.strip():
                    yield self._parse(rest, path)
                complete = True
            finally:
                proc.stdout.close()
                code = proc.wait()
                if reader is not None and not complete:   # stopped early: no error
                    reader.kill()
                    reader.wait()
                    reader_err.close()
            if reader is not None:   # the read of the file itself first: its stderr
                self._hadoop.check(reader, reader_err, path)
            if code != 0:
                err.seek(0)
                msg = err.read().decode(errors="replace").strip()[-2000:]
                raise ValueError(f"pipe command {self.pipe_command!r} failed on {path} "
                                 f"(exit {code}): {msg}")

    def _parse(self, data, path):
        try:
            return parse_multislot(data, self.use_vars)
        except ValueError as e:
            raise ValueError(f"{path} through {self.pipe_command!r}: {e}") from None

    def _columns(self):
        for path in self.filelist:
            for cols, n in self._read_file(path):
                if n:
                    yield cols, n

    def _batch_feeds(self):
        """Full batches across chunk and file boundaries; the last may be short."""
        self._check()
        bs = self.batch_size
        carry = None
        for cols, n in self._columns():
            if carry is not None:
                cols, n = _concat_columns([carry, (cols, n)], self.use_vars)
            full = n - n % bs
            for a in range(0, full, bs):
                yield _slice(cols, self.use_vars, a, a + bs)
            carry = (_slice(cols, self.use_vars, full, n), n - full) if full < n else None
        if carry is not None:
            yield carry[0]

    def _feeds(self):
        """Feed dicts of every batch, parsed one file ahead in a background thread."""
        self._check()
        reader = PyReader(self.use_vars, capacity=4, use_double_buffer=True, iterable=True)
        reader.decorate_batch_generator(self._batch_feeds)
        for (feed,) in reader():
            yield feed


class QueueDataset(DatasetBase):
    """Streams the files: each pass runs the pipe command again."""


class InMemoryDataset(DatasetBase):
    """``load_into_memory()`` (or ``preload_into_memory()`` then
    ``wait_preload_done()``) once, then shuffles and passes over memory.

    Shuffles draw from a generator seeded 1, 2, ... per shuffle (reproducible).
    ``global_shuffle`` with one process, or under Fleet with one worker, is
    ``local_shuffle``; with several Fleet workers each worker shuffles the
    examples it loaded (its ``fleet.split_files`` share): no example moves
    between workers (Fluid sends each to a random worker), which is logged
    once. ``slots_shuffle`` (after ``set_fea_eval``) replaces the values of
    the named slots by those of other examples, for feature importance.
    ``set_merge_by_lineid`` and ``set_parse_ins_id(True)`` are refused by name.
    """

    def __init__(self):
        super().__init__()
        self._memory = None
        self._seed = 0
        self.queue_num = None
        self.fea_eval = False
        self.record_candidate_size = None
        self._preload = None   # (thread, [error]) of preload_into_memory

    def set_queue_num(self, queue_num):
        """Fluid's number of shuffle channels: a parallelism setting that
        changes no example; recorded (``queue_num``)."""
        queue_num = int(queue_num)
        if queue_num < 1:
            raise ValueError(f"set_queue_num: queue_num must be positive, got {queue_num}")
        self.queue_num = queue_num

    def set_parse_ins_id(self, parse_ins_id):
        if parse_ins_id:
            raise ValueError("set_parse_ins_id(True) is not supported: pyfleet's MultiSlot "
                             "lines carry no instance id (set_merge_by_lineid is refused too)")

    def set_merge_by_lineid(self, var_list=None, erase_duplicate_feas=True,
                            min_merge_size=2, keep_unmerged_ins=True):
        raise ValueError("set_merge_by_lineid is not supported: merging instances by line "
                         "id needs instance ids in the data (set_parse_ins_id), which "
                         "pyfleet's MultiSlot reader does not parse; merge them in the pipe "
                         "command instead")

    def set_fea_eval(self, record_candidate_size, fea_eval=True):
        """Enable :meth:`slots_shuffle`, drawing replacement values from
        ``record_candidate_size`` randomly chosen examples."""
        size = int(record_candidate_size)
        if size < 1:
            raise ValueError(f"set_fea_eval: record_candidate_size must be positive, got "
                             f"{record_candidate_size!r}")
        self.fea_eval = bool(fea_eval)
        self.record_candidate_size = size

    def load_into_memory(self):
        self._check()
        parts = list(DatasetBase._columns(self))
        self._memory = _concat_columns(parts, self.use_vars)

    def preload_into_memory(self, thread_num=None):
        """``load_into_memory`` in a background thread; :meth:`wait_preload_done`
        waits for it (and raises what it raised)."""
        self._check()
        if self._preload is not None:
            raise ValueError("preload_into_memory: a preload is already running; call "
                             "wait_preload_done() first")
        errors = []

        def run():
            try:
                self.load_into_memory()
            except Exception as e:  # noqa: BLE001 (handed to wait_preload_done)
                errors.append(e)
        t = threading.Thread(target=run, name="pyfleet-dataset-preload", daemon=True)
        self._preload = (t, errors)
        t.start()

    def wait_preload_done(self):
        if self._preload is None:
            raise ValueError("wait_preload_done: no preload_into_memory() is running")
        t, errors = self._preload
        t.join()
        self._preload = None
        if errors:
            raise errors[0]

    def _loaded(self, what):
        if self._preload is not None:
            raise ValueError(f"{what}: call wait_preload_done() after preload_into_memory()")
        if self._memory is None:
            raise ValueError(f"load_into_memory() before {what}()")
        return self._memory

    def _rng(self):
        self._seed += 1
        return np.random.default_rng(self._seed)

    def local_shuffle(self):
        cols, n = self._loaded("local_shuffle")
        perm = self._rng().permutation(n)
        self._memory = _permute(cols, self.use_vars, perm), n

    def global_shuffle(self, fleet=None, thread_num=12):
        """One process: :meth:`local_shuffle`. Several Fleet workers: each
        shuffles its own examples (see the class doc)."""
        workers = 1 if fleet is None else int(fleet.worker_num())
        if workers > 1:
            _log.warning("InMemoryDataset.global_shuffle with %d workers shuffles each "
                         "worker's own examples (its split_files share); no example moves "
                         "between workers as in Fluid", workers)
        self.local_shuffle()

    def slots_shuffle(self, slots):
        """Replace the values of each slot in ``slots`` (variable names) by
        those of other examples: a random permutation of them over the loaded
        examples, or (more examples than ``record_candidate_size``) each
        example's replacement drawn from that many randomly chosen examples,
        as Fluid's candidate pool. Other slots keep their values."""
        if not self.fea_eval:
            raise ValueError("slots_shuffle needs set_fea_eval(record_candidate_size, True) "
                             "first (Fluid silently does nothing without it)")
        cols, n = self._loaded("slots_shuffle")
        names = {v.name: v for v in self.use_vars}
        unknown = [s for s in slots if s not in names]
        if unknown:
            raise ValueError(f"slots_shuffle: {unknown} are not variables of set_use_var "
                             f"({sorted(names)})")
        out = dict(cols)
        for name in sorted(set(slots)):
            rng = self._rng()
            if n <= self.record_candidate_size:
                index = rng.permutation(n)
            else:
                pool = rng.choice(n, size=self.record_candidate_size, replace=False)
                index = pool[rng.integers(0, pool.shape[0], size=n)]
            out.update(_permute(cols, [names[name]], index))
        self._memory = out, n

    def release_memory(self):
        if self._preload is not None:
            self.wait_preload_done()
        self._memory = None

    def get_memory_data_size(self, fleet=None):
        """Examples loaded in this process (with a ``fleet`` of several
        workers Fluid sums them over the workers; this counts this worker's)."""
        return 0 if self._memory is None else self._memory[1]

    get_shuffle_data_size = get_memory_data_size

    def _columns(self):
        cols, n = self._loaded("train_from_dataset")
        if n:
            yield cols, n


class DatasetFactory:
    """``fluid.DatasetFactory().create_dataset("QueueDataset" | "InMemoryDataset")``."""

    def create_dataset(self, datafeed_class="QueueDataset"):
        kinds = {"QueueDataset": QueueDataset, "InMemoryDataset": InMemoryDataset}
        try:
            return kinds[datafeed_class]()
        except KeyError:
            raise ValueError(f"unknown dataset {datafeed_class!r}; expected one of "
                             f"{sorted(kinds)}") from None
