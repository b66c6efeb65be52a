"""`pyfleet serve`'s native front end (the default) against the Python one, through
real keep-alive HTTP clients on 127.0.0.1: the same answers byte for byte, requests
of every kind on one connection (pipelined too) answered in order, many
connections gathered into shared model steps, bad rows named in a step of good
ones, a request split across reads, Connection: close honoured."""

import http.client
import json
import random
import socket
import threading
import time

import pytest
from support import DATA
from support.cli import save_small_model
from support.serving import ServeProcess, criteo_json_rows

pytest.importorskip("httptools")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TSV = DATA / "criteo-paddlerec-part0" / "part-0.tsv"
CSV = DATA / "criteo-kaggle-tiny" / "train.tiny.csv"
if not (TSV.exists() and CSV.exists()):
    pytest.skip("shared Criteo samples missing", allow_module_level=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_small_model(tmp_path_factory.mktemp("native") / "m", CSV, format="csv",
                            batch_size=200, passes=1)


@pytest.fixture(scope="module")
def lines():
    """Criteo TSV lines without their label (39 fields)."""
    with open(TSV, "rb") as f:
        return [line.split(b"\t", 1)[1] for line in f.read().splitlines()[:200]]


def metrics(url):
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def keepalive(server):
    return http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)


def post(conn, body, content_type="text/tab-separated-values", headers=None):
    conn.request("POST", "/predict", body=body,
                 headers={"Content-Type": content_type, **(headers or {})})
    r = conn.getresponse()
    return r.status, r.getheader("X-Model-Version"), r.read()


def test_native_answers_equal_the_python_front_s_byte_for_byte(model, lines, tmp_path):
    bodies = [(line + b"\n", "text/tab-separated-values") for line in lines[:40]]
    bodies += [(b"\n".join(lines[40:45]), "text/tab-separated-values")]  # 5 rows, no last LF
    bodies += [(json.dumps({"rows": criteo_json_rows(["0\t" + line.decode()])}).encode(),
                "application/json") for line in lines[45:60]]
    answers = {}
    for front in ("python", "native"):
        with ServeProcess("--model", model, "--front", front, cwd=tmp_path) as s:
            conn = keepalive(s)
            answers[front] = [post(conn, b, t) for b, t in bodies]
            conn.close()
            if front == "native":  # the TSV requests were answered by the front end
                m = metrics(s.url)
                assert m['pyfleet_serve_requests_total{code="200"}'] >= len(bodies)
                assert m["pyfleet_serve_rows_total"] == 40 + 5 + 15
    for (st_p, v_p, b_p), (st_n, v_n, b_n) in zip(answers["python"], answers["native"]):
        assert (st_n, v_n) == (st_p, v_p) == (200, v_p)
        assert b_n == b_p
    assert len(json.loads(answers["native"][40][2])["predictions"]) == 5


def test_one_connection_carries_every_kind_of_request_in_order(model, lines, tmp_path):
    """Pipelined: predictions, then a GET the Python server answers (the connection
    is handed over), then a prediction again, written in one send."""
    with ServeProcess("--model", model, cwd=tmp_path) as s:
        one = lines[0] + b"\n"
        req = (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: text/tab-separated-values"
               b"\r\nContent-Length: %d\r\n\r\n" % len(one)) + one
        with socket.create_connection(("127.0.0.1", s.port), timeout=30) as sock:
            sock.sendall(req + req + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + req)
            got = b""
            deadline = time.monotonic() + 30
            while got.count(b"HTTP/1.1 ") < 4 or not got.endswith(b"}"):
                assert time.monotonic() < deadline, got
                chunk = sock.recv(65536)
                assert chunk, got
                got += chunk
        answers = got.split(b"HTTP/1.1 ")[1:]
        assert [a[:3] for a in answers] == [b"200"] * 4
        p = [json.loads(answers[i].split(b"\r\n\r\n")[1])["predictions"] for i in (0, 1, 3)]
        assert p[0] == pytest.approx(p[1], rel=1e-5) and p[0] == pytest.approx(p[2], rel=1e-5)
        assert b'"status": "ready"' in answers[2]


