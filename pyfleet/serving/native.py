"""The native front end of ``pyfleet serve`` (``--front native``, the default).

At one row a request, a server that runs Python for every request spends more
CPU on HTTP than the model spends on the row. :mod:`pyfleet.serving._front`
(C++, ``src/serving_*.cc``) holds the listening socket: an epoll thread reads
the requests of the common kind, ``POST /predict`` of Criteo TSV or JSON with a
``Content-Length`` body on an HTTP/1.1 connection (keep-alive, or closed after
its answer when the request says ``Connection: close``), and a dispatcher
thread gathers them into model steps as the Python batcher does (up to
``--batch-wait-ms`` for the other open connections, up to ``--max-batch-rows``
rows). Python runs once a step (:meth:`NativeFront.step`): the step's TSV
bodies, joined, in one parser call and one ``predict`` (JSON rows of named
columns are first written in C++ as the TSV lines the Python server makes of
them; other JSON is decoded here, as the Python server does). The answers are
written from C++.

A connection whose next request is of another kind (another path or method,
chunked, ``Expect``, HTTP/1.0, a body over 64 KiB, an
``Accept`` of npy, malformed HTTP, a request over ``--max-concurrent``...) is
handed, with the bytes read so far, to the Python server
(:mod:`pyfleet.serving.http`), which owns it from then on: every answer but the
common one is the Python path's own.
"""

import logging
import socket

import numpy as np

from pyfleet.data import _parse
from pyfleet.serving.http import _status_line
from pyfleet.serving.metrics import BATCH_BUCKETS, LATENCY_BUCKETS, Histogram
from pyfleet.serving.rows import JOIN_BYTES, BadRequest

try:
    from pyfleet.serving import _front
except ImportError:  # a build without the extension: --front python only
    _front = None

__all__ = ["NativeFront", "available", "listen"]

log = logging.getLogger("pyfleet.serve")
KEEPALIVE_TIMEOUT = 75.0


def available():
    return _front is not None


