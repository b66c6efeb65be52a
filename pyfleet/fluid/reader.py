"""Fluid's ``PyReader`` (and ``batch``, Paddle's ``paddle.batch``:
:mod:`pyfleet.data.reader_decorators`, with the other reader decorators).

A ``PyReader`` turns a Python generator into feeds. Iterable
(``iterable=True``): ``for data in reader(): exe.run(feed=data)``.
Non-iterable (``fluid.layers.create_py_reader_by_data``, ``iterable=False``):
``reader.start()``, then ``exe.run(program)`` without a feed takes the next
batch, until it raises ``fluid.core.EOFException``; ``reader.reset()`` ends
the pass. With ``use_double_buffer`` one background thread converts the next
``capacity`` batches while the executor computes; an exception in the
generator is raised by the ``exe.run`` that would have consumed its batch.

Fluid 1.5's layer form: ``reader = fluid.layers.py_reader(capacity, shapes,
dtypes, lod_levels)``, ``fluid.layers.read_file(reader)`` (its data
variables), ``fluid.layers.double_buffer(reader)`` (the reader itself: every
PyReader here converts ahead in a thread when ``use_double_buffer``). Fluid
1.6's ``fluid.io.DataLoader.from_generator`` makes the same reader, with the
``set_sample_generator`` / ``set_sample_list_generator`` /
``set_batch_generator`` spellings.

A PyReader is used by one executor thread at a time.
"""

from pyfleet.data.prefetch import prefetched
from pyfleet.data.reader_decorators import batch
from pyfleet.fluid import framework, unique_name
from pyfleet.fluid.data_feeder import DataFeeder

__all__ = ["DataLoader", "PyReader", "batch", "double_buffer", "py_reader", "read_file"]


class PyReader:
    """Fluid 1.5's ``fluid.io.PyReader(feed_list, capacity, use_double_buffer,
    iterable, return_list)`` on one CPU place."""

    def __init__(self, feed_list=None, capacity=64, use_double_buffer=True, iterable=True,
                 return_list=False):
        if not feed_list:
            raise ValueError("PyReader needs feed_list: the data variables it fills")
        self.feed_list = list(feed_list)
        self.capacity = max(int(capacity), 1)
        self.use_double_buffer = bool(use_double_buffer)
        self.iterable = bool(iterable)
        self.return_list = bool(return_list)
        self._source = None
        self._iter = None
        if not self.iterable:
            program = self.feed_list[0].block.program
            program._py_readers.append(self)

    # ------------------------------------------------------------- sources
    def decorate_sample_generator(self, sample_generator, batch_size, drop_last=True,
                                  places=None):
        """``sample_generator()`` yields one sample (a tuple in feed_list order)."""
        self.decorate_sample_list_generator(batch(sample_generator, batch_size, drop_last),
                                            places)

    def decorate_sample_list_generator(self, reader, places=None):
        """``reader()`` yields lists of samples (as ``paddle.batch`` makes)."""
        feeder = DataFeeder(self.feed_list, program=self.feed_list[0].block.program)

        def feeds():
            for samples in reader():
                yield feeder.feed(samples)
        self._source = feeds

    decorate_paddle_reader = decorate_sample_list_generator

    def decorate_batch_generator(self, reader, places=None):
        """``reader()`` yields one batch: a tuple/list of arrays in feed_list
        order (a lod input as ``(values, offsets)`` or LoDTensor), or a dict."""
        names = [v.name for v in self.feed_list]

        def feeds():
            for item in reader():
                if isinstance(item, dict):
                    yield item
                    continue
                if len(item) != len(names):
                    raise ValueError(f"batch generator yielded {len(item)} arrays for "
                                     f"{len(names)} feed variables {names}")
                yield dict(zip(names, item))
        self._source = feeds

    decorate_tensor_provider = decorate_batch_generator
    # Fluid 1.6's DataLoader names
    set_sample_generator = decorate_sample_generator
    set_sample_list_generator = decorate_sample_list_generator
    set_batch_generator = decorate_batch_generator

    # ------------------------------------------------------------- running
    def _feeds(self):
        if self._source is None:
            raise ValueError("PyReader has no data source: call a decorate_* method first")
        if not self.use_double_buffer:
            yield from self._source()
            return
        yield from prefetched(self._source(), self.capacity, "pyfleet-pyreader")

    def __call__(self):
        if not self.iterable:
            raise ValueError("this PyReader is not iterable: use start(), exe.run(), reset()")
        for f in self._feeds():
            yield [f[v.name] for v in self.feed_list] if self.return_list else [f]

    def __iter__(self):
        return self()

    def start(self):
        if self.iterable:
            raise ValueError("start() is for non-iterable readers; iterate this one")
        if self._iter is not None:
            raise ValueError("PyReader already started: call reset() after EOFException")
        self._iter = self._feeds()

    def reset(self):
        if self._iter is not None:
            self._iter.close()  # stops a double-buffering thread too
        self._iter = None

    def _next_feed(self):
        """The next feed dict; None when exhausted (or never started)."""
        if self._iter is None:
            return None
        return next(self._iter, None)


