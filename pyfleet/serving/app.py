"""The HTTP server of ``pyfleet serve`` (aiohttp, one asyncio event loop).

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

A refused request gets a 4xx status and one line of text naming the problem;
the server keeps serving.
"""

import asyncio
import collections
import io
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from aiohttp import web

from pyfleet.serving.metrics import ServeMetrics
from pyfleet.serving.rows import BadRequest, RowSchema

__all__ = ["ServeOptions", "Server"]

log = logging.getLogger("pyfleet.serve")
_PARSE_IN_THREAD = 64 << 10  # bodies larger than this are parsed off the event loop


class ServeOptions:
    """The limits and batching of a server (``pyfleet serve``'s options)."""

    def __init__(self, max_body_bytes=16 << 20, max_rows=16384, max_concurrent=256,
                 batch_wait=0.001, max_batch_rows=4096, slots=None, read_timeout=30.0):
        for name, v in (("max_body_bytes", max_body_bytes), ("max_rows", max_rows),
                        ("max_concurrent", max_concurrent), ("max_batch_rows", max_batch_rows)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not 0 <= batch_wait <= 1:
            raise ValueError(f"batch_wait must be between 0 and 1 second, got {batch_wait!r}")
        if not read_timeout > 0:
            raise ValueError(f"read_timeout must be > 0 seconds, got {read_timeout!r}")
        self.read_timeout = float(read_timeout)
        self.max_body_bytes, self.max_rows = max_body_bytes, max_rows
        self.max_concurrent, self.max_batch_rows = max_concurrent, max_batch_rows
        self.batch_wait, self.slots = float(batch_wait), slots


def _step(version, schema, pendings):
    """One model step on the model thread: the requests' rows parsed together
    (:meth:`RowSchema.assemble`) and predicted by ``version``."""
    batch, order, results = schema.assemble(pendings)
    return (None if batch is None else version.predict(batch)), order, results


def _error(status, text, kind):
    resp = web.Response(status=status, text=text.replace("\n", " ") + "\n")
    resp["error_kind"] = kind
    return resp


class Server:
    """Serves :class:`pyfleet.serving.model.ModelVersion` objects over HTTP.

    ``swap(version)`` must be called on the event loop (the follower uses
    ``loop.call_soon_threadsafe``). Lifetime: ``await start(host, port)``,
    then ``await stop()``."""

    def __init__(self, options):
        self.options = options
        self.metrics = ServeMetrics()
        self.version = None
        self.schema = None
        self.last_refusal = None
        self._pending = collections.deque()  # (Pending rows, future) of queued requests
        self._wake = None  # the batcher's future while it waits for a request
        self._waiting_bodies = 0  # requests accepted whose rows are not queued yet
        self._model_thread = ThreadPoolExecutor(1, thread_name_prefix="pyfleet-serve-model")
        self._parse_threads = ThreadPoolExecutor(2, thread_name_prefix="pyfleet-serve-parse")
        self._runner = None
        self._batcher = None

    # -- versions -------------------------------------------------------------

    def swap(self, version):
        schema = RowSchema(version.n_dense, version.n_slots, self.options.slots,
                           self.options.max_rows)
        if self.version is not None:
            self.metrics.swaps += 1
            log.info("serving %s (was %s)", version.name, self.version.name)
        else:
            log.info("serving %s", version.name)
        self.version, self.schema = version, schema

    def refused(self, where, error):
        self.metrics.load_failures += 1
        self.last_refusal = f"{where}: {error}"
        log.error("model version refused, %s keeps serving: %s: %s",
                  self.version.name if self.version else "nothing", where, error)

    def current(self):
        """``(directory, digest)`` of the version served, or None."""
        v = self.version
        return None if v is None else (v.dirname, v.digest)

    # -- lifetime -------------------------------------------------------------

    def app(self):
        app = web.Application(client_max_size=self.options.max_body_bytes,
                              middlewares=[self._count])
        app.router.add_post("/predict", self.predict)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/metrics", self.metrics_text)
        app.router.add_get("/model", self.model_info)
        return app

    async def start(self, host, port):
        """Listen on ``host:port`` (0: a free port); returns the port."""
        self._batcher = asyncio.get_running_loop().create_task(self._batch_loop())
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    async def stop(self):
        if self._runner is not None:
            await self._runner.cleanup()
        if self._batcher is not None:
            self._batcher.cancel()
        self._model_thread.shutdown(wait=True)
        self._parse_threads.shutdown(wait=True)

    # -- handlers -------------------------------------------------------------

    @web.middleware
    async def _count(self, request, handler):
        t0 = time.perf_counter()
        try:
            resp = await handler(request)
        except web.HTTPException as e:  # aiohttp's own refusals: 404, 405, 413
            resp = e
            kind = {404: "not_found", 405: "method", 413: "too_large"}.get(e.status)
            if e.status >= 400 and e.text:
                e.text = e.text.splitlines()[0] + "\n"
            self.metrics.request(e.status, time.perf_counter() - t0, kind,
                                 timed=request.path == "/predict")
            raise
        self.metrics.request(resp.status, time.perf_counter() - t0, resp.get("error_kind"),
                             timed=request.path == "/predict")
        return resp

    async def healthz(self, request):
        v = self.version
        if v is None:
            return web.json_response({"status": "loading"}, status=503)
        return web.json_response({"status": "ready", "model_version": v.name})

    async def model_info(self, request):
        v = self.version
        if v is None:
            return _error(503, "no model loaded yet", "loading")
        return web.json_response({**v.info(), "last_refusal": self.last_refusal})

    async def metrics_text(self, request):
        v = self.version
        text = self.metrics.render(v, {} if v is None else v.table_stats())
        return web.Response(text=text, content_type="text/plain",
                            headers={"X-Prometheus-Format": "0.0.4"})

    async def predict(self, request):
        m = self.metrics
        if self.version is None:
            return _error(503, "the model is not loaded yet (GET /healthz says when)", "loading")
        if m.in_flight >= self.options.max_concurrent:
            return _error(429, f"more than --max-concurrent {self.options.max_concurrent} "
                               f"requests at once: retry later", "concurrency")
        length = request.content_length
        if length is not None and length > self.options.max_body_bytes:
            return _error(413, f"the body is {length:,} bytes, more than --max-body-bytes "
                               f"{self.options.max_body_bytes:,}", "too_large")
        m.in_flight += 1
        self._waiting_bodies += 1
        queued = False
        try:
            if request.content.is_eof():  # all received with the head: no wait, no timer
                body = await request.read()
            else:
                try:  # a client that stalls mid-body must not hold its slot for ever
                    body = await asyncio.wait_for(request.read(), self.options.read_timeout)
                except asyncio.TimeoutError:
                    return _error(408, f"the body did not arrive within --read-timeout "
                                       f"{self.options.read_timeout:g} s", "timeout")
            schema = self.schema
            try:
                if len(body) > _PARSE_IN_THREAD:
                    rows = await asyncio.get_running_loop().run_in_executor(
                        self._parse_threads, schema.prepare, request.content_type, body)
                else:
                    rows = schema.prepare(request.content_type, body)
            except BadRequest as e:
                return _error(e.status, str(e), "bad_input")
            fut = asyncio.get_running_loop().create_future()
            self._waiting_bodies -= 1
            queued = True
            self._enqueue((rows, fut))
            try:
                prob, version = await fut
            except BadRequest as e:  # its lines, parsed with the step's
                return _error(e.status, str(e), "bad_input")
            except ValueError as e:  # the model's own refusal of these rows (non-finite)
                return _error(422, str(e), "model")
            except Exception as e:  # logged with its trace by the batcher
                return _error(500, f"the model step failed: {type(e).__name__}: {e}", "model")
        finally:
            m.in_flight -= 1
            if not queued:
                self._waiting_bodies -= 1
        if "application/x-npy" in request.headers.get("Accept", ""):
            buf = io.BytesIO()
            np.save(buf, prob.astype(np.float32), allow_pickle=False)
            return web.Response(body=buf.getvalue(), content_type="application/x-npy",
                                headers={"X-Model-Version": version.name})
        return web.Response(text=json.dumps({"predictions": prob.tolist(),
                                             "model_version": version.name}),
                            content_type="application/json",
                            headers={"X-Model-Version": version.name})

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
        server = getattr(self._runner, "server", None)
        return 0 if server is None else len(server.connections)

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
            version, schema = self.version, self.schema  # one version for the whole step
            try:
                prob, order, results = await loop.run_in_executor(
                    self._model_thread, _step, version, schema, [p for p, _ in items])
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