def listen(host, port, reuse_port=False):
    """Listening TCP sockets on ``host:port``: one an address ``host`` names (as
    asyncio's server does), all on one port (the first's, when ``port`` is 0)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks = []
    try:
        for family, _, _, _, addr in dict.fromkeys(infos):
            if socks:
                addr = (addr[0], socks[0].getsockname()[1], *addr[2:])
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
            sock.listen(1024)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


def _error(i, status, text, kind):
    return (i, status, _status_line(status), text.replace("\n", " ") + "\n", kind)


class NativeFront:
    """The C++ front end of ``server`` (a :class:`pyfleet.serving.app.Server`) on
    the listening sockets ``socks``; handed-over connections go to ``server``'s
    HTTP server on ``loop``."""

    def __init__(self, server, socks, loop):
        self.server, self.socks, self.loop = server, socks, loop
        opts = server.options
        self.batch_rows = Histogram(BATCH_BUCKETS)  # kept by the dispatcher thread
        self.rows = 0
        self.front = _front.Front([s.fileno() for s in socks], self.step, self.adopt, opts.batch_wait,
                                  opts.max_batch_rows, min(JOIN_BYTES, opts.max_body_bytes),
                                  opts.read_timeout, KEEPALIVE_TIMEOUT, opts.max_concurrent,
                                  list(LATENCY_BUCKETS))
        if server.schema is not None:
            self.front.set_schema(server.schema.n_dense, server.schema.n_slots,
                                  server.schema.generation)
        self.front.start()

    def stop(self, within=10.0):
        """(Blocking: run it off the event loop.)"""
        self.front.stop(within)
        for sock in self.socks:
            sock.close()

    def adopt(self, fd, data):
        """(The I/O thread) a connection for the Python server, ``data`` read from it."""
        self.loop.call_soon_threadsafe(self.server._http.adopt, fd, data)

    # -- a model step (the dispatcher thread) ----------------------------------

    def step(self, text, raw, text_ends, raw_ends, info):
        """The answers of one step's requests (see ``serving_bindings.cc``)."""
        n = info.shape[0]
        try:
            return self._step(text, raw, raw_ends, info)
        except Exception as e:  # answered per request; the next step runs as usual
            log.exception("model step failed")
            line = f"the model step failed: {type(e).__name__}: {e}"
            return (None, np.full(n, -1, np.int64), [_error(i, 500, line, "model")
                                                     for i in range(n)], b"", b"", b"")

    def _step(self, text, raw, raw_ends, info):
        server = self.server
        version, schema = server.serving  # one version for the step
        n = info.shape[0]
        if version is None:
            return (None, np.full(n, -1, np.int64),
                    [_error(i, 503, "the model is not loaded yet (GET /healthz says when)",
                            "loading") for i in range(n)], b"", b"", b"")
        batch, counts, errors, take = self._joined(schema, text, info)
        if batch is None and counts is None:
            batch, counts, errors, take = self._each(schema, raw, raw_ends, info[:, 0])
        if batch is None:
            return None, counts, errors, b"", b"", b""
        try:
            with server.step_lock:
                prob = version.predict(batch)
        except ValueError as e:  # the model's refusal of these rows (non-finite): all of them
            errors += [_error(i, 422, str(e), "model") for i in np.flatnonzero(counts >= 0)]
            return None, np.full(n, -1, np.int64), errors, b"", b"", b""
        self.batch_rows.observe(prob.shape[0])
        self.rows += prob.shape[0]
        if take is not None:
            prob = prob[take]
        return (prob, counts, errors, *server._json_parts(version))

    @staticmethod
    def _joined(schema, text, info):
        """The step's TSV bodies in one parser call when they are all well formed
        lines of one kind; ``(None, None, ...)`` otherwise."""
        kinds, rows, fields, clean, made_by = info.T
        want, f0 = schema.n_dense + schema.n_slots, int(fields[0])
        json_rows = kinds == 2  # JSON the front end wrote as TSV lines, by this schema?
        if (kinds == 1).any() or not clean.all() or f0 not in (want, want + 1) or \
                (fields != f0).any() or rows.max() > schema.max_rows or \
                (made_by[json_rows] != schema.generation).any():
            return None, None, None, None
        cols = (schema._kind, schema._index) if f0 == want else (schema._kind_l,
                                                                 schema._index_l)
        r = _parse.parse_delimited(memoryview(text), 9, *cols, schema.n_dense, schema.n_slots,
                                   "log", None, None)
        if r["malformed"] or r["examples"] != int(rows.sum()):
            return None, None, None, None
        return schema._batch(schema._delimited_chunk(r)), rows.astype(np.int64), [], None

    @staticmethod
    def _each(schema, raw, raw_ends, kinds):
        """Each request as the Python path takes it (its checks, its errors), the
        rows parsed together: ``(batch, counts, errors, take)``, ``prob[take]``
        being the probabilities in the requests' order."""
        n = kinds.shape[0]
        pendings, where, errors = [], [], []
        a = 0
        for i in range(n):
            b = int(raw_ends[i])
            ctype = "application/json" if kinds[i] else "text/tab-separated-values"
            try:
                pendings.append(schema.prepare(ctype, raw[a:b]))
                where.append(i)
            except BadRequest as e:
                errors.append(_error(i, e.status, str(e), "bad_input"))
            a = b
        counts = np.full(n, -1, np.int64)
        if not pendings:
            return None, counts, errors, None
        batch, order, results = schema.assemble(pendings)
        start, s = {}, 0
        for k in order:  # where each request's rows are in the batch
            start[k] = s
            s += results[k]
        take = []
        for k, res in enumerate(results):
            if isinstance(res, BadRequest):
                errors.append(_error(where[k], res.status, str(res), "bad_input"))
            elif res is not None:
                counts[where[k]] = res
                take.append(np.arange(start[k], start[k] + res))
        take = np.concatenate(take) if take else None
        return batch, counts, errors, take
