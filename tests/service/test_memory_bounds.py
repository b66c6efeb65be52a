"""A server's memory stays bounded whatever a peer sends ("Server memory has no
bound"), checked on a real ``python -m pyfleet.service`` process on 127.0.0.1 by its peak
RSS (``VmHWM``):

- a client that never reads its replies: at most ``--max-queued-replies`` replies and
  ``--max-backlog-bytes`` wait for it, later ones are dropped and counted (``dropped_replies``), and other clients are served;
- a 10M-key pull is refused by ``--max-request-keys`` before any row is made;
- CREATE_TABLES over the wire cannot make a table beyond ``--max-dense-floats``,
  ``--max-sparse-dim`` or ``--max-tables``;
- a message of many frames, each under ``--max-message-bytes``, or messages that never
  end on several connections: the server reads no more of a TCP peer once it holds
  ``--max-message-bytes`` (1 MiB more for framing), and of all together once they hold
  ``--max-buffer-bytes`` (one reads on alone up to ``--max-message-bytes``), checked
  before each read; a peer holding that and sending nothing more is cut, and the
  memory is given back.
"""


import contextlib
import socket
import struct
import threading

import numpy as np
import pytest
import zmq
from support.service import ServerGroup
from support.wait import wait_for_counter, wait_until
from zmq.utils.monitor import recv_monitor_message

from pyfleet.errors import RemoteError
from pyfleet.service import protocol as P
from pyfleet.service.client import Client
from pyfleet.service.inbound import wire_bytes
from pyfleet.service.protocol import Op

pytestmark = pytest.mark.timeout(300)

MIB = 1 << 20
# What a server's RSS may exceed what it counts as held of its peers' bytes by: libzmq's
# and the allocator's own memory, the stats calls of the test.
RSS_SLACK = 16 * MIB
DENSE_FLOATS = 1 << 20           # a 4 MiB reply per PULL_DENSE
SPARSE = {"kind": "sparse", "name": "emb", "dim": 4,
          "optimizer": {"type": "SGD", "learning_rate": 0.1},
          "initializer": {"type": "Constant", "value": 0.0}, "seed": 0}
DENSE = {"kind": "dense", "name": "big", "shape": [DENSE_FLOATS],
         "optimizer": {"type": "SGD", "learning_rate": 0.1}}


