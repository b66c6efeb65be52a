"""Rows a disk tier reads back per step under eviction policies, simulated on
bench_capacity.py's ids (no table is built: which rows are in RAM only).

    python benchmarks/disk_tier/eviction_sim.py [--rows 2000000] [--batch 100000] [--steps 30]
                                      [--in-ram 223000 300000 400000]
                                      [--policies old new ...] [--shift-at STEP] [--uniform]
                                      [--periodic WARM EVERY FRESH]

The trace is bench_capacity.py's: the same generator and seed, Zipf(1.1) ranks
over --rows rows, key = rank x 0x9E3779B97F4A7C15 and its shard the table's
(the top 6 bits of Mix64(key)); the fill makes the rows in rank order in
chunks of 2^18, then 2 warm steps and --steps steps. With --shift-at S every
rank moves to another key (rank + rows/2) from step S on: a hot set that
moves at once; with --uniform the ids are uniform (nothing worth keeping);
with --periodic WARM EVERY FRESH, WARM rows each used every EVERY steps beside
FRESH rows a step used once (where 2Q's ghost window misses warm rows). Each step, per shard, like the table: the pull counts its hits
(per occurrence), reads back its misses and evicts down to the shard's share
(--in-ram / 64 rows); the push reads back what the pull's eviction sent out,
counts its keys once and evicts. Printed: rows read back per step over all
steps and over the last 40 (the steady state of a long run).

Policies (spill_evict.cc's is `new`; `old` the one before it):
  old     CLOCK, a row read back at 1, every pull and push +1, up to 3
  new     CLOCK, every row in at 0, pulls and pushes +1 up to 3 but not in
          the step that brought the row in; an eviction's first pass
          spares the rows of this step
  at0     old, but a row read back at 0
  cap7    old, counts up to 7
  once    at 0, one count a step at most (its own step not counted)
  wtlfu   W-TinyLFU: a 20% LRU window, a segmented-LRU main part (80%
          protected), admission from the window by a count-min sketch
          (4 rows of 4-bit counters, halved every 5 x the shard's rows
          added) with a doorkeeper
  hist    new, and a use history in the row's spill record (what a
          one-byte field there could hold): leaving RAM, h = min(15,
          h // 2 + its uses in RAM, its read-back one of them); read back
          at count min(7, h); counts up to 7
  decay   new, and a use score per row that survives eviction, halved every
          100 steps (a float and a time a row: not one byte); read back at
          count min(15, 4 x score); counts up to 15
  ghost   2Q, its ghost list on disk: a row new or read back is on
          probation (a FIFO) unless it left RAM within the shard's last
          (its rows) evictions (the count of evictions when it left, in
          its spill record); probation rows not used again within 2 steps
          of coming in go first, one used again joins the CLOCK queue
          (new's), which gives victims when probation has none
  ghost1  ghost, young for 1 step (its own) instead of 2
  ghost3  ghost, young for 3 steps
  ghostw  ghost, the ghost window half the shard's rows
  ghosth  ghost, and the CLOCK queue's hand moves one row (a count less)
          for each row evicted from probation
  ghosth2 ghosth, and a row at zero under that hand is evicted
  ghosth2w2, ghosth2w4  ghosth2 with a ghost window of 2 / 4 x the shard's rows
  ghosth2a8, ghosth2a16  ghosth2, but the hand evicts a row at zero only 8 /
          16 steps after it came
  ghosth2n  ghosth2, but the hand evicts a row at zero only if it was used
          since it came (a row read back and not used again is spared)
  ghosth2n8  ghosth2, but the hand spares a row not used since it came if it
          came fewer than 8 steps ago by the table's 5-bit call epoch (two
          calls a step: ages wrap at 16 steps)
  ghostk  ghost, but probation keeps 5% of the shard's rows (old ones
          too), the rest of the victims from the CLOCK queue
  ghostkh ghostk and ghosth2
  static  the --in-ram most frequent ranks always in RAM (not reachable:
          it knows the ranks and skips the warm-up)
  opt     clairvoyant (evicts the rows used furthest ahead), from the RAM
          the fill leaves under `old` (its last rows): a floor for any
          policy on this trace
Simulation only: a few minutes for the defaults and every policy.
"""

