"""Paddle 1.x's reader decorators (``paddle.reader``, :mod:`pyfleet.reader`) and
``paddle.batch`` (``fluid.io.batch``).

A *reader creator* is a function of no arguments returning an iterable of
samples; each decorator takes reader creators and returns a new one, as
``paddle.reader.decorator`` did:

- ``map_readers(func, *readers)``: ``func(*items)`` of the readers' items, zipped;
- ``shuffle(reader, buf_size)``: shuffles within windows of ``buf_size`` samples;
- ``chain(*readers)``: one reader after another;
- ``compose(*readers, check_alignment=True)``: one tuple of every reader's
  items (tuples flattened); readers of different lengths raise
  :class:`ComposeNotAligned` unless ``check_alignment=False`` (then the
  shortest ends it);
- ``buffered(reader, size)``: reads ahead up to ``size`` samples in a thread;
- ``firstn(reader, n)``: the first ``n`` samples;
- ``xmap_readers(mapper, reader, process_num, buffer_size, order=False)``:
  ``mapper(sample)`` in ``process_num`` threads (``order=True`` keeps the
  input order);
- ``cache(reader)``: reads everything once, then replays it from memory;
- ``batch(reader, batch_size, drop_last=False)``: lists of ``batch_size`` samples.

An exception raised inside a reader or mapper running in a thread is raised
again by the iterating caller.
"""

import itertools
import queue
import random
import threading

__all__ = ["ComposeNotAligned", "batch", "buffered", "cache", "chain", "compose", "firstn",
           "map_readers", "multiprocess_reader", "shuffle", "xmap_readers"]

_END = object()


class ComposeNotAligned(ValueError):
    """``compose`` was given readers of different lengths."""


def batch(reader, batch_size, drop_last=False):
    """A reader creator yielding lists of ``batch_size`` samples from
    ``reader()`` (the last, shorter list too unless ``drop_last``)."""
    batch_size = int(batch_size)
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size}")

    def batch_reader():
        b = []
        for sample in reader():
            b.append(sample)
            if len(b) == batch_size:
                yield b
                b = []
        if b and not drop_last:
            yield b

    return batch_reader


def map_readers(func, *readers):
    def reader():
        for items in zip(*[r() for r in readers]):
            yield func(*items)
    return reader


def shuffle(reader, buf_size):
    buf_size = int(buf_size)
    if buf_size < 1:
        raise ValueError(f"shuffle: buf_size must be a positive integer, got {buf_size}")

    def shuffled():
        buf = []
        for item in reader():
            buf.append(item)
            if len(buf) >= buf_size:
                random.shuffle(buf)
                yield from buf
                buf = []
        if buf:
            random.shuffle(buf)
            yield from buf
    return shuffled


def chain(*readers):
    def reader():
        return itertools.chain(*[r() for r in readers])
    return reader


def compose(*readers, **kwargs):
    check_alignment = kwargs.pop("check_alignment", True)
    if kwargs:
        raise TypeError(f"compose got unexpected keyword arguments {sorted(kwargs)}")

    def flat(item):
        return item if isinstance(item, tuple) else (item,)

    def reader():
        its = [r() for r in readers]
        if not check_alignment:
            for items in zip(*its):
                yield sum((flat(i) for i in items), ())
            return
        for items in itertools.zip_longest(*its, fillvalue=_END):
            if any(i is _END for i in items):
                raise ComposeNotAligned("compose: the readers have different lengths")
            yield sum((flat(i) for i in items), ())
    return reader


def _pump(source, q, errors):
    try:
        for item in source:
            q.put(item)
    except BaseException as e:  # noqa: BLE001 - handed to the consumer
        errors.append(e)
    finally:
        q.put(_END)


def buffered(reader, size):
    size = int(size)
    if size < 1:
        raise ValueError(f"buffered: size must be a positive integer, got {size}")

    def read():
        q, errors = queue.Queue(maxsize=size), []
        threading.Thread(target=_pump, args=(reader(), q, errors), daemon=True,
                         name="paddle-reader-buffered").start()
        while True:
            item = q.get()
            if item is _END:
                break
            yield item
        if errors:
            raise errors[0]
    return read


def firstn(reader, n):
    n = int(n)

    def read():
        return itertools.islice(reader(), n)
    return read


def xmap_readers(mapper, reader, process_num, buffer_size, order=False):
    process_num, buffer_size = int(process_num), int(buffer_size)
    if process_num < 1 or buffer_size < 1:
        raise ValueError("xmap_readers: process_num and buffer_size must be positive")

    def read():
        inq, outq, errors = queue.Queue(buffer_size), queue.Queue(buffer_size), []

        def feed():
            try:
                for i, item in enumerate(reader()):
                    inq.put((i, item))
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                errors.append(e)
            finally:
                for _ in range(process_num):
                    inq.put(_END)

        def work():
            while True:
                job = inq.get()
                if job is _END:
                    outq.put(_END)
                    return
                try:
                    outq.put((job[0], mapper(job[1])))
                except BaseException as e:  # noqa: BLE001 - handed to the consumer
                    errors.append(e)
                    outq.put((job[0], _END))

        threading.Thread(target=feed, daemon=True, name="paddle-xmap-feed").start()
        for _ in range(process_num):
            threading.Thread(target=work, daemon=True, name="paddle-xmap").start()
        finished, pending, nxt = 0, {}, 0
        while finished < process_num:
            out = outq.get()
            if out is _END:
                finished += 1
                continue
            if errors:
                break
            if not order:
                yield out[1]
                continue
            pending[out[0]] = out[1]
            while nxt in pending:
                yield pending.pop(nxt)
                nxt += 1
        if errors:
            raise errors[0]
        for i in sorted(pending):
            yield pending[i]
    return read


def cache(reader):
    data = []
    filled = []

    def read():
        if not filled:
            data.extend(reader())
            filled.append(True)
        return iter(data)
    return read


def multiprocess_reader(readers, use_pipe=True, queue_size=1000):
    """Read several readers at once; samples come in arrival order. Fluid runs
    each reader in a forked process (``use_pipe`` picks its pipe or queue
    transport); here each runs in a thread of this process, so no sample is
    pickled, and both ``use_pipe`` values give the same samples. A reader's
    exception is raised again by the iterating caller."""
    if not isinstance(readers, (list, tuple)) or not readers:
        raise ValueError("multiprocess_reader: readers must be a non-empty list of readers")
    if int(queue_size) < 1:
        raise ValueError(f"multiprocess_reader: queue_size must be >= 1, got {queue_size}")

    def read():
        q, errors = queue.Queue(int(queue_size)), []

        def run(r):
            try:
                for item in r():
                    q.put(item)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                errors.append(e)
            finally:
                q.put(_END)

        for r in readers:
            threading.Thread(target=run, args=(r,), daemon=True,
                             name="paddle-multiprocess-reader").start()
        finished = 0
        while finished < len(readers):
            item = q.get()
            if item is _END:
                finished += 1
                continue
            yield item
        if errors:
            raise errors[0]
    return read
