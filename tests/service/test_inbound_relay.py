"""The inbound relay (``pyfleet.service.inbound``) between TCP peers and a ROUTER:
it counts, per connection, what it gave libzmq that no received message accounts for:
exactly the handshake, whatever the frames' sizes (ZMTP's one- and eight-byte sizes,
CURVE's boxes), so a long run of ordinary traffic never looks like bytes held, and a
message not yet received shows; and it reads no more than the bound, holding a peer
back (TCP) without cutting it while the server does not read, losing nothing."""

import os
import tempfile
import threading
import time

import numpy as np
import pytest
import zmq
from support.wait import wait_until

from pyfleet.service import inbound, wire

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not inbound.available(), reason="needs Linux")]

SIZES = [0, 1, 36, 220, 221, 222, 255, 256, 257, 5000, 70000, 1 << 20]
MIB = 1 << 20


class _Relayed:
    """A ROUTER behind a relay on 127.0.0.1, and a DEALER connected to it over TCP."""

    def __init__(self, curve=False, max_message=64 * MIB, budget=64 * MIB):
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        if curve:
            public, secret = zmq.curve_keypair()
            self.router.curve_server, self.router.curve_secretkey = True, secret
            self.dealer.curve_serverkey = public
            self.dealer.curve_publickey, self.dealer.curve_secretkey = zmq.curve_keypair()
        self.router.setsockopt(zmq.RCVHWM, 16)
        listener = wire.listen("127.0.0.1", 0)
        directory = tempfile.mkdtemp(prefix="pyfleet-test-in-")
        path = os.path.join(directory, "r")
        self.router.bind("ipc://" + path)
        self.relay = inbound.InboundRelay(listener, path, directory, self.router, max_message,
                                          budget, curve=curve)
        self.relay.start()
        self.dealer.connect(f"tcp://127.0.0.1:{listener.getsockname()[1]}")

    def close(self):
        self.relay.stop()
        self.dealer.close(0)
        self.router.close(0)
        self.ctx.term()


@pytest.mark.parametrize("curve", [False, True], ids=["plain", "curve"])
def test_ordinary_traffic_leaves_nothing_unaccounted_but_the_handshake(curve):
    r = _Relayed(curve)
    try:
        rng = np.random.default_rng(7)

        def exchange(n):
            for _ in range(n):
                frames = [b"h" * 36] + [b"x" * int(rng.choice(SIZES))
                                        for _ in range(int(rng.integers(0, 4)))]
                r.dealer.send_multipart(frames)
                r.relay.count(r.router.recv_multipart(copy=False))
            return r.relay.held()

        handshake = exchange(1)
        assert 0 < handshake <= inbound.HANDSHAKE_BYTES
        after = exchange(3000)  # ~4,500 frames: one byte astray a frame would show
        assert after == handshake, (handshake, after)
        # a message sent and not yet received is what libzmq holds
        r.dealer.send_multipart([b"h" * 36, b"y" * 100_000])
        unread = inbound.wire_bytes(36, curve) + inbound.wire_bytes(100_000, curve)
        wait_until(lambda: r.relay.held() - handshake == unread, 10,
                   "the unread message counted, exactly", detail=r.relay.held)
        r.relay.count(r.router.recv_multipart(copy=False))
        assert r.relay.held() == handshake
        assert r.relay.cut == 0
    finally:
        r.close()


def test_a_server_that_does_not_read_holds_a_peer_back_within_the_bound_and_loses_nothing():
    # 50 x 1 MiB messages to a server that reads none of them for longer than a stall:
    # the relay reads max_message_bytes (8 MiB) + 1 MiB of them and no more (the peer's
    # sends wait in TCP), cuts nothing, and once the server reads, every message arrives.
    r = _Relayed(max_message=8 * MIB, budget=4 * MIB)
    try:
        r.relay.reading = False   # as the server's loop says while its handlers are full
        blocks = [np.full(MIB, i, np.uint8) for i in range(50)]
        for i, b in enumerate(blocks):
            r.dealer.send_multipart([b"h%d" % i, b])
        wait_until(lambda: r.relay.held() >= 8 * MIB, 10, "the relay read up to its bound")
        # longer than a stall, nothing happens (a sleep: what is checked is an absence)
        time.sleep(inbound.STALL_SECONDS + 0.5)
        assert r.relay.held() <= r.relay.bound()
        assert r.relay.peak <= 8 * MIB + inbound.FRAMING_SLACK, r.relay.peak
        assert r.relay.cut == 0
        r.relay.reading = True
        for i, b in enumerate(blocks):
            msg = r.router.recv_multipart(copy=False)
            r.relay.count(msg)
            assert msg[1].bytes == b"h%d" % i
            assert np.array_equal(np.frombuffer(msg[2].buffer, np.uint8), b)
        assert r.relay.cut == 0
        assert r.relay.peak <= r.relay.bound()
    finally:
        r.close()


@pytest.mark.parametrize(("value", "relayed"), [("1", True), ("0", False), ("yes", None)])
def test_the_relay_switch_takes_effect_or_is_refused_by_name(monkeypatch, value, relayed):
    """``PYFLEET_INBOUND_RELAY=0`` lets libzmq read TCP peers itself (no byte bound,
    and the server's stats say so); 1, the default, relays them; anything else is
    refused naming the variable, before the server listens."""
    from pyfleet.errors import ConfigError
    from pyfleet.service.client import Client
    from pyfleet.service.server import Server

    monkeypatch.setenv("PYFLEET_INBOUND_RELAY", value)
    if relayed is None:
        with pytest.raises(ConfigError, match=r"PYFLEET_INBOUND_RELAY must be 0 .* got 'yes'"):
            Server("127.0.0.1:0", 0, 1, 1)
        return
    server = Server("127.0.0.1:0", 0, 1, 1)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        with Client([server.endpoint], timeout=20, heartbeat_interval=0) as c:
            stats = c.stats()[0]
            assert (stats["inbound_bound_bytes"] is not None) == relayed
            assert (server._guard is not None) == relayed
    finally:
        server.stop()
        thread.join(30)
