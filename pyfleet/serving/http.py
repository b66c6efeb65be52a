"""HTTP/1.1 for ``pyfleet serve``: an asyncio Protocol around httptools' parser.

httptools is the HTTP parser of uvicorn (llhttp, Node.js's parser, in C): a
request costs a handful of Python calls here instead of the tasks, streams and
objects of a framework, which at one row a request cost more than the model's
step does. The server keeps what such a framework gave ``pyfleet serve``:

- keep-alive connections, pipelined requests answered in order, ``Connection:
  close`` and HTTP/1.0 honoured, chunked request bodies, ``Expect: 100-continue``;
- a body limit (413 from ``Content-Length`` before the body is read, or once a
  chunked body passes it), a head limit (431), malformed HTTP (400), unknown
  paths (404) and methods (405, with ``Allow``);
- a request whose body does not arrive within ``read_timeout`` seconds gets 408
  and its connection is closed; an idle keep-alive connection is closed after
  ``keepalive_timeout`` seconds (one sweep over the connections, no timer a
  request).

A route is ``(method, path) -> Route(handler, check)``: ``check(request)`` runs
once the head is read (a refusal there answers before the body is read: a
``(status, text, kind)`` triple), ``handler(request)`` once the body is whole.
Either answers with ``request.respond(...)``, now or later (from the event loop's
thread); ``on_done(request, status, kind)`` sees every answer and
``on_abort(request)`` every request whose connection went before its answer.
"""

import asyncio
import collections
import http
import socket
import time
from email.utils import formatdate

import httptools

__all__ = ["HEAD_LIMIT", "HTTPServer", "Request", "Route"]

HEAD_LIMIT = 64 << 10  # bytes of a request's line and headers (more: 431)
TEXT = b"text/plain; charset=utf-8"
_CONTENT_TYPES = {}  # Content-Type header bytes -> media type str (bounded)


def _status_line(status):
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


def _date_header():
    return b"Date: " + formatdate(time.time(), usegmt=True).encode() + b"\r\n"


class Route:
    """``handler(request)`` once the body is whole; ``check(request)`` (or None) once
    the head is read: None, or the refusal ``(status, text, kind)``."""

    __slots__ = ("check", "handler")

    def __init__(self, handler, check=None):
        self.handler, self.check = handler, check


class _Bound:
    """A route as a (URL, method) found it: what a request of them gets."""

    __slots__ = ("check", "handler", "head_only", "method", "path")

    def __init__(self, route, method, path, head_only):
        self.check, self.handler = route.check, route.handler
        self.method, self.path, self.head_only = method, path, head_only


class Request:
    """One request: ``method`` and ``path`` (str, the path without its query),
    ``headers`` (lower-case bytes names to bytes values), ``body`` (bytes once
    whole), ``t0`` (``time.perf_counter()`` at its first byte), ``state``: the
    route's own use."""

    __slots__ = ("_parts", "_size", "_slot", "answered", "body", "conn", "head_only", "headers",
                 "in_order", "keep_alive", "method", "path", "route", "state", "t0")

    def __init__(self, conn, t0):
        self.conn, self.t0 = conn, t0
        self.method = self.path = self.route = self.state = self._slot = None
        self.headers, self._parts, self._size = {}, [], 0
        self.body = b""
        self.answered = self.head_only = self.in_order = False
        self.keep_alive = True

    @property
    def content_type(self):
        """The media type of ``Content-Type`` (lower case, without parameters)."""
        v = self.headers.get(b"content-type", b"")
        t = _CONTENT_TYPES.get(v)
        if t is None:
            t = v.split(b";", 1)[0].strip().lower().decode("latin-1")
            if len(_CONTENT_TYPES) < 256:
                _CONTENT_TYPES[v] = t
        return t

    def respond(self, status, body=b"", content_type=TEXT, headers=b"", kind=None,
                close=False):
        """Answer (once): ``body`` bytes, ``headers`` pre-formatted header lines
        (bytes ending in CRLF); ``kind`` names a refusal for the counters."""
        if not self.answered:
            self.answered = True
            self.conn.answer(self, status, body, content_type, headers, kind, close)

    def refuse(self, status, text, kind, close=False):
        """A 4xx/5xx answer of one line of text naming the problem."""
        self.respond(status, text.replace("\n", " ").encode() + b"\n", TEXT, b"", kind, close)


