"""The barrier and liveness rules of a server, without sockets or sleeps:
:class:`pyfleet.service.barrier.Barriers` driven with an explicit clock."""

import numpy as np
import pytest

from pyfleet.service.barrier import Barriers
from pyfleet.service.protocol import Refused

HB, BT = 10.0, 300.0  # heartbeat timeout, barrier timeout


def make(workers=3, sync=False):
    b = Barriers(workers, heartbeat_timeout=HB, barrier_timeout=BT, sync=sync)
    b.start(0.0)
    return b


def test_step_barrier_releases_once_every_live_worker_arrived():
    b = make(3)
    assert b.arrive(0, "t0", "step", 1.0) is None
    assert b.arrive(1, "t1", "step", 2.0) is None
    rel = b.arrive(2, "t2", "step", 3.0)
    assert sorted(rel.tokens) == ["t0", "t1", "t2"]
    assert (rel.count, rel.workers) == (1, 3)
    assert b.waiting == {} and b.started is None
    # the next barrier is counted on
    for w in range(3):
        rel = b.arrive(w, w, "step", 4.0)
    assert rel.count == 2


def test_a_worker_cannot_wait_twice_nor_at_an_unknown_kind():
    b = make(2)
    b.arrive(0, "t0", "step", 1.0)
    with pytest.raises(Refused, match="already waiting"):
        b.arrive(0, "again", "step", 1.5)
    with pytest.raises(Refused, match="'step' or 'pass'"):
        b.arrive(1, "t1", "epoch", 1.5)
    assert list(b.waiting) == [0]


def test_dead_worker_fails_the_barrier_after_the_heartbeat_timeout():
    b = make(2)
    b.seen(1, 0.0)                        # worker 1 was heard from, then fell silent
    b.arrive(0, "t0", "step", 1.0)
    assert b.check(HB - 0.1) is None      # silent, but not long enough
    fail = b.check(HB + 0.5)
    assert fail.tokens == ["t0"]
    assert "worker 1 sent nothing for 10.5 s (dead?)" in fail.why
    assert b.waiting == {} and b.started is None
    assert b.check(HB + 1.0) is None      # failed once, nothing left waiting


def test_late_worker_fails_the_barrier_only_after_the_barrier_timeout():
    b = make(2)
    b.arrive(0, "t0", "step", 1.0)
    for t in (50.0, 150.0, 250.0):       # worker 1 keeps its heartbeats up
        b.seen(1, t)
        assert b.check(t + 1.0) is None
    b.seen(1, 300.0)
    fail = b.check(1.0 + BT + 0.5)
    assert fail.tokens == ["t0"]
    assert "worker(s) [1] did not reach the barrier within 300 s" in fail.why


def test_a_live_late_worker_that_arrives_releases_the_barrier():
    b = make(2)
    b.arrive(0, "t0", "step", 1.0)
    b.seen(1, 5.0)
    assert b.check(6.0) is None
    rel = b.arrive(1, "t1", "step", 7.0)
    assert sorted(rel.tokens) == ["t0", "t1"]


def test_worker_that_never_connected_makes_the_server_give_up_after_the_barrier_timeout():
    b = make(2)
    b.seen(0, 1.0)
    rel, everyone = b.stop(0, 2.0)
    assert rel is None and not everyone
    assert b.abandoned(BT - 1.0) is None  # worker 1 may still be starting
    why = b.abandoned(BT + 1.0)
    assert "worker(s) [1] never connected within 300 s" in why
    assert why.endswith("worker(s) [0] stopped: no worker is left to serve")


def test_give_up_text_claims_no_stopped_worker_when_none_stopped():
    b = make(2)
    b.seen(0, 0.0)
    b.seen(1, 0.0)
    why = b.abandoned(HB + 1.0)
    assert "worker(s) [0, 1] sent nothing" in why
    assert "stopped" not in why  # the old text said "every other worker has stopped"


def test_the_servers_own_stall_is_not_the_workers_silence():
    b = make(2)
    b.seen(0, 0.0)
    b.seen(1, 0.0)
    b.arrive(0, "t0", "step", 1.0)
    # The server was stopped from t=2 to t=2+3*HB: no message could be read.
    now = 2.0 + 3 * HB + 0.5
    b.seen(0, now - 0.1)                  # read right after the stall
    b.pause(3 * HB, now)
    assert b.last_seen[0] == now          # moved on, but never into the future
    assert b.abandoned(now) is None
    assert b.check(now) is None
    # after the stall, silence counts again
    assert b.check(now + HB + 1.0).why == "worker 1 sent nothing for 13.5 s (dead?)"


def test_never_connected_alone_is_no_reason_to_give_up():
    b = make(2)                           # nobody stopped, nobody seen
    assert b.abandoned(10 * BT) is None


def test_server_gives_up_once_every_worker_stopped_or_went_silent():
    b = make(2)
    b.seen(0, 0.0)
    b.seen(1, 0.0)
    b.stop(0, 1.0)
    assert b.abandoned(HB - 1.0) is None
    why = b.abandoned(HB + 1.0)
    assert "worker(s) [1] sent nothing for more than 10 s (dead?)" in why