import argparse
import collections
import heapq
import math

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
SHARD_BITS = 6
SHARDS = 1 << SHARD_BITS
FILL_CHUNK = 1 << 18


def mix64(x):
    x = x.copy()
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def trace(args):
    """[(ranks, occurrences)] per step, in bench_capacity.py's order."""
    if args.periodic is not None:
        # Warm rows [0, warm), each used every `every` steps, beside `fresh`
        # rows a step used once (ranks after the warm ones, in order).
        warm, every, fresh = args.periodic
        out = []
        for t in range(args.steps + 2):
            w = np.arange(t % every, warm, every)
            f = warm + t * fresh + np.arange(fresh)
            out.append((np.concatenate([w, f]), np.ones(len(w) + fresh, np.int64)))
        return out
    rng = np.random.default_rng(7)
    batches = []
    for _ in range(args.steps):
        if args.uniform:
            batches.append(rng.integers(0, args.rows, args.batch))
            continue
        z = rng.zipf(1.1, args.batch)
        while (far := z > args.rows).any():
            z[far] = rng.zipf(1.1, int(far.sum()))
        batches.append(z - 1)
    out = []
    for i, b in enumerate(batches[:2] + batches):
        if args.shift_at is not None and i >= args.shift_at:
            b = (b + args.rows // 2) % args.rows
        out.append(np.unique(b, return_counts=True))
    return out


class Clock:
    """CLOCK with use counts as a queue per shard (spill_evict.cc)."""

    def __init__(self, n, cap, enter=0, max_use=3, own_step=True, per_step=False,
                 spare_fresh=False, hist=None):
        self.cap, self.enter, self.max_use = cap, enter, max_use
        self.own_step, self.per_step, self.spare_fresh = own_step, per_step, spare_fresh
        # hist = (leave(h, uses), back(h)): the history a row leaves RAM
        # with, given the one it came with and its uses meanwhile (its
        # read-back one of them); the count it comes back at.
        self.hist = hist
        self.h = bytearray(n)                # on disk, with the row
        self.uses = np.zeros(n, np.int64)    # in RAM
        self.used = bytearray(n)
        self.res = bytearray(n)
        self.came = np.full(n, -1, np.int64)     # step the row came to RAM
        self.ever = bytearray(n)                 # a use counted since it came
        self.counted = np.full(n, -1, np.int64)  # step of its last count
        self.rings = [collections.deque() for _ in range(SHARDS)]
        self.size = [0] * SHARDS
        self.step = -1

    def resident(self, r):
        return self.res[r]

    def use(self, r, k, push=False):
        if not self.own_step and self.came[r] == self.step:
            return
        if self.per_step:
            if self.counted[r] == self.step:
                return
            self.counted[r], k = self.step, 1
        self.used[r] = min(self.max_use, self.used[r] + k)
        self.uses[r] += k
        self.ever[r] = 1

    def load(self, s, r, reload):
        self.res[r] = 1
        self.size[s] += 1
        self.rings[s].append(r)
        self.used[r] = self.enter if reload else 0
        self.came[r] = self.step
        self.ever[r] = 0
        self.uses[r] = int(reload)
        if reload and self.hist is not None:
            self.used[r] = self.hist[1](self.h[r])

    def evict(self, s):
        ring, used = self.rings[s], self.used
        first = len(ring)
        seen = 0
        while self.size[s] > self.cap and ring:
            r = ring.popleft()
            seen += 1
            if used[r]:
                used[r] -= 1
                ring.append(r)
            elif self.spare_fresh and seen <= first and self.came[r] == self.step:
                ring.append(r)
            else:
                self.gone(s, r)
                self.size[s] -= 1

    def gone(self, s, r):
        self.res[r] = 0
        if self.hist is not None:
            self.h[r] = self.hist[0](self.h[r], int(self.uses[r]))


class Decayed(Clock):
    """new, read back at a count from a use score that survives eviction,
    halved every `half` steps."""

    def __init__(self, n, cap, half=100, scale=4, max_use=15):
        super().__init__(n, cap, own_step=False, spare_fresh=True, max_use=max_use)
        self.score, self.at = np.zeros(n), np.zeros(n, np.int64)
        self.half, self.scale = half, scale

    def decay(self, r):
        self.score[r] *= 2.0 ** (-(self.step - self.at[r]) / self.half)
        self.at[r] = self.step

    def use(self, r, k, push=False):
        if self.came[r] != self.step:
            super().use(r, k)
            if not push:  # a step's use counts once
                self.decay(r)
                self.score[r] += 1

    def load(self, s, r, reload):
        super().load(s, r, reload)
        if reload:
            self.decay(r)
            self.used[r] = min(self.max_use, int(self.scale * self.score[r]))
            self.score[r] += 1


class Ghost(Clock):
    """2Q with the ghost list on disk: a row new or read back is on
    probation unless it left RAM in the shard's last `window` x its rows'
    evictions (the shard's count of evictions when it left, in its spill
    record); a row on probation not used again within `young` steps of
    coming in is the first to go, one used again joins the CLOCK queue
    (new's). With `hand`, each row evicted from probation moves the CLOCK
    queue's hand one row (a count less; with 2 a row at zero goes too,
    which leaves the shard that many rows under its share until its next
    call)."""

    def __init__(self, n, cap, young=2, window=1.0, hand=False, keep=0.0, hand_age=1,
                 spare_unused=None):
        super().__init__(n, cap, own_step=False, spare_fresh=True)
        self.hand_age = hand_age  # a row at zero goes under the hand this many steps after it came
        # The hand spares a row not used since it came: always (math.inf), or if it came
        # fewer than this many steps ago by the table's 5-bit call epoch (a step's two
        # calls: ages wrap at 16 steps); None: never.
        self.spare_unused = spare_unused
        self.young, self.window, self.hand = young, window * cap, hand
        self.keep = keep * cap
        self.prob = [collections.deque() for _ in range(SHARDS)]
        self.left = np.full(n, -(1 << 40), np.int64)
        self.evicted = [0] * SHARDS

    def load(self, s, r, reload):
        super().load(s, r, reload)
        if self.evicted[s] - self.left[r] > self.window:  # new rows too
            self.rings[s].pop()
            self.prob[s].append(r)

    def spared_unused(self, r):
        """Whether the hand spares row r, at zero, as not used since it came."""
        if self.spare_unused is None or self.ever[r]:
            return False
        age = self.step - self.came[r]
        return math.isinf(self.spare_unused) or age % 16 < self.spare_unused

    def evict(self, s):
        prob, ring, used = self.prob[s], self.rings[s], self.used
        out = 0
        while self.size[s] > self.cap and len(prob) > self.keep:
            r = prob[0]
            if used[r]:
                ring.append(prob.popleft())
            elif self.step - self.came[r] < self.young:
                break  # this one and every row behind it came in later
            else:
                self.gone(s, prob.popleft())
                self.size[s] -= 1
                out += 1
        # hand: the CLOCK queue's counts run down one entry a row evicted
        # from probation, so that rows no longer used leave it in time
        for _ in range(out if self.hand else 0):
            if not ring:
                break
            r = ring.popleft()
            if used[r]:
                used[r] -= 1
                ring.append(r)
            elif (self.hand == 2 and self.step - self.came[r] >= self.hand_age
                  and not self.spared_unused(r)):
                self.gone(s, r)  # over the cap by one less next time
                self.size[s] -= 1
            else:
                ring.append(r)
        super().evict(s)
        while self.size[s] > self.cap:  # the CLOCK queue ran dry
            self.gone(s, prob.popleft())
            self.size[s] -= 1

    def gone(self, s, r):
        super().gone(s, r)
        self.left[r] = self.evicted[s]
        self.evicted[s] += 1


class WTinyLFU:
    """Window LRU + segmented-LRU main part, sketch admission, per shard."""

    def __init__(self, n, cap, window=0.2, sample=5):
        self.cap, self.wcap = cap, max(1, int(cap * window))
        self.pcap = int((cap - self.wcap) * 0.8)
        self.res = bytearray(n)
        self.win = [collections.OrderedDict() for _ in range(SHARDS)]
        self.prob = [collections.OrderedDict() for _ in range(SHARDS)]
        self.prot = [collections.OrderedDict() for _ in range(SHARDS)]
        self.w = max(64, cap)
        ranks = np.arange(n, dtype=np.uint64)
        # Each rank's 4 counters and 2 doorkeeper bits, all shards alike.
        self.cells = np.stack([mix64(ranks * GOLDEN + np.uint64(i * 0x1234567 + 1)) % np.uint64(self.w)
                               for i in range(4)], 1).astype(np.int64)
        dk = mix64(ranks * np.uint64(7919) + np.uint64(3))
        self.dk = np.stack([dk % np.uint64(8 * self.w), (dk >> np.uint64(32)) % np.uint64(8 * self.w)],
                           1).astype(np.int64)
        self.counts = [np.zeros((4, self.w), np.uint8) for _ in range(SHARDS)]
        self.door = [np.zeros(8 * self.w, np.bool_) for _ in range(SHARDS)]
        self.added = [0] * SHARDS
        self.sample = sample * cap
        self.shard = None  # set by the caller before each shard's accesses

    def resident(self, r):
        return self.res[r]

    def add(self, s, r):
        door, a, b = self.door[s], self.dk[r, 0], self.dk[r, 1]
        if not (door[a] and door[b]):
            door[a] = door[b] = True
        else:
            c = self.counts[s]
            for i in range(4):
                j = self.cells[r, i]
                if c[i, j] < 15:
                    c[i, j] += 1
        self.added[s] += 1
        if self.added[s] >= self.sample:
            self.added[s] = 0
            self.counts[s] >>= 1
            self.door[s][:] = False

    def estimate(self, s, r):
        c = self.counts[s]
        e = min(int(c[i, self.cells[r, i]]) for i in range(4))
        return e + int(self.door[s][self.dk[r, 0]] and self.door[s][self.dk[r, 1]])

    def touch(self, s, r):
        if r in self.win[s]:
            self.win[s].move_to_end(r)
        elif r in self.prob[s]:
            del self.prob[s][r]
            self.prot[s][r] = None
            while len(self.prot[s]) > self.pcap:
                d, _ = self.prot[s].popitem(last=False)
                self.prob[s][d] = None
        elif r in self.prot[s]:
            self.prot[s].move_to_end(r)

    def use(self, r, k, push=False):
        if not push:  # the sketch counts a step's pull once; a push adds nothing
            self.add(self.shard, r)
        self.touch(self.shard, r)

    def load(self, s, r, reload):
        self.add(s, r)
        self.res[r] = 1
        self.win[s][r] = None

    def evict(self, s):
        win, prob, prot = self.win[s], self.prob[s], self.prot[s]
        while len(win) + len(prob) + len(prot) > self.cap:
            if len(win) > self.wcap:
                c, _ = win.popitem(last=False)
                if len(prob) + len(prot) < self.cap - self.wcap:
                    prob[c] = None
                    continue
                q = prob if prob else prot
                v = next(iter(q))
                if self.estimate(s, c) > self.estimate(s, v):
                    del q[v]
                    self.res[v] = 0
                    prob[c] = None
                else:
                    self.res[c] = 0
            else:
                q = prob if prob else (prot if prot else win)
                v, _ = q.popitem(last=False)
                self.res[v] = 0


POLICIES = {
    "old": lambda n, cap: Clock(n, cap, enter=1),
    "new": lambda n, cap: Clock(n, cap, own_step=False, spare_fresh=True),
    "at0": lambda n, cap: Clock(n, cap),
    "cap7": lambda n, cap: Clock(n, cap, enter=1, max_use=7),
    "once": lambda n, cap: Clock(n, cap, own_step=False, per_step=True),
    "wtlfu": lambda n, cap: WTinyLFU(n, cap),
    "hist": lambda n, cap: Clock(n, cap, own_step=False, spare_fresh=True, max_use=7,
                                 hist=(lambda h, u: min(15, h // 2 + u), lambda h: min(7, h))),
    "decay": lambda n, cap: Decayed(n, cap),
    "ghost": lambda n, cap: Ghost(n, cap),
    "ghost1": lambda n, cap: Ghost(n, cap, young=1),
    "ghost3": lambda n, cap: Ghost(n, cap, young=3),
    "ghostw": lambda n, cap: Ghost(n, cap, window=0.5),
    "ghosth": lambda n, cap: Ghost(n, cap, hand=1),
    "ghosth2": lambda n, cap: Ghost(n, cap, hand=2),
    "ghosth2w2": lambda n, cap: Ghost(n, cap, hand=2, window=2.0),
    "ghosth2w4": lambda n, cap: Ghost(n, cap, hand=2, window=4.0),
    "ghosth2a8": lambda n, cap: Ghost(n, cap, hand=2, hand_age=8),
    "ghosth2a16": lambda n, cap: Ghost(n, cap, hand=2, hand_age=16),
    "ghosth2n": lambda n, cap: Ghost(n, cap, hand=2, spare_unused=math.inf),
    "ghosth2n8": lambda n, cap: Ghost(n, cap, hand=2, spare_unused=8),
    "ghostk": lambda n, cap: Ghost(n, cap, keep=0.05),
    "ghostkh": lambda n, cap: Ghost(n, cap, keep=0.05, hand=2),
}


def by_shard(shard, ranks, occ):
    order = np.argsort(shard[ranks], kind="stable")
    starts = np.searchsorted(shard[ranks][order], np.arange(SHARDS + 1))
    r, o = ranks[order].tolist(), occ[order].tolist()
    return [(r[starts[s]:starts[s + 1]], o[starts[s]:starts[s + 1]]) for s in range(SHARDS)]


def fill_order(args, shard):
    """Per fill chunk, per shard, its ranks in key order (as a pull sorts its misses)."""
    keys = np.arange(args.rows, dtype=np.uint64) * GOLDEN
    out = []
    for lo in range(0, args.rows, FILL_CHUNK):
        r = np.arange(lo, min(args.rows, lo + FILL_CHUNK))
        r = r[np.lexsort((keys[r], shard[r]))]
        starts = np.searchsorted(shard[r], np.arange(SHARDS + 1))
        out.append([r[starts[s]:starts[s + 1]].tolist() for s in range(SHARDS)])
    return out


def simulate(p, steps, shard, fill):
    for chunk in fill:
        for s in range(SHARDS):
            for r in chunk[s]:
                p.load(s, r, False)
            p.evict(s)
    reads = []
    for t, (ranks, occ) in enumerate(steps):
        p.step = t
        m = 0
        for s, (rs, os_) in enumerate(by_shard(shard, ranks, occ)):
            p.shard = s
            miss = []
            for r, o in zip(rs, os_):
                if p.resident(r):
                    p.use(r, o)
                else:
                    miss.append(r)
            for r in miss:
                p.load(s, r, True)
            p.evict(s)
            for r in rs:  # the push: rows the pull's eviction sent out come back
                if not p.resident(r):
                    p.load(s, r, True)
                    m += 1
            for r in rs:
                p.use(r, 1, push=True)
            p.evict(s)
            m += len(miss)
        reads.append(m)
    return reads


def opt(steps, shard, rows, cap):
    """Belady per shard: after each step evict the rows used furthest ahead."""
    never = len(steps) + 1
    nxt = np.full(rows, never, np.int64)
    nexts = [None] * len(steps)
    for t in range(len(steps) - 1, -1, -1):
        r = steps[t][0]
        nexts[t] = nxt[r].copy()
        nxt[r] = t
    res = np.zeros(rows, np.bool_)
    heaps = [[] for _ in range(SHARDS)]  # (-next use, -rank), stale entries skipped
    cur = np.full(rows, -1, np.int64)
    counts = np.zeros(SHARDS, np.int64)
    for r in range(rows - 1, -1, -1):  # the fill's last rows stay, cap a shard
        s = shard[r]
        if counts[s] < cap:
            counts[s] += 1
            res[r] = True
            cur[r] = nxt[r]
            heaps[s].append((-nxt[r], -r))
    for h in heaps:
        heapq.heapify(h)
    reads = []
    for t, (ranks, _) in enumerate(steps):
        reads.append(int((~res[ranks]).sum()))
        for r, nu in zip(ranks.tolist(), nexts[t].tolist()):
            s = shard[r]
            if not res[r]:
                res[r] = True
                counts[s] += 1
            cur[r] = nu
            heapq.heappush(heaps[s], (-nu, -r))
        for s in set(shard[ranks].tolist()):
            h = heaps[s]
            while counts[s] > cap:
                nu, r = heapq.heappop(h)
                r = -r
                if res[r] and cur[r] == -nu:
                    res[r] = False
                    counts[s] -= 1
    return reads


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--in-ram", type=int, nargs="+", default=[223_000, 300_000, 400_000])
    ap.add_argument("--policies", nargs="+", default=list(POLICIES) + ["static", "opt"],
                    choices=list(POLICIES) + ["static", "opt"])
    ap.add_argument("--shift-at", type=int, default=None)
    ap.add_argument("--uniform", action="store_true", help="uniform ids instead of Zipf(1.1)")
    ap.add_argument("--periodic", type=int, nargs=3, metavar=("WARM", "EVERY", "FRESH"),
                    default=None, help="instead of Zipf: WARM rows each used every EVERY steps "
                                       "beside FRESH rows a step used once (default: off)")
    args = ap.parse_args()
    if args.periodic is not None:
        warm, every, fresh = args.periodic
        if min(args.periodic) < 1 or warm + (args.steps + 2) * fresh > args.rows:
            ap.error(f"--periodic {warm} {every} {fresh}: all positive, and WARM + "
                     f"(steps + 2) x FRESH within --rows {args.rows}")
    if args.shift_at is not None and not 0 <= args.shift_at < args.steps + 2:
        ap.error(f"--shift-at must be a step in [0, {args.steps + 2}), got {args.shift_at}")
    steps = trace(args)
    shard = (mix64(np.arange(args.rows, dtype=np.uint64) * GOLDEN) >> np.uint64(64 - SHARD_BITS)
             ).astype(np.int64)
    fill = fill_order(args, shard)
    tail = min(40, len(steps))
    distinct = len(np.unique(np.concatenate([r for r, _ in steps])))
    print(f"{len(steps)} steps (2 warm + {args.steps}) of {args.batch:,} "
          f"{'periodic' if args.periodic else 'uniform' if args.uniform else 'Zipf(1.1)'} ids over "
          f"{args.rows:,} rows: {np.mean([len(r) for r, _ in steps]):,.0f} distinct a step, "
          f"{distinct:,} in all ({distinct / len(steps):,.0f} a step)")
    print(f"{'policy':<8} {'rows in RAM':>12} {'read/step':>10} {f'last {tail}':>10}")
    for c in args.in_ram:
        cap = c // SHARDS
        for name in args.policies:
            if name == "static":
                shifted = [(r - args.rows // 2) % args.rows if args.shift_at is not None and t >= args.shift_at
                           else r for t, (r, _) in enumerate(steps)]
                reads = [int((r >= c).sum()) for r in shifted]
            elif name == "opt":
                reads = opt(steps, shard, args.rows, cap)
            else:
                reads = simulate(POLICIES[name](args.rows, cap), steps, shard, fill)
            print(f"{name:<8} {c:>12,} {np.mean(reads):>10,.0f} {np.mean(reads[-tail:]):>10,.0f}",
                  flush=True)


if __name__ == "__main__":
    main()