class _Conn(asyncio.Protocol):
    __slots__ = ("active", "closing", "deadline", "first", "halted", "idle_since", "order",
                 "parser",
                 "req", "server", "transport", "url")

    def __init__(self, server, first=b""):
        self.server = server
        self.first = first  # bytes read before this protocol took the connection
        self.transport = None
        self.req = None  # the request being received
        self.order = collections.deque()  # requests received, not yet written: in order
        self.closing = False
        self.halted = False  # its input refused: nothing more is read
        self.deadline = None  # read deadline of the request being received
        self.active, self.idle_since = True, None  # for the sweep: input since it looked

    # -- asyncio.Protocol -----------------------------------------------------

    def connection_made(self, transport):
        self.transport = transport
        self.parser = httptools.HttpRequestParser(self)
        self.server.connections.add(self)
        if self.first:
            first, self.first = self.first, b""
            self.data_received(first)

    def connection_lost(self, exc):
        self.closing = True
        self.server.connections.discard(self)
        abort = self.server.on_abort
        req = self.req
        if req is not None and not req.in_order and not req.answered:
            req.answered = True
            abort(req)
        for r in self.order:
            if not r.answered:
                r.answered = True
                abort(r)
        self.order.clear()
        self.req = None

    def pause_writing(self):
        """The client reads its answers slower than it sends requests: stop reading
        until they drain, so a connection holds no more than the transport's limit."""
        self.transport.pause_reading()

    def resume_writing(self):
        if not (self.closing or self.halted):
            self.transport.resume_reading()

    def data_received(self, data):
        if self.closing:
            return
        self.active = True
        before = self.req
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fatal(400, "protocol upgrades are not served", "bad_http")
        except httptools.HttpParserError as e:
            if not self.closing:
                self._fatal(400, f"malformed HTTP request ({e})", "bad_http")
            return
        req = self.req
        if req is not None and not self.closing:  # part of a request is here
            if req.method is None and req is before:  # a head longer than this whole read
                req._size += len(data)
                if req._size > HEAD_LIMIT:
                    return self._fatal(431, f"the request line and headers pass "
                                            f"{HEAD_LIMIT:,} bytes", "bad_http")
            if self.deadline is None:  # the rest must follow within the read timeout
                self.deadline = self.server.loop.time() + self.server.read_timeout

    # -- httptools' callbacks -------------------------------------------------

    def on_message_begin(self):
        self.req = Request(self, time.perf_counter())
        self.url = b""

    def on_url(self, url):
        self.url += url

    def on_header(self, name, value):
        req = self.req
        req._size += len(name) + len(value)
        h = req.headers
        name = name.lower()
        h[name] = value if name not in h else h[name] + b", " + value

    def on_headers_complete(self):
        req, p, server = self.req, self.parser, self.server
        req.keep_alive = p.should_keep_alive()
        req.in_order = True
        self.order.append(req)
        if req._size + len(self.url) > HEAD_LIMIT:  # (a head that came in one read)
            self.halted = True
            self.transport.pause_reading()
            return req.refuse(431, f"the request line and headers pass {HEAD_LIMIT:,} bytes",
                              "bad_http", close=True)
        req._size = 0
        key = (self.url, p.get_method())
        route = server.dispatch.get(key)
        if route is None:
            route = server.resolve(req, *key)
            if route is None:
                return  # refused: 404 or 405
        else:
            req.method, req.path, req.head_only = route.method, route.path, route.head_only
        req.route = route
        headers = req.headers
        length = headers.get(b"content-length")
        if length is not None and len(length) >= server.length_digits and \
                int(length) > server.max_body_bytes:
            return req.refuse(413, f"the body is {int(length):,} bytes, more than "
                                   f"--max-body-bytes {server.max_body_bytes:,}", "too_large",
                              close=True)
        if route.check is not None:
            refusal = route.check(req)
            if refusal is not None:
                return req.refuse(*refusal)
        expect = headers.get(b"expect")
        if expect is not None and expect.lower() == b"100-continue":
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body):
        req = self.req
        if req.answered:
            return  # refused on its head: the rest is read and dropped
        req._size += len(body)
        if req._size > self.server.max_body_bytes:
            req._parts = []
            return req.refuse(413, f"the body is more than --max-body-bytes "
                                   f"{self.server.max_body_bytes:,}", "too_large", close=True)
        req._parts.append(body)

    def on_message_complete(self):
        req, self.req, self.deadline = self.req, None, None
        if req.answered:
            if not req.keep_alive and req._slot == b"":  # its refusal is written: close
                self._close_when_written()
            return  # (not written yet: closed when it is)
        parts = req._parts
        req.body = parts[0] if len(parts) == 1 else b"".join(parts)
        req._parts = None
        try:
            req.route.handler(req)
        except Exception as e:  # a bug of the handler: answered, logged, serving goes on
            self.server.log.exception("request handler failed")
            req.refuse(500, f"the server failed: {type(e).__name__}: {e}", "server")

    # -- answers --------------------------------------------------------------

    def answer(self, req, status, body, content_type, headers, kind, close):
        server = self.server
        server.on_done(req, status, kind)
        if self.closing:
            return
        key = (status, content_type, headers)
        head = server.heads.get(key)
        if head is None:
            head = server.head(key)
        if close or not req.keep_alive:
            req.keep_alive = False
            head += b"%d\r\nConnection: close\r\n\r\n" % len(body)
        else:
            head += b"%d\r\n\r\n" % len(body)
        slot = head if req.head_only else head + body
        order = self.order
        if not req.in_order:  # the connection's input was refused before its head ended
            req.in_order = True
            order.append(req)
        if order[0] is not req:
            req._slot = slot  # written after the requests before it on this connection
            return
        order.popleft()
        req._slot = b""
        write = self.transport.write
        write(slot)
        while req.keep_alive and order and order[0]._slot is not None:
            req = order.popleft()
            write(req._slot)
            req._slot = b""
        if not req.keep_alive and req is not self.req:
            self._close_when_written()  # (its body still coming: closed once it is read)

    def _close_when_written(self):
        if not self.closing:
            self.closing = True
            self.transport.close()  # after the buffered answers are written

    def _fatal(self, status, text, kind):
        """A refusal of the connection's input: no more is read; answered after the
        answers before it, then the connection closes."""
        self.halted = True
        self.transport.pause_reading()
        req = self.req
        if req is None or req.answered:
            req = Request(self, time.perf_counter())
        self.req = self.deadline = None
        req.refuse(status, text, kind, close=True)

    def sweep(self, now):
        """408 for a request overdue; an idle keep-alive connection closed."""
        if self.closing:
            return
        if self.deadline is not None and now >= self.deadline:
            what = "body" if self.req is not None and self.req.method is not None else "request"
            self._fatal(408, f"the {what} did not arrive within --read-timeout "
                             f"{self.server.read_timeout:g} s", "timeout")
        elif self.active or self.req is not None or self.order:
            self.active, self.idle_since = False, now
        elif now - self.idle_since >= self.server.keepalive_timeout:
            self._close_when_written()