def test_stop_during_a_barrier_releases_the_workers_waiting_for_the_stopped_one():
    b = make(3)
    b.arrive(0, "t0", "step", 1.0)
    b.arrive(1, "t1", "step", 1.0)
    rel, everyone = b.stop(2, 2.0)
    assert sorted(rel.tokens) == ["t0", "t1"] and rel.workers == 2
    assert not everyone
    assert b.live() == {0, 1}
    # the stopped worker is never waited for again
    b.arrive(0, "u0", "step", 3.0)
    assert b.arrive(1, "u1", "step", 3.0) is not None
    assert b.stop(0, 4.0) == (None, False)
    assert b.stop(1, 4.0) == (None, True)


def test_a_stopped_worker_is_not_declared_dead():
    b = make(2)
    b.seen(1, 0.0)
    b.stop(1, 0.5)
    b.arrive(0, "t0", "step", 1.0)       # completes at once: 1 is not live
    b.arrive(0, "t0b", "step", 100.0)    # and again, long after 1 went quiet
    assert b.check(200.0) is None
    assert b.waiting == {}


def test_pass_barrier_waits_while_the_others_go_on_with_their_steps():
    b = make(3)
    assert b.arrive(0, "p0", "pass", 1.0) is None      # worker 0 has no batches left
    b.arrive(1, "s1", "step", 2.0)
    rel = b.arrive(2, "s2", "step", 2.0)                # a step completes without 0
    assert sorted(rel.tokens) == ["s1", "s2"] and rel.workers == 2
    assert list(b.waiting) == [0] and b.started == 2.0  # 0 still waits, clock restarted
    b.arrive(1, "p1", "pass", 3.0)
    rel = b.arrive(2, "p2", "pass", 4.0)                 # everyone at the pass barrier
    assert sorted(rel.tokens) == ["p0", "p1", "p2"] and rel.workers == 0
    assert b.waiting == {} and b.started is None


def test_step_barrier_hands_over_the_sync_gradients_and_a_failed_one_drops_them():
    b = make(2, sync=True)
    k = np.array([1, 2], dtype=np.uint64)
    g = np.ones((2, 4), np.float32)
    b.buffer(1, 7, k, g)
    b.buffer(0, 7, k, 2 * g)
    b.arrive(0, "t0", "step", 1.0)
    rel = b.arrive(1, "t1", "step", 1.0)
    assert list(rel.sync) == [7] and [w for w, _, _ in rel.sync[7]] == [1, 0]
    assert b.sync_buf == {}
    # a failed step's gradients die with it
    b.seen(1, 1.0)
    b.buffer(0, 7, k, g)
    b.arrive(0, "t0", "step", 2.0)
    assert b.check(2.0 + HB + 1.0) is not None
    assert b.sync_buf == {}


def test_pass_barrier_and_async_servers_hand_over_no_gradients():
    b = make(1, sync=True)
    b.buffer(0, 3, None, np.ones(4, np.float32))
    rel = b.arrive(0, "p0", "pass", 1.0)
    assert rel.sync == {} and 3 in b.sync_buf    # kept for the next step barrier
    a = make(1, sync=False)
    rel = a.arrive(0, "t0", "step", 1.0)
    assert rel.sync == {}


def test_a_worker_that_may_return_keeps_the_job_until_it_leaves_or_falls_silent():
    b = make(2)
    assert b.stop(0, 1.0) == (None, False)
    rel, finished = b.stop(1, 2.0, may_return=True)   # Fluid's lifecycle: its process goes on
    assert rel is None and not finished
    b.seen(1, 2.0 + HB)                                # its heartbeats
    assert not b.finished(2.0 + 2 * HB)                # heard HB ago: still there
    assert b.abandoned(2.0 + 2 * HB) is None           # a stopped worker is no failure
    assert b.stop(1, 2.0 + 2 * HB) == (None, True)     # its process ends: the job too
    b = make(1)
    b.stop(0, 1.0, may_return=True)
    assert not b.finished(1.0 + HB)
    assert b.finished(1.0 + HB + 0.1)                  # killed after it stopped: silent


def test_a_stopped_worker_that_starts_again_is_waited_for_at_the_barriers():
    b = make(2)
    b.stop(1, 1.0, may_return=True)
    assert b.arrive(0, "t0", "step", 2.0) is not None  # without worker 1
    assert b.rejoin(1, 3.0) and b.live() == {0, 1}
    assert not b.rejoin(1, 3.0)                        # live already: nothing changes
    assert b.arrive(0, "u0", "step", 4.0) is None      # waits for worker 1 again
    assert sorted(b.arrive(1, "u1", "step", 4.0).tokens) == ["u0", "u1"]
    b.stop(0, 6.0)
    rel, finished = b.stop(1, 6.0)                     # stopped for good: the job ends
    assert rel is None and finished