def _status(pid):
    """``{field: kB}`` of the VmRSS/VmHWM lines of ``/proc/PID/status``."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    return out


def _counters(c):
    return c.stats()[0]["counters"]


def test_a_client_that_never_reads_its_replies_cannot_grow_the_server():
    sent = 100  # 400 MiB of replies: unbounded, the server's RSS grows by all of them
    with ServerGroup(1, 1) as g, Client(g.endpoints, timeout=30, heartbeat_interval=0) as c:
        c.create_tables([DENSE])
        tid = c._ids[0][f"big[0:{DENSE_FLOATS}]"]
        pid = g.procs[0].pid
        c.pull_dense("big")  # the serving path warmed up once
        before = _status(pid)["VmHWM"]
        sock = zmq.Context.instance().socket(zmq.DEALER)
        # The peer reads nothing: its own queue and kernel buffer stay tiny, so every
        # reply it does not take waits in the server.
        sock.setsockopt(zmq.RCVHWM, 1)
        sock.setsockopt(zmq.RCVBUF, 1 << 16)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect("tcp://" + g.endpoints[0])
        try:
            for i in range(sent):
                sock.send_multipart([bytes(f) for f in P.request(Op.PULL_DENSE, i + 1,
                                                                 table=tid)])
            wait_for_counter(c, "op_pull_dense", sent)
            counters = _counters(c)
            grown = _status(pid)["VmHWM"] - before
            # Other clients are still served, with the right values.
            np.testing.assert_array_equal(c.pull_dense("big"), np.zeros(DENSE_FLOATS))
        finally:
            sock.close(0)
    # The default bound is 16 replies in libzmq's queue and 64 MiB in the server's backlog
    # for the peer (plus what the kernel buffers): about 130 MiB here, not 400.
    assert counters.get("dropped_replies", 0) >= sent - 40, counters
    assert grown < 200 * MIB, f"server peak RSS grew by {grown / MIB:.0f} MiB"


def test_a_ten_million_key_pull_is_refused_before_any_row_is_made():
    with ServerGroup(1, 1) as g, Client(g.endpoints, timeout=60, heartbeat_interval=0) as c:
        c.create_tables([SPARSE])
        pid = g.procs[0].pid
        before = _status(pid)["VmHWM"]
        keys = np.arange(1, 10_000_001, dtype=np.uint64)
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect("tcp://" + g.endpoints[0])
        try:
            sock.send_multipart(P.request(Op.PULL_SPARSE, 7, table=c._ids[0]["emb"],
                                          keys=keys, dim=4), copy=False)
            assert sock.poll(60_000), "no answer to a 10M-key pull"
            reply = sock.recv_multipart()
        finally:
            sock.close(0)
        h = P.unpack_header(reply[0])
        error = P.parse_json(reply[-1]).get("error", "")
        stats = c.stats()[0]
        grown = _status(pid)["VmHWM"] - before
        # a pull of the client's largest request (2^20 keys) is still served
        assert c.pull_sparse("emb", keys[:1 << 20]).shape == (1 << 20, 4)
    assert h.status == P.Status.ERROR
    assert "10000000 keys" in error and "max_request_keys=1048576" in error, error
    assert stats["tables"]["emb"]["rows"] == 0
    # the 80 MB request itself, not 10M rows (gigabytes)
    assert grown < 300 * MIB, f"server peak RSS grew by {grown / MIB:.0f} MiB"


def test_tables_created_over_the_wire_are_capped():
    flags = ["--max-dense-floats", 1 << 20, "--max-sparse-dim", 64, "--max-tables", 3]
    with ServerGroup(1, 1, extra_args=flags) as g, \
            Client(g.endpoints, timeout=30, heartbeat_interval=0) as c:
        before = _status(g.procs[0].pid)["VmHWM"]
        huge = {**DENSE, "name": "huge", "shape": [1 << 26]}  # 67M floats: 2.3 GB with Adam
        with pytest.raises(RemoteError, match=r"max_dense_floats=1048576.*--max-dense-floats"):
            c.create_tables([huge])
        with pytest.raises(RemoteError, match=r"dim 65 .*max_sparse_dim=64"):
            c.create_tables([{**SPARSE, "dim": 65}])
        c.create_tables([DENSE])                      # exactly the dense budget
        with pytest.raises(RemoteError, match="max_dense_floats"):
            c.create_tables([{**DENSE, "name": "one_more", "shape": [1]}])
        c.create_tables([SPARSE, {**SPARSE, "name": "emb2"}])
        with pytest.raises(RemoteError, match=r"max_tables=3"):
            c.create_tables([{**SPARSE, "name": "emb3"}])
        c.create_tables([DENSE, SPARSE])              # the same configs again: a no-op
        tables = c.stats()[0]["tables"]
        grown = _status(g.procs[0].pid)["VmHWM"] - before
    assert sorted(tables) == ["big[0:1048576]", "emb", "emb2"]
    assert grown < 200 * MIB


def test_limits_are_refused_by_name_when_not_positive():
    from pyfleet.service.server import Server
    for name in ("max_queued_replies", "max_backlog_bytes", "max_request_keys", "max_dense_floats",
                 "max_sparse_dim", "max_tables"):
        with pytest.raises(ValueError, match=name):
            Server("127.0.0.1:0", 0, 1, 1, **{name: 0})


def test_slow_readers_together_stay_within_one_server_budget():
    # The attack: several peers ask for large replies and read none. The bounds were per
    # peer (16 queued replies and a 64 MiB backlog each): four peers with 16 MiB replies
    # grew a server by 1.24 GiB. Now one budget (--max-buffer-bytes) holds for all of them.
    peers, sent = 4, 40
    with ServerGroup(1, 1, extra_args=["--max-buffer-bytes", 48 * MIB]) as g, \
            Client(g.endpoints, timeout=30, heartbeat_interval=0) as c:
        c.create_tables([DENSE])
        tid = c._ids[0][f"big[0:{DENSE_FLOATS}]"]
        pid = g.procs[0].pid
        c.pull_dense("big")
        before = _status(pid)["VmHWM"]
        socks = []
        try:
            for _ in range(peers):
                sock = zmq.Context.instance().socket(zmq.DEALER)
                sock.setsockopt(zmq.RCVHWM, 1)
                sock.setsockopt(zmq.RCVBUF, 1 << 16)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect("tcp://" + g.endpoints[0])
                socks.append(sock)
            for i in range(sent):
                for sock in socks:
                    sock.send_multipart([bytes(f) for f in P.request(Op.PULL_DENSE, i + 1,
                                                                     table=tid)])
            wait_for_counter(c, "op_pull_dense", peers * sent)
            counters = _counters(c)
            grown = _status(pid)["VmHWM"] - before
            # a client that reads its replies is still served, large replies included
            np.testing.assert_array_equal(c.pull_dense("big"), np.zeros(DENSE_FLOATS))
        finally:
            for sock in socks:
                sock.close(0)
    # 160 replies of 4 MiB (640 MiB): 48 MiB of budget, one reply a peer beyond it, and
    # what the kernel's socket buffers took; the rest dropped and counted
    assert counters.get("dropped_replies", 0) >= peers * sent - 30, counters
    assert grown < 120 * MIB, f"server peak RSS grew by {grown / MIB:.0f} MiB"


def _wait_event(monitor, event, timeout=60):
    """Wait for the socket event ``event`` on ``monitor`` (a zmq monitor socket)."""
    def seen():
        while monitor.poll(100):
            if recv_monitor_message(monitor)["event"] == event:
                return True
        return False
    wait_until(seen, timeout, f"socket event {event!r}", interval=0)


def test_a_frame_over_max_message_bytes_is_refused_before_it_is_held():
    # The attack: one 900 MiB frame made a server hold 940 MiB before refusing it. A frame
    # over max_message_bytes (default 256 MiB) drops the connection as it arrives.
    from pyfleet.service.limits import DEFAULTS
    assert DEFAULTS.max_message_bytes == 256 * MIB
    with ServerGroup(1, 1, extra_args=["--max-message-bytes", 8 * MIB]) as g, \
            Client(g.endpoints, timeout=30, heartbeat_interval=0) as c:
        pid = g.procs[0].pid
        before = _status(pid)["VmHWM"]
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sock.connect("tcp://" + g.endpoints[0])
        try:
            _wait_event(monitor, zmq.EVENT_CONNECTED)
            big = np.zeros(96 * MIB, np.uint8)   # 12 times the limit
            sock.send_multipart([P.pack_header(Op.PUSH_DENSE, 1, 1, big.size // 4, 1), big])
            _wait_event(monitor, zmq.EVENT_DISCONNECTED)  # the server dropped the connection
            assert not sock.poll(100)             # no reply: the connection was dropped
            grown = _status(pid)["VmHWM"] - before
            assert c.stats()[0]["server_index"] == 0  # and the server serves on
        finally:
            sock.disable_monitor()
            monitor.close(0)
            sock.close(0)
    assert grown < 24 * MIB, f"server peak RSS grew by {grown / MIB:.0f} MiB"


def _rss(pid):
    return _status(pid)["VmRSS"]


def _many_frames(frames, mib=1):
    """A PUSH_DENSE request followed by ``frames`` frames of ``mib`` MiB each (the same
    buffer, sent without a copy): over max_message_bytes in all, each frame under it."""
    big = np.ones(mib * MIB, np.uint8)
    return [P.pack_header(Op.PUSH_DENSE, 1, 1, 1, 1)] + [big] * frames


def _peer(endpoint, curve=None, monitor=0):
    """A DEALER connected to ``endpoint``; with ``monitor`` (events), also the socket
    those events of its connection arrive on, started before it connects."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        server_public, (public, secret) = curve
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = (
            server_public, public, secret)
    events = sock.get_monitor_socket(monitor) if monitor else None
    sock.connect("tcp://" + endpoint)
    return (sock, events) if monitor else sock


