"""The HTTP/1.1 layer of `pyfleet serve` (pyfleet.serving.http) over real sockets on
127.0.0.1: pipelined requests answered in their order however late each handler
answers, keep-alive and Connection: close, HTTP/1.0, chunked bodies, Expect:
100-continue, HEAD, and each refusal of the input (malformed HTTP 400, oversized
head 431, oversized body 413 by Content-Length and by chunks, 404, 405 with Allow,
a stalled request 408) as one line, the connection closed where it must be."""

import asyncio
import socket
import threading

import pytest

pytest.importorskip("httptools")

from pyfleet.serving.http import HEAD_LIMIT, HTTPServer, Route  # noqa: E402

pytestmark = pytest.mark.timeout(60)


class Served:
    """An HTTPServer on its own event loop in a thread: ``POST /later`` answers
    (its body reversed) only when the test releases it; ``POST /now`` echoes at once."""

    def __init__(self, **options):
        self.loop = asyncio.new_event_loop()
        self.held = []  # requests of /later not answered yet
        self.done, self.aborted = [], []
        routes = {"/now": {"POST": Route(lambda r: r.respond(200, r.body))},
                  "/later": {"POST": Route(self.held.append)},
                  "/ping": {"GET": Route(lambda r: r.respond(200, b"pong"))}}
        opts = {"max_body_bytes": 1000, "read_timeout": 30.0, **options}
        self.server = HTTPServer(routes, on_done=lambda r, s, k: self.done.append((s, k)),
                                 on_abort=self.aborted.append, log=None, **opts)
        started = threading.Event()

        def run():
            asyncio.set_event_loop(self.loop)
            self.port = self.loop.run_until_complete(self.server.start("127.0.0.1", 0))
            started.set()
            self.loop.run_forever()
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(30)

    def release(self, i):
        """Answer the i-th held request (on the loop's thread)."""
        ev = threading.Event()

        def answer():
            r = self.held[i]
            r.respond(200, r.body[::-1])
            ev.set()
        self.loop.call_soon_threadsafe(answer)
        assert ev.wait(10)

    def held_count(self):
        return len(self.held)

    def close(self):
        asyncio.run_coroutine_threadsafe(self.server.stop(1.0), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


@pytest.fixture
def served():
    s = Served()
    yield s
    s.close()


def _connect(port):
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    return sock


def _read_answers(sock, n):
    """``n`` answers ``(status, headers dict, body)`` read off ``sock``."""
    buf, out = b"", []
    while len(out) < n:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, f"closed after {len(out)} answers"
            buf += chunk
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        if status == 100:
            continue
        length = int(headers["content-length"])
        while len(buf) < length:
            buf += sock.recv(65536)
        out.append((status, headers, buf[:length]))
        buf = buf[length:]
    return out


def _closed(sock):
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _post(path, body, extra=b""):
    return (b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n%s\r\n" % (
        path.encode(), len(body), extra)) + body


def _wait(predicate):
    for _ in range(2000):
        if predicate():
            return
        threading.Event().wait(0.005)
    raise AssertionError("never happened")


def test_pipelined_requests_are_answered_in_their_order_whenever_each_is_ready(served):
    with _connect(served.port) as sock:
        sock.sendall(_post("/later", b"abc") + _post("/now", b"xyz") + _post("/later", b"123")
                     + b"GET /ping HTTP/1.1\r\nHost: t\r\n\r\n")
        _wait(lambda: served.held_count() == 2)
        served.release(1)  # the third request is ready first: nothing may be written yet
        sock.settimeout(0.3)
        with pytest.raises(socket.timeout):
            sock.recv(1)
        sock.settimeout(20)
        served.release(0)
        answers = _read_answers(sock, 4)
    assert [(s, b) for s, _, b in answers] == [(200, b"cba"), (200, b"xyz"), (200, b"321"),
                                               (200, b"pong")]
    assert all("date" in h for _, h, _ in answers)


def test_connection_close_and_http_1_0_close_after_their_answer(served):
    with _connect(served.port) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        (status, headers, body), = _read_answers(sock, 1)
        assert status == 200 and headers["connection"] == "close" and _closed(sock)
    with _connect(served.port) as sock:
        sock.sendall(b"GET /ping HTTP/1.0\r\n\r\n")
        assert _read_answers(sock, 1)[0][2] == b"pong" and _closed(sock)
    with _connect(served.port) as sock:  # keep-alive: two in turn on one connection
        for _ in range(2):
            sock.sendall(b"GET /ping HTTP/1.1\r\nHost: t\r\n\r\n")
            assert _read_answers(sock, 1)[0][2] == b"pong"