class HTTPServer:
    """Listens and answers by ``routes`` (``{path: {method: Route}}``)."""

    def __init__(self, routes, *, max_body_bytes, read_timeout, on_done, on_abort, log,
                 keepalive_timeout=75.0):
        self.routes = routes
        self.by_url = {path.encode(): (path, methods) for path, methods in routes.items()}
        self.max_body_bytes, self.read_timeout = max_body_bytes, read_timeout
        self.keepalive_timeout = keepalive_timeout
        self.on_done, self.on_abort, self.log = on_done, on_abort, log
        self.connections = set()
        self.heads = {}  # (status, content type, headers) -> an answer's head (this second)
        self.dispatch = {}  # (URL, method) bytes -> _Bound, for the URLs served as they are
        self.length_digits = len(str(max_body_bytes))  # a Content-Length shorter is within
        self._date = _date_header()
        self.loop = self._server = self._sweeper = None

    def resolve(self, req, url, raw_method):
        """The route of ``url`` and ``raw_method`` (remembered when found), or None
        once ``req`` is refused: 404 (no such path) or 405 (a method not served)."""
        method = raw_method.decode("latin-1")
        found = self.by_url.get(url)
        exact = found is not None
        if found is None:
            found = self.by_url.get(url.split(b"?", 1)[0])
        req.method = method
        if found is None:
            req.path = url.split(b"?", 1)[0].decode("latin-1", "replace")
            req.refuse(404, f"no such path {req.path!r}; served: "
                            f"{', '.join(sorted(self.routes))}", "not_found")
            return None
        req.path, routes = found
        route, head_only = routes.get(method), False
        if route is None and method == "HEAD" and "GET" in routes:
            route, head_only = routes["GET"], True
        if route is None:
            allow = ", ".join(sorted(routes) + (["HEAD"] if "GET" in routes else []))
            req.respond(405, f"{method} is not served on {req.path}; use {allow}\n".encode(),
                        TEXT, f"Allow: {allow}\r\n".encode(), "method")
            return None
        req.head_only = head_only
        bound = _Bound(route, method, req.path, head_only)
        if exact:  # (URLs with a query are many: not remembered)
            self.dispatch[(url, raw_method)] = bound
        return bound

    def head(self, key):
        """An answer's head up to its Content-Length value (Date: this second)."""
        status, content_type, headers = key
        self.heads[key] = head = (_status_line(status) + self._date + b"Content-Type: "
                                  + content_type + b"\r\n" + headers + b"Content-Length: ")
        return head

    async def start(self, host, port, reuse_port=False):
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(
            lambda: _Conn(self), host, port, reuse_address=True, reuse_port=reuse_port,
            backlog=1024)
        self._sweeper = self.loop.create_task(self._sweep())
        return self._server.sockets[0].getsockname()[1]

    def serve_handed_over(self):
        """Answer connections another front end hands over (:meth:`adopt`) instead
        of listening."""
        self.loop = asyncio.get_running_loop()
        self._sweeper = self.loop.create_task(self._sweep())

    def adopt(self, fd, data):
        """Take over the connected socket ``fd``, ``data`` being what was read from
        it (the start of its next request). On the event loop."""
        sock = socket.socket(fileno=fd)
        self.loop.create_task(self._adopt(sock, data))

    async def _adopt(self, sock, data):
        try:
            await self.loop.connect_accepted_socket(lambda: _Conn(self, data), sock)
        except OSError:
            sock.close()

    async def _sweep(self):
        """Four times a second (or a quarter of the read timeout): the Date of the
        answers, overdue requests and idle connections."""
        interval = min(0.25, self.read_timeout / 4)
        while True:
            await asyncio.sleep(interval)
            date = _date_header()
            if date != self._date:
                self._date, self.heads = date, {}
            now = self.loop.time()
            for conn in list(self.connections):
                conn.sweep(now)

    async def stop(self, answer_within=10.0):
        """Stop listening, let the requests received be answered (up to
        ``answer_within`` seconds), then close every connection."""
        if self.loop is None:
            return
        if self._server is not None:
            self._server.close()
        deadline = self.loop.time() + answer_within
        while self.loop.time() < deadline and any(
                any(not r.answered for r in c.order) for c in self.connections):
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            conn.closing = True
            conn.transport.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            await self._server.wait_closed()
        self._server = self.loop = None