def _wait_rss_below(pid, limit, seconds=30):
    """The server's RSS once it is at most ``limit``, else after ``seconds`` (the caller
    asserts on it)."""
    with contextlib.suppress(AssertionError):
        wait_until(lambda: _rss(pid) <= limit, seconds, f"RSS <= {limit}", interval=0.1)
    return _rss(pid)


class _Peak:
    """The highest RSS of process ``pid`` while the ``with`` block runs (sampled every
    10 ms by a thread: VmHWM cannot be reset between the attacks of one test)."""

    def __init__(self, pid):
        self.pid, self.peak = pid, 0
        self._stop = threading.Event()

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, _rss(self.pid))

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss(self.pid))


def _cut(mon, seconds=60):
    """Whether the connection watched by monitor socket ``mon`` was dropped by the
    server within ``seconds``."""
    with contextlib.suppress(AssertionError):
        _wait_event(mon, zmq.EVENT_DISCONNECTED, seconds)
        return True
    return False


def test_a_message_of_many_frames_is_cut_at_max_message_bytes_and_gives_its_memory_back():
    # The attack: a message of many frames, each under max_message_bytes (256 MiB), was
    # held whole by libzmq (which bounds frames, not messages) and refused only once it
    # had all arrived: 1000 x 1 MiB made a server 1004 MiB larger. The server now reads
    # no more of a TCP connection once it holds max_message_bytes (what the server read
    # from it less the messages it took), and cuts it when it sends nothing more.
    with ServerGroup(1, 1) as g, Client(g.endpoints, timeout=30) as c:
        pid = g.procs[0].pid
        base = _rss(pid)
        for frames, mib in ((12, 25), (1000, 1)):   # 25 MiB frames; 1 MiB frames
            sock, mon = _peer(g.endpoints[0], monitor=zmq.EVENT_DISCONNECTED)
            try:
                with _Peak(pid) as peak:
                    sock.send_multipart(_many_frames(frames, mib), copy=False)
                    assert _cut(mon), f"{frames} x {mib} MiB: the connection was not cut"
                assert not sock.poll(100)   # no reply: the message never reached the server
                left = _wait_rss_below(pid, base + 32 * MIB) - base
            finally:
                sock.disable_monitor()
                mon.close(0)
                sock.close(0)
            grown = peak.peak - base
            print(f"{frames} x {mib} MiB: peak RSS {grown / MIB:+.0f} MiB, "
                  f"{left / MIB:+.0f} MiB once cut")
            # one connection holds at most max_message_bytes + 1 MiB of framing
            assert grown <= 257 * MIB + RSS_SLACK, f"peak RSS grew by {grown / MIB:.0f} MiB"
            assert left <= 32 * MIB, f"{left / MIB:.0f} MiB still held after the cut"
        counters = _counters(c)  # the client's own connection was never cut
        assert counters["cut_connections"] == 2, counters