def test_chunked_bodies_expect_100_continue_and_head(served):
    with _connect(served.port) as sock:
        sock.sendall(b"POST /now HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n")
        assert _read_answers(sock, 1)[0][2] == b"abcdefg"
        sock.sendall(b"POST /now HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
                     b"Expect: 100-continue\r\n\r\n")
        sock.settimeout(20)
        assert sock.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"  # before the body is sent
        sock.sendall(b"hello")
        assert _read_answers(sock, 1)[0][2] == b"hello"
        sock.sendall(b"HEAD /ping HTTP/1.1\r\nHost: t\r\n\r\nGET /ping HTTP/1.1\r\nHost: t\r\n\r\n")
        buf = b""
        while buf.count(b"\r\n\r\n") < 2 or not buf.endswith(b"pong"):
            buf += sock.recv(4096)
    head, rest = buf.split(b"\r\n\r\n", 1)
    assert b"Content-Length: 4" in head and rest.startswith(b"HTTP/1.1 200")  # HEAD: no body


def _refusal(port, data):
    with _connect(port) as sock:
        sock.sendall(data)
        (status, headers, body), = _read_answers(sock, 1)
        return status, headers, body.decode(), _closed(sock)


def test_each_refusal_of_the_input_is_one_line_and_closes_where_it_must(served):
    status, _, text, closed = _refusal(served.port, b"HELLO\r\n\r\n")
    assert status == 400 and text.startswith("malformed HTTP request") and closed
    status, _, text, closed = _refusal(
        served.port, b"GET /ping HTTP/1.1\r\nX: " + b"a" * HEAD_LIMIT + b"\r\n\r\n")
    assert status == 431 and f"{HEAD_LIMIT:,} bytes" in text and closed
    status, _, text, closed = _refusal(served.port, _post("/now", b"a" * 1001))
    assert status == 413 and "the body is 1,001 bytes, more than --max-body-bytes 1,000" \
        in text and closed
    status, _, text, closed = _refusal(
        served.port, b"POST /now HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"200\r\n" + b"a" * 512 + b"\r\n" + b"200\r\n" + b"a" * 512 + b"\r\n0\r\n\r\n")
    assert status == 413 and "more than --max-body-bytes 1,000" in text and closed
    with _connect(served.port) as sock:  # 404 and 405 keep the connection
        sock.sendall(b"GET /nope HTTP/1.1\r\nHost: t\r\n\r\n"
                     b"DELETE /ping HTTP/1.1\r\nHost: t\r\n\r\nGET /ping HTTP/1.1\r\n\r\n")
        (s404, _, b404), (s405, h405, b405), (s200, _, b200) = _read_answers(sock, 3)
    assert s404 == 404 and b404.decode() == "no such path '/nope'; served: /later, /now, " \
                                            "/ping\n"
    assert s405 == 405 and h405["allow"] == "GET, HEAD" and b405.count(b"\n") == 1
    assert (s200, b200) == (200, b"pong")
    for text in (b404, b405):
        assert text.endswith(b"\n") and text.count(b"\n") == 1
    kinds = [k for s, k in served.done if s >= 400]
    assert kinds == ["bad_http", "bad_http", "too_large", "too_large", "not_found", "method"]


def test_a_stalled_request_is_408_and_a_dropped_one_is_reported_as_aborted():
    served = Served(read_timeout=0.4)
    try:
        with _connect(served.port) as sock:
            sock.sendall(b"POST /now HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc")
            (status, _, body), = _read_answers(sock, 1)
            assert status == 408 and b"--read-timeout 0.4 s" in body and _closed(sock)
        with _connect(served.port) as sock:
            sock.sendall(_post("/later", b"abc"))
            _wait(lambda: served.held_count() == 1)
        _wait(lambda: len(served.aborted) == 1)  # its client went before the answer
        assert served.aborted[0] is served.held[0] and served.aborted[0].answered
    finally:
        served.close()


def test_a_client_that_does_not_read_its_answers_stops_being_read(served):
    # 1,000,000 pipelined requests (24 MB; their answers 110 MB) never read: the
    # server stops reading once its write buffer is full, not buffering them all.
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", served.port))
    sent = []

    def send():
        sock.settimeout(5)
        try:
            sock.sendall(b"GET /ping HTTP/1.1\r\nHost: t\r\n\r\n" * 1_000_000)
            sent.append("all")
        except OSError:  # (socket.timeout) the server stopped reading
            sent.append("blocked")
    t = threading.Thread(target=send)
    t.start()
    t.join(30)

    def buffered():
        out = asyncio.run_coroutine_threadsafe(_write_buffers(served.server), served.loop)
        return out.result(10)
    try:
        assert sent == ["blocked"]
        assert max(buffered()) < 4 << 20  # one read's answers past the high-water mark
    finally:
        sock.close()


async def _write_buffers(server):
    return [c.transport.get_write_buffer_size() for c in server.connections]
