"""The HTTP server of ``pyfleet serve`` (:mod:`pyfleet.serving.http`: httptools'
parser in an asyncio Protocol, on uvloop's event loop where it is installed).

Routes: ``POST /predict`` (bodies: :mod:`pyfleet.serving.rows`; answer JSON
``{"predictions": [...], "model_version": name}``, or with ``Accept:
application/x-npy`` the float32 probabilities as a ``.npy`` file and the
version in the ``X-Model-Version`` header), ``GET /healthz`` (200 once a model
is loaded, 503 before), ``GET /metrics`` (Prometheus text), ``GET /model``
(the served version's description, JSON).

Micro-batching: requests are checked on arrival and queued; one task takes
every queued request (and, while other requests are still being read or other
open connections have not sent theirs, waits up to ``batch_wait`` seconds for
more, up to ``max_batch_rows`` rows) into one model step on the model thread, where the small Criteo TSV and JSON bodies are
parsed together in one call, then answers each request with its slice.
The version served is read once per step, so a step, and every request in
it, is answered by one whole version; a swap is one assignment on the loop.

Nothing is created a request but its :class:`~pyfleet.serving.http.Request`: the
batcher answers a request by writing it to its connection (:class:`_Reply`), no
task or future between.

A refused request gets a 4xx status and one line of text naming the problem;
the server keeps serving.
"""

import asyncio
import collections
import io
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from pyfleet.serving import native
from pyfleet.serving.http import HTTPServer, Route
from pyfleet.serving.metrics import ServeMetrics
from pyfleet.serving.rows import BadRequest, RowSchema

__all__ = ["ServeOptions", "Server"]

log = logging.getLogger("pyfleet.serve")
_PARSE_IN_THREAD = 64 << 10  # bodies larger than this are parsed off the event loop