def _first_event(mon, seconds=30):
    """The first event on monitor socket ``mon``, or None after ``seconds``."""
    if not mon.poll(seconds * 1000):
        return None
    return recv_monitor_message(mon)["event"]


def test_a_peer_with_the_job_key_is_cut_at_max_message_bytes_and_a_stranger_never_reaches_it(
        tmp_path):
    # A peer without a listed key never completes its handshake, and nothing it sends is
    # read; a job member's message of 300 x 1 MiB (which libzmq held whole before the
    # server refused it: +300 MiB) is read up to max_message_bytes (the framing of its
    # CURVE boxes counted), then cut, and its memory given back.
    from pyfleet.service import auth
    keys = tmp_path / "keys"
    auth.keygen(keys)
    server_public = auth.load_public_key(keys / "server.key")
    flags = ["--curve-secret-key-file", keys / "server.key_secret",
             "--curve-client-keys", keys / auth.AUTHORIZED_DIR,
             "--max-message-bytes", 64 * MIB]
    with ServerGroup(1, 1, extra_args=flags) as g, \
            Client(g.endpoints, timeout=30, curve_server_keys=server_public,
                   curve_client_key=keys / "client.key_secret") as c:
        pid = g.procs[0].pid
        before = _status(pid)["VmHWM"]
        handshake = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL |
                     zmq.EVENT_HANDSHAKE_SUCCEEDED)
        for curve in ((server_public, zmq.curve_keypair()), None):  # unlisted key; no CURVE
            sock, mon = _peer(g.endpoints[0], curve, monitor=handshake)
            try:
                sock.send_multipart(_many_frames(300), copy=False)
                assert _first_event(mon) in (zmq.EVENT_HANDSHAKE_FAILED_AUTH,
                                             zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
                assert not sock.poll(500)
            finally:
                sock.disable_monitor()
                mon.close(0)
                sock.close(0)
        stranger = _status(pid)["VmHWM"] - before
        assert c.stats()[0]["server_index"] == 0
        member, mon = _peer(g.endpoints[0], (server_public,
                                             auth.load_keypair(keys / "client.key_secret")),
                            monitor=zmq.EVENT_DISCONNECTED)
        try:
            base = _rss(pid)
            with _Peak(pid) as peak:
                member.send_multipart(_many_frames(300), copy=False)
                assert _cut(mon), "the member's 300 MiB message was not cut"
            left = _wait_rss_below(pid, base + 16 * MIB) - base
        finally:
            member.disable_monitor()
            mon.close(0)
            member.close(0)
        assert _counters(c)["cut_connections"] == 1
    held = peak.peak - base
    print(f"300 x 1 MiB: peak RSS {stranger / MIB:+.1f} MiB from peers without the job's key, "
          f"{held / MIB:+.0f} MiB from a member until cut, {left / MIB:+.0f} MiB after")
    assert stranger < 16 * MIB, f"a stranger's message grew the server by {stranger / MIB:.0f} MiB"
    assert held <= 65 * MIB + RSS_SLACK, \
        f"a member's message grew the server by {held / MIB:.0f} MiB"
    assert left <= 16 * MIB, f"{left / MIB:.0f} MiB still held after the cut"


def _unfinished_message(endpoint, frames, mib=1):
    """A TCP peer speaking ZMTP 3 (NULL) by hand that sends a PUSH_DENSE header and then
    ``frames`` frames of ``mib`` MiB, every one marked MORE: a message that never ends
    (libzmq's own sockets send nothing of a message before its last frame). Returns the
    socket; the frames go from a thread."""
    host, port = endpoint.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall(b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") +
              b"\0" * 32)                                    # the greeting (64 bytes)
    greeting = b""
    while len(greeting) < 64:
        greeting += s.recv(64 - len(greeting))
    ready = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    s.sendall(b"\x04" + bytes([len(ready)]) + ready)           # a command frame
    header = P.pack_header(Op.PUSH_DENSE, 1, 1, 1, 1)
    s.sendall(b"\x01" + bytes([len(header)]) + header)          # MORE, short
    chunk = b"\1" * (mib * MIB)

    def send():
        with contextlib.suppress(OSError):
            for _ in range(frames):
                s.sendall(b"\x03" + struct.pack(">Q", len(chunk)) + chunk)  # MORE, long

    threading.Thread(target=send, daemon=True).start()
    return s


def _inbound(c):
    """``(bytes TCP peers make the server hold now, at most so far, the bound)`` as the
    server counts them (``pyfleet.service.inbound``)."""
    s = c.stats()[0]
    return s["inbound_bytes"], s["peak_inbound_bytes"], s["inbound_bound_bytes"]


def test_peers_together_cannot_make_a_server_hold_more_than_its_buffer_budget():
    # The attack: several connections, each sending a message that never ends, every
    # one under max_message_bytes: libzmq held all of it (4 x 200 MiB: +800 MiB, of which
    # +504 MiB stayed after the peers left); a guard looking every 10 ms let through what
    # arrived meanwhile (+85 MiB, +106 MiB over a 60 MiB hold on a loaded machine). The
    # server now reads a TCP peer only while what it reads fits max_buffer_bytes (past
    # it one connection reads on alone, up to max_message_bytes), so whatever the
    # machine's speed or load they hold at most the documented bound; the peers holding
    # the budget and sending nothing more are cut one by one, the last (alone within
    # the budget) is not; the others' sends wait meanwhile (TCP holds them back).
    flags = ["--max-message-bytes", 64 * MIB, "--max-buffer-bytes", 96 * MIB]
    bound = 96 * MIB + 64 * MIB + 1 * MIB   # max_buffer + max_message + framing slack
    # the message of the one left, whole
    mine = wire_bytes(P.HEADER_SIZE, False) + 60 * wire_bytes(MIB, False)
    with ServerGroup(1, 1, extra_args=flags) as g, Client(g.endpoints, timeout=30) as c:
        c.create_tables([SPARSE])
        assert _inbound(c)[2] == bound
        pid = g.procs[0].pid
        base = _rss(pid)
        peers = []
        try:
            with _Peak(pid) as together:
                # any two of them hold more than max_buffer_bytes: one is left
                peers = [_unfinished_message(g.endpoints[0], 60) for _ in range(4)]
                wait_for_counter(c, "cut_connections", 3, 60)
                # the cut ones let go of, the one left holds its whole message
                wait_until(lambda: mine <= _inbound(c)[0] <= mine + (64 << 10), 60,
                           "the one left's 60 MiB, alone")
                held = _rss(pid) - base
                # a member's pulls go on: its connection waited while the budget was full
                rows = c.pull_sparse("emb", np.arange(1000, dtype=np.uint64))
                assert rows.shape == (1000, 4)
        finally:
            for s in peers:
                s.close()
        left = _wait_rss_below(pid, base + 16 * MIB) - base
        one = _unfinished_message(g.endpoints[0], 100)   # one alone: max_message_bytes
        try:
            with _Peak(pid) as alone:
                wait_for_counter(c, "cut_connections", 4, 60)
        finally:
            one.close()
        left_alone = _wait_rss_below(pid, base + 16 * MIB) - base
        counters, (_, peak, _) = _counters(c), _inbound(c)
    print(f"4 x 60 MiB unfinished: held at most {peak / MIB:.1f} MiB (bound {bound / MIB:.0f}"
          f" MiB), peak RSS {(together.peak - base) / MIB:+.0f} MiB, {held / MIB:+.0f} MiB "
          f"held by the one left, {left / MIB:+.0f} MiB once they left; 100 MiB on one "
          f"connection: peak {(alone.peak - base) / MIB:+.0f} MiB, "
          f"{left_alone / MIB:+.0f} MiB after")
    assert counters["cut_connections"] == 4, counters
    assert peak <= bound, f"the server held {peak / MIB:.1f} MiB of its peers' bytes"
    # RSS: what the server holds, and at most RSS_SLACK more (libzmq's and the
    # allocator's own memory, the stats calls)
    assert together.peak - base <= bound + RSS_SLACK, "peers together outgrew the bound"
    assert held <= mine + RSS_SLACK, f"{held / MIB:.0f} MiB held by the one left"
    assert alone.peak - base <= 64 * MIB + 1 * MIB + RSS_SLACK, "one outgrew max_message_bytes"
    assert left <= 16 * MIB and left_alone <= 16 * MIB, (left, left_alone)