def test_many_connections_share_model_steps(model, lines, tmp_path):
    clients, each = 24, 15
    with ServeProcess("--model", model, "--batch-wait-ms", "5", cwd=tmp_path) as s:
        failures, probs = [], {}
        start = threading.Barrier(clients)

        def client(k):
            conn = keepalive(s)
            start.wait(30)
            for j in range(each):
                line = lines[(k * each + j) % len(lines)]
                status, _, body = post(conn, line + b"\n")
                if status != 200:
                    failures.append((status, body))
                else:
                    probs.setdefault(line, []).append(json.loads(body)["predictions"][0])
            conn.close()
        threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not failures
        for v in probs.values():  # a row's answer whatever its step
            assert v == pytest.approx([v[0]] * len(v), rel=1e-5)
        m = metrics(s.url)
        steps = m["pyfleet_serve_batch_rows_count"]
        assert m["pyfleet_serve_batch_rows_sum"] == clients * each
        assert steps < clients * each / 2, steps  # gathered, not one step a request
        assert m['pyfleet_serve_requests_total{code="200"}'] >= clients * each
        assert m["pyfleet_serve_request_duration_seconds_count"] >= clients * each


def test_a_bad_row_is_named_and_its_step_s_other_rows_are_answered(model, lines, tmp_path):
    with ServeProcess("--model", model, "--batch-wait-ms", "50", cwd=tmp_path) as s:
        good, results = lines[0] + b"\n", {}
        bad = {"fields": b"1\t2\t3\n", "dense": b"x" + lines[1] + b"\n",
               "blank": b"\n\n"}

        def send(name, body):
            conn = keepalive(s)
            results[name] = post(conn, body)
            conn.close()
        threads = [threading.Thread(target=send, args=(f"good{k}", good)) for k in range(4)]
        threads += [threading.Thread(target=send, args=kv) for kv in bad.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert [results[f"good{k}"][0] for k in range(4)] == [200] * 4
        p = [json.loads(results[f"good{k}"][2])["predictions"][0] for k in range(4)]
        assert p == pytest.approx([p[0]] * 4, rel=1e-5)
        for name in bad:
            status, _, body = results[name]
            assert status == 400, (name, body)
            assert body.endswith(b"\n") and body.count(b"\n") == 1
        assert b"tab-separated fields" in results["fields"][2]
        assert b"line 1: malformed" in results["dense"][2]
        assert b"line 3 has 1 tab-separated fields" in results["blank"][2]
        conn = keepalive(s)  # and it keeps serving
        assert post(conn, good)[0] == 200
        conn.close()


def test_a_request_split_across_reads_and_connection_close(model, lines, tmp_path):
    with ServeProcess("--model", model, cwd=tmp_path) as s:
        one = lines[2] + b"\n"
        head = (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: text/tab-separated-values"
                b"\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(one))
        with socket.create_connection(("127.0.0.1", s.port), timeout=30) as sock:
            sock.sendall(head[:20])
            time.sleep(0.05)  # the rest in later reads
            sock.sendall(head[20:] + one[:10])
            time.sleep(0.05)
            sock.sendall(one[10:])
            got = b""
            while True:  # the server closes it after the answer
                chunk = sock.recv(65536)
                if not chunk:
                    break
                got += chunk
        assert got.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"Connection: close\r\n" in got
        assert json.loads(got.split(b"\r\n\r\n", 1)[1])["predictions"][0] > 0


def test_a_host_name_is_served_on_each_of_its_addresses_on_one_port(model, lines, tmp_path):
    addrs = {a[4][0] for a in socket.getaddrinfo("localhost", 0, type=socket.SOCK_STREAM)}
    with ServeProcess("--model", model, "--host", "localhost", cwd=tmp_path) as s:
        for addr in addrs:  # 127.0.0.1, and ::1 where localhost names it
            conn = http.client.HTTPConnection(addr, s.port, timeout=30)
            status, _, body = post(conn, lines[3] + b"\n")
            conn.close()
            assert status == 200 and b'"predictions"' in body


def test_clients_that_vanish_stall_or_send_garbage_hold_no_slot_after(model, lines, tmp_path):
    """Mixed traffic, many clients closing mid-request or without reading; after it
    every slot is free again (--max-concurrent's count back to 0) and it serves."""
    one = lines[4] + b"\n"

    def req(body, ctype=b"text/tab-separated-values", extra=b""):
        return (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: " + ctype + b"\r\n" + extra
                + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    kinds = [req(one), req(one) * 3, req(b"bad\n"), b"GET /healthz HTTP/1.1\r\n\r\n",
             req(b'{"rows": [{"I1": 1, "C1": "ab"}]}', b"application/json"),
             req(one, extra=b"Connection: close\r\n"), b"GARBAGE\r\n\r\n", req(one)[:30],
             req(one)[:-5], req(one, b"text/csv")]
    with ServeProcess("--model", model, "--max-concurrent", "8", "--read-timeout", "1",
                      cwd=tmp_path) as s:
        stop, answers = time.monotonic() + 4, []

        def client(k):
            rnd = random.Random(k)
            while time.monotonic() < stop:
                with socket.create_connection(("127.0.0.1", s.port), timeout=5) as sock:
                    for _ in range(rnd.randint(1, 6)):
                        try:   # the server may have closed it (garbage, Connection: close)
                            sock.sendall(rnd.choice(kinds))
                        except OSError:
                            break
                        if rnd.random() < 0.2:
                            break  # gone without reading
                        try:
                            got = sock.recv(65536)
                        except OSError:
                            break
                        if not got:
                            break
                        answers.append(got[:12])
        threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert answers and all(a.startswith(b"HTTP/1.1 ") for a in answers)
        s.wait_for(lambda: metrics(s.url)["pyfleet_serve_in_flight_requests"] == 0, 30,
                   "every slot freed")
        conn = keepalive(s)
        assert post(conn, one)[0] == 200
        conn.close()
        assert s.proc.poll() is None


def test_a_stalled_tsv_body_is_408_from_the_front_end_and_frees_its_slot(model, lines, tmp_path):
    with ServeProcess("--model", model, "--read-timeout", "1", "--max-concurrent", "1",
                      cwd=tmp_path) as s:
        with socket.create_connection(("127.0.0.1", s.port), timeout=30) as sock:
            sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         b"text/tab-separated-values\r\nContent-Length: 1000\r\n\r\n1\t2")
            s.wait_for(lambda: metrics(s.url)["pyfleet_serve_in_flight_requests"] == 1, 30,
                       "the stalled request's slot")
            conn = keepalive(s)  # the one slot is held: 429 (by the Python server)
            status, _, body = post(conn, lines[5] + b"\n")
            conn.close()
            assert status == 429 and b"--max-concurrent 1" in body
            reply = sock.recv(4096)
            assert reply.startswith(b"HTTP/1.1 408") and b"Connection: close" in reply
            assert reply.endswith(b"the body did not arrive within --read-timeout 1 s\n")
            assert sock.recv(4096) == b""  # closed
        s.wait_for(lambda: metrics(s.url)["pyfleet_serve_in_flight_requests"] == 0, 30,
                   "the slot freed")
        conn = keepalive(s)
        assert post(conn, lines[5] + b"\n")[0] == 200
        conn.close()
        m = metrics(s.url)
        assert m['pyfleet_serve_requests_total{code="408"}'] == 1
        assert m['pyfleet_serve_errors_total{kind="timeout"}'] == 1