class ServeOptions:
    """The limits and batching of a server (``pyfleet serve``'s options)."""

    def __init__(self, max_body_bytes=16 << 20, max_rows=16384, max_concurrent=256,
                 batch_wait=0.001, max_batch_rows=4096, slots=None, read_timeout=30.0,
                 front="native"):
        for name, v in (("max_body_bytes", max_body_bytes), ("max_rows", max_rows),
                        ("max_concurrent", max_concurrent), ("max_batch_rows", max_batch_rows)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not 0 <= batch_wait <= 1:
            raise ValueError(f"batch_wait must be between 0 and 1 second, got {batch_wait!r}")
        if not read_timeout > 0:
            raise ValueError(f"read_timeout must be > 0 seconds, got {read_timeout!r}")
        if front not in ("native", "python"):
            raise ValueError(f"front must be 'native' or 'python', got {front!r}")
        if front == "native" and not native.available():
            raise ValueError("the native front end (pyfleet.serving._front) is not built: "
                             "reinstall pyfleet, or use --front python")
        self.front = front
        self.read_timeout = float(read_timeout)
        self.max_body_bytes, self.max_rows = max_body_bytes, max_rows
        self.max_concurrent, self.max_batch_rows = max_concurrent, max_batch_rows
        self.batch_wait, self.slots = float(batch_wait), slots


def _step(version, schema, pendings, lock):
    """One model step on the model thread: the requests' rows parsed together
    (:meth:`RowSchema.assemble`) and predicted by ``version`` (holding ``lock``:
    the native front end's steps run on its own thread)."""
    batch, order, results = schema.assemble(pendings)
    if batch is None:
        return None, order, results
    with lock:
        return version.predict(batch), order, results


JSON = b"application/json; charset=utf-8"
NPY = b"application/x-npy"
PROMETHEUS = b"text/plain; version=0.0.4; charset=utf-8"
_RECEIVING, _QUEUED = 1, 2  # Request.state of a prediction request holding a slot


class _Reply:
    """Where the batcher answers one prediction request (as it would a future's
    ``set_result``/``set_exception``): written to its connection at once."""

    __slots__ = ("request", "server")

    def __init__(self, server, request):
        self.server, self.request = server, request

    def done(self):
        return self.request.answered  # answered, or its client has gone

    def set_result(self, result):
        prob, version = result
        req = self.request
        if b"application/x-npy" in req.headers.get(b"accept", b""):
            buf = io.BytesIO()
            np.save(buf, prob.astype(np.float32), allow_pickle=False)
            req.respond(200, buf.getvalue(), NPY, self.server._version_header(version))
            return
        text = ", ".join(map(repr, prob.tolist()))
        if "n" in text:  # nan or inf (a finite float's repr has no n): JSON's own words
            text = json.dumps(prob.tolist())[1:-1]
        prefix, suffix, header = self.server._json_parts(version)
        req.respond(200, prefix + text.encode() + suffix, JSON, header)

    def set_exception(self, e):
        req = self.request
        if isinstance(e, BadRequest):  # its lines, parsed with the step's
            req.refuse(e.status, str(e), "bad_input")
        elif isinstance(e, ValueError):  # the model's own refusal of these rows (non-finite)
            req.refuse(422, str(e), "model")
        else:  # logged with its trace by the batcher
            req.refuse(500, f"the model step failed: {type(e).__name__}: {e}", "model")


class Server:
    """Serves :class:`pyfleet.serving.model.ModelVersion` objects over HTTP.

    ``swap(version)`` must be called on the event loop (the follower uses
    ``loop.call_soon_threadsafe``). Lifetime: ``await start(host, port)``,
    then ``await stop()``."""

    def __init__(self, options):
        self.options = options
        self.metrics = ServeMetrics()
        self.last_refusal = None
        self._pending = collections.deque()  # (Pending rows, future) of queued requests
        self._wake = None  # the batcher's future while it waits for a request
        self._waiting_bodies = 0  # requests accepted whose rows are not queued yet
        self._model_thread = ThreadPoolExecutor(1, thread_name_prefix="pyfleet-serve-model")
        self._parse_threads = ThreadPoolExecutor(2, thread_name_prefix="pyfleet-serve-parse")
        self._http = None
        self._batcher = None
        self._answer_of = (None, b"", b"", b"")  # version, its JSON prefix, suffix, header
        self.step_lock = threading.Lock()  # one model step at a time (ModelVersion.predict)
        self.native = None  # the native front end (NativeFront), when it serves
        self.serving = (None, None)  # (version, schema): one object, read whole by other threads
        self._generation = 0  # of the schemas, for the native front end's JSON rows

    # -- versions -------------------------------------------------------------

    @property
    def version(self):
        """The ModelVersion served (None until the first)."""
        return self.serving[0]

    @property
    def schema(self):
        """The RowSchema of :attr:`version`'s rows."""
        return self.serving[1]

    def swap(self, version):
        schema = RowSchema(version.n_dense, version.n_slots, self.options.slots,
                           self.options.max_rows)
        if self.version is not None:
            self.metrics.swaps += 1
            log.info("serving %s (was %s)", version.name, self.version.name)
        else:
            log.info("serving %s", version.name)
        self._generation += 1
        schema.generation = self._generation
        self.serving = (version, schema)
        if self.native is not None:
            self.native.front.set_schema(schema.n_dense, schema.n_slots, schema.generation)

    def refused(self, where, error):
        self.metrics.load_failures += 1
        self.last_refusal = f"{where}: {error}"
        log.error("model version refused, %s keeps serving: %s: %s",
                  self.version.name if self.version else "nothing", where, error)

    def current(self):
        """``(directory, digest)`` of the version served, or None."""
        v = self.version
        return None if v is None else (v.dirname, v.digest)

    def _json_parts(self, version):
        """The bytes of an answer of ``version`` around its predictions, and its header."""
        if self._answer_of[0] is not version:
            name = json.dumps(version.name)
            self._answer_of = (version, b'{"predictions": [',
                               f'], "model_version": {name}}}'.encode(),
                               self._version_header(version))
        return self._answer_of[1:]

    @staticmethod
    def _version_header(version):
        return f"X-Model-Version: {version.name}\r\n".encode("latin-1", "replace")

    # -- lifetime -------------------------------------------------------------

    def routes(self):
        return {"/predict": {"POST": Route(self.predict, self.admit)},
                "/healthz": {"GET": Route(self.healthz)},
                "/metrics": {"GET": Route(self.metrics_text)},
                "/model": {"GET": Route(self.model_info)}}

    async def start(self, host, port, reuse_port=False):
        """Listen on ``host:port`` (0: a free port); returns the port."""
        loop = asyncio.get_running_loop()
        self._batcher = loop.create_task(self._batch_loop())
        self._http = HTTPServer(self.routes(), max_body_bytes=self.options.max_body_bytes,
                                read_timeout=self.options.read_timeout, on_done=self._done,
                                on_abort=self._release, log=log)
        if self.options.front == "python":
            return await self._http.start(host, port, reuse_port)
        socks = native.listen(host, port, reuse_port)
        self._http.serve_handed_over()
        self.native = native.NativeFront(self, socks, loop)
        return socks[0].getsockname()[1]

    async def stop(self):
        if self.native is not None:  # its requests answered (the loop runs on meanwhile)
            await asyncio.get_running_loop().run_in_executor(None, self.native.stop, 10.0)
        if self._http is not None:
            await self._http.stop()
        if self._batcher is not None:
            self._batcher.cancel()
        self._model_thread.shutdown(wait=True)
        self._parse_threads.shutdown(wait=True)

    # -- handlers -------------------------------------------------------------

    def _done(self, request, status, kind):
        """Every answer: counted (prediction requests timed), its slot freed."""
        self._release(request)
        self.metrics.request(status, time.perf_counter() - request.t0, kind,
                             timed=request.path == "/predict")

    def _release(self, request):
        state = request.state
        if state:
            request.state = None
            self.metrics.in_flight -= 1
            if self.native is not None:
                self.native.front.release()
            if state == _RECEIVING:
                self._waiting_bodies -= 1

    def healthz(self, request):
        v = self.version
        if v is None:
            return request.respond(503, b'{"status": "loading"}', JSON)
        request.respond(200, json.dumps({"status": "ready", "model_version": v.name}).encode(),
                        JSON)

    def model_info(self, request):
        v = self.version
        if v is None:
            return request.refuse(503, "no model loaded yet", "loading")
        request.respond(200, json.dumps({**v.info(), "last_refusal": self.last_refusal})
                        .encode(), JSON)

    def metrics_text(self, request):
        v = self.version
        text = self.metrics.render(v, {} if v is None else v.table_stats(), self.native)
        request.respond(200, text.encode(), PROMETHEUS, b"X-Prometheus-Format: 0.0.4\r\n")

    def admit(self, request):
        """A prediction request whose head is read: a slot, or the refusal."""
        m = self.metrics
        if self.version is None:
            return 503, "the model is not loaded yet (GET /healthz says when)", "loading"
        if (m.in_flight >= self.options.max_concurrent if self.native is None
                else not self.native.front.try_acquire()):
            return (429, f"more than --max-concurrent {self.options.max_concurrent} "
                         f"requests at once: retry later", "concurrency")
        m.in_flight += 1
        self._waiting_bodies += 1
        request.state = _RECEIVING
        return None

    def predict(self, request):
        """A prediction request whose body is read: checked and queued for a step."""
        self._waiting_bodies -= 1
        request.state = _QUEUED
        body, schema = request.body, self.schema
        if len(body) > _PARSE_IN_THREAD:
            fut = asyncio.get_running_loop().run_in_executor(
                self._parse_threads, schema.prepare, request.content_type, body)
            fut.add_done_callback(lambda f: self._prepared(request, f))
            return
        try:
            rows = schema.prepare(request.content_type, body)
        except BadRequest as e:
            return request.refuse(e.status, str(e), "bad_input")
        self._enqueue((rows, _Reply(self, request)))

    def _prepared(self, request, fut):
        if request.answered:  # its client has gone
            return
        e = fut.exception()
        if e is None:
            self._enqueue((fut.result(), _Reply(self, request)))
        elif isinstance(e, BadRequest):
            request.refuse(e.status, str(e), "bad_input")
        else:
            log.error("parsing a request failed", exc_info=e)
            request.refuse(500, f"the server failed: {type(e).__name__}: {e}", "server")

    # -- the micro-batcher ----------------------------------------------------

    def _enqueue(self, item):
        self._pending.append(item)
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _arrival(self, timeout=None):
        """Until a request is queued (or ``timeout`` seconds pass)."""
        loop = asyncio.get_running_loop()
        self._wake = wake = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _settle, wake)
        try:
            await wake
        finally:
            self._wake = None
            if timer is not None:
                timer.cancel()

    def _open_connections(self):
        """How many HTTP connections are open (each a client that may send a request)."""
        return 0 if self._http is None else len(self._http.connections)

    def _gather(self, items, rows):
        """Move queued requests into ``items`` while they fit in one step;
        the rows gathered, and whether the step is full."""
        pending, limit = self._pending, self.options.max_batch_rows
        while pending:
            n = pending[0][0].rows
            if items and rows + n > limit:
                return rows, True
            items.append(pending.popleft())
            rows += n
        return rows, rows >= limit

    async def _batch_loop(self):
        loop = asyncio.get_running_loop()
        opts = self.options
        while True:
            if not self._pending:
                await self._arrival()
            items = []
            rows, full = self._gather(items, 0)
            deadline = loop.time() + opts.batch_wait
            # Wait a little for the requests of other clients: those still sending
            # their bodies, and those of the other open connections (HTTP/1.1: one
            # request at a time each), whose last answers are being written now.
            clients = self._open_connections()
            while not full and (self._waiting_bodies > 0 or len(items) < clients):
                left = deadline - loop.time()
                if left <= 0:
                    break
                await self._arrival(left)
                rows, full = self._gather(items, rows)
            version, schema = self.serving  # one version for the whole step
            try:
                prob, order, results = await loop.run_in_executor(
                    self._model_thread, _step, version, schema, [p for p, _ in items],
                    self.step_lock)
            except Exception as e:  # answered per request; the loop goes on
                if not isinstance(e, ValueError):
                    log.exception("model step failed")
                for _, fut in items:
                    if not fut.done():
                        fut.set_exception(ValueError(str(e)) if isinstance(e, ValueError)
                                          else e)
                continue
            for i, r in enumerate(results):
                if isinstance(r, BadRequest) and not items[i][1].done():
                    items[i][1].set_exception(r)
            if prob is None:
                continue
            self.metrics.batch_rows.observe(prob.shape[0])
            self.metrics.rows += prob.shape[0]
            a = 0
            for i in order:
                n, fut = results[i], items[i][1]
                if not fut.done():  # its client may have gone
                    fut.set_result((prob[a:a + n], version))
                a += n


def _settle(fut):
    if not fut.done():
        fut.set_result(None)
