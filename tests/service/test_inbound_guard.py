"""The inbound guard counts, per TCP connection, what libzmq read that no received
message accounts for (``pyfleet.service.inbound``): exactly the handshake, whatever the
frames' sizes (ZMTP's one- and eight-byte sizes, CURVE's boxes), so a long run of
ordinary traffic never looks like bytes held; and a message not yet received shows."""

import numpy as np
import pytest
import zmq
from support.wait import wait_until

from pyfleet.service import inbound

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not inbound.available(), reason="needs Linux's TCP_INFO")]

SIZES = [0, 1, 36, 220, 221, 222, 255, 256, 257, 5000, 70000, 1 << 20]


@pytest.mark.parametrize("curve", [False, True], ids=["plain", "curve"])
def test_ordinary_traffic_leaves_nothing_unaccounted_but_the_handshake(curve):
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    dealer = ctx.socket(zmq.DEALER)
    guard = None
    try:
        if curve:
            public, secret = zmq.curve_keypair()
            router.curve_server, router.curve_secretkey = True, secret
            dealer.curve_serverkey = public
            dealer.curve_publickey, dealer.curve_secretkey = zmq.curve_keypair()
        port = router.bind_to_random_port("tcp://127.0.0.1")
        guard = inbound.InboundGuard(router, 64 << 20, 64 << 20, curve=curve)
        guard.start()
        dealer.connect(f"tcp://127.0.0.1:{port}")
        rng = np.random.default_rng(7)

        def exchange(n):
            for _ in range(n):
                frames = [b"h" * 36] + [b"x" * int(rng.choice(SIZES))
                                        for _ in range(int(rng.integers(0, 4)))]
                dealer.send_multipart(frames)
                guard.count(router.recv_multipart(copy=False))
            wait_until(lambda: len(guard.unread()) == 1, 10, "the connection watched")
            return next(iter(guard.unread().values()))

        handshake = exchange(1)
        assert 0 < handshake <= inbound.HANDSHAKE_BYTES
        after = exchange(3000)  # ~4,500 frames: one byte astray a frame would show
        assert after == handshake, (handshake, after)
        # a message sent and not yet received is what libzmq holds
        dealer.send_multipart([b"h" * 36, b"y" * 100_000])
        wait_until(lambda: next(iter(guard.unread().values())) > handshake, 10,
                   "the unread message counted")
        held = next(iter(guard.unread().values())) - handshake
        assert held == inbound.wire_bytes(36, curve) + inbound.wire_bytes(100_000, curve)
        guard.count(router.recv_multipart(copy=False))
        assert next(iter(guard.unread().values())) == handshake
        assert guard.cut == 0
    finally:
        if guard is not None:
            guard.stop()
        dealer.close(0)
        router.close(0)
        ctx.term()