class DataLoader:
    """Fluid 1.6's ``fluid.io.DataLoader``: ``from_generator`` only."""

    @staticmethod
    def from_generator(feed_list=None, capacity=None, use_double_buffer=True, iterable=True,
                       return_list=False, use_multiprocess=False):
        if use_multiprocess:
            raise ValueError("DataLoader.from_generator: use_multiprocess=True is not "
                             "supported; the reader converts ahead in one thread")
        return PyReader(feed_list, capacity or 64, use_double_buffer, iterable, return_list)

    @staticmethod
    def from_dataset(dataset, places, drop_last=True):
        raise ValueError("DataLoader.from_dataset is not supported: train a Dataset with "
                         "exe.train_from_dataset")


def py_reader(capacity, shapes, dtypes, lod_levels=None, name=None, use_double_buffer=True):
    """Fluid 1.5's ``fluid.layers.py_reader``: a non-iterable PyReader with
    one new data variable per entry of ``shapes`` (``-1`` the batch
    dimension), ``dtypes`` and ``lod_levels``; get them with :func:`read_file`."""
    if len(dtypes) != len(shapes):
        raise ValueError(f"py_reader: {len(shapes)} shapes but {len(dtypes)} dtypes")
    lod_levels = [0] * len(shapes) if lod_levels is None else list(lod_levels)
    if len(lod_levels) != len(shapes):
        raise ValueError(f"py_reader: {len(shapes)} shapes but {len(lod_levels)} lod_levels")
    block = framework.default_main_program().global_block()
    prefix = name or "py_reader"
    feed_list = []
    for shape, dtype, lod in zip(shapes, dtypes, lod_levels):
        if int(lod) not in (0, 1):
            raise ValueError(f"py_reader: only lod_level 0 or 1 is supported, got {lod}")
        shape = [-1 if s is None else int(s) for s in shape]
        feed_list.append(block.create_var(unique_name.generate(prefix + ".data"), shape, dtype,
                                          int(lod), stop_gradient=True, is_data=True))
    return PyReader(feed_list, capacity, use_double_buffer, iterable=False)


def read_file(reader):
    """The data variables of a :func:`py_reader` (one variable alone, else a list)."""
    if not isinstance(reader, PyReader):
        raise ValueError(f"read_file needs a reader from fluid.layers.py_reader, got {reader!r}")
    return reader.feed_list[0] if len(reader.feed_list) == 1 else list(reader.feed_list)


def double_buffer(reader, place=None, name=None):
    """The reader itself: a PyReader already converts ahead in a thread."""
    if not isinstance(reader, PyReader):
        raise ValueError(f"double_buffer needs a PyReader, got {reader!r}")
    reader.use_double_buffer = True
    return reader
