"""8-bit block-quantised optimizer state (storage="fp16_q8"/"bf16_q8",
row_q8.h) against a plain numpy reference of its rule, bit for bit: Adam and
Adagrad through pushes, deltas, save/load and conversion to and from every
other storage; refusal of the rules it does not code; rows per byte."""

import os
import subprocess
import sys

import numpy as np
import pytest
from support.reference import init_state, update
from support.rounding import (
    nearest,
    pow_count,
    q8_round_trip,
    round_bits,
    stochastic,
    summed_like_core,
)
from support.tables import fleet_table_configs, snapshot, trained_table

import pyfleet
from pyfleet.entry import CountFilterEntry
from pyfleet.optimizer import FTRL, SGD, Adagrad, Adam

Q8 = ["fp16_q8", "bf16_q8"]
Q8_OPTIMIZERS = [
    Adagrad(learning_rate=0.05, epsilon=1e-6, initial_accumulator_value=0.1),
    Adam(learning_rate=0.01, beta1=0.9, beta2=0.999, epsilon=1e-8),
]


def weight_kind(storage):
    return storage.split("_")[0]


def signed_vectors(opt):
    return 1 if opt.kind == "Adam" else 0


def head_size(opt, dim):
    return 2 * dim if opt.kind == "Adam" else dim


def with_tail(opt, head, count):
    """The full fp32 state a q8 row loads: the decoded head and, for Adam,
    the beta powers derived from the update count."""
    if opt.kind != "Adam":
        return head.copy()
    tail = [pow_count(opt.beta1, count + 1), pow_count(opt.beta2, count + 1)]
    return np.concatenate([head, np.array(tail, np.float32)])


class Reference:
    """The numpy model of one q8 table: rows as the table decodes them."""

    def __init__(self, storage, opt, dim, seed):
        self.storage, self.opt, self.dim, self.seed = storage, opt, dim, seed
        self.w, self.head, self.count = {}, {}, {}

    def ensure(self, k):
        if k in self.w:
            return
        raw = pyfleet.SparseTable(self.dim, self.opt, seed=self.seed).initial_values(
            np.array([k], np.uint64))[0]
        self.w[k] = nearest(weight_kind(self.storage), raw)
        h = head_size(self.opt, self.dim)
        self.head[k] = q8_round_trip(init_state(self.opt, self.dim)[:h], self.dim,
                                     signed_vectors(self.opt))
        self.count[k] = 0

    def push(self, keys, grads, delta=False):
        n, h = self.dim, head_size(self.opt, self.dim)
        for k, g in summed_like_core(keys, grads).items():
            self.ensure(k)
            r = round_bits(self.seed, k, self.count[k], n + h)
            w = self.w[k].copy()
            if delta:
                w += g
            else:
                s = with_tail(self.opt, self.head[k], self.count[k])
                update(self.opt, w, s, g)
                self.head[k] = q8_round_trip(s[:h], n, signed_vectors(self.opt), r[n:])
            self.w[k] = stochastic(weight_kind(self.storage), w, r[:n])
            self.count[k] += 1

    def check(self, table):
        e = table.export(with_state=True)
        assert len(e["keys"]) == len(self.w)
        for i, k in enumerate(e["keys"].tolist()):
            np.testing.assert_array_equal(e["weights"][i], self.w[k])
            np.testing.assert_array_equal(e["state"][i],
                                          with_tail(self.opt, self.head[k], self.count[k]))
            assert e["update_count"][i] == self.count[k]


@pytest.mark.parametrize("storage", Q8)
@pytest.mark.parametrize("opt", Q8_OPTIMIZERS, ids=repr)
@pytest.mark.parametrize("dim", [1, 8, 16, 19, 32, 40, 48])
def test_q8_update_equals_numpy_reference(storage, opt, dim):
    """Blocks of 16 (dim 19 and 40: a short last block; 16, 32 and 48: full
    blocks only, the vector codec, a row's draws in one pass of the
    generator up to 64 elements and in chunks past it), pushes with equal
    keys summed, gradients spanning magnitudes so that codes hit 0 and the
    clamps, and geo deltas that leave the state's codes as they are."""
    rng = np.random.default_rng(dim)
    seed = 13
    table = pyfleet.SparseTable(dim, opt, seed=seed, storage=storage)
    ref = Reference(storage, opt, dim, seed)
    pool = np.concatenate([np.array([0, 2**64 - 1], np.uint64),
                           rng.integers(0, 2**64, 30, dtype=np.uint64)])
    for step in range(30):
        n = int(rng.integers(1, 40))
        keys = rng.choice(pool, size=n)
        pulled = table.pull(keys)
        for i, k in enumerate(keys.tolist()):
            ref.ensure(k)
            np.testing.assert_array_equal(pulled[i], ref.w[k])
        scale = 10.0 ** rng.uniform(-6, 1, (n, 1))
        grads = (rng.normal(0, 1, (n, dim)) * scale).astype(np.float32)
        grads[:, ::3] *= np.float32(1e-4)  # small elements beside large ones in a block
        if step % 7 == 6:
            table.add(keys, grads)
            ref.push(keys, grads, delta=True)
        else:
            table.push(keys, grads)
            ref.push(keys, grads)
    ref.check(table)


@pytest.mark.parametrize("storage", Q8)
def test_adam_m_is_zero_where_v_codes_zero(storage):
    """An element whose gradient is far below its block's largest gets a v
    code of 0 and so an m of 0: the next update with a zero gradient there
    does not divide m by epsilon alone."""
    t = pyfleet.SparseTable(16, Adam(0.01), seed=1, storage=storage)
    keys = np.arange(200, dtype=np.uint64)
    w0 = t.pull(keys)
    g = np.zeros((200, 16), np.float32)
    g[:, 0] = 1.0
    g[:, 1] = 1e-4
    t.push(keys, g)
    st = t.export(keys, with_state=True)["state"]
    m, v = st[:, :16], st[:, 16:32]
    assert np.all((v[:, 1] == 0) <= (m[:, 1] == 0))
    assert np.any(v[:, 1] == 0)
    t.push(keys, np.where(np.arange(16) == 1, 0, g).astype(np.float32))
    assert np.all(np.abs(t.pull(keys) - w0) < 0.1)  # two steps of lr 0.01, no blow-up


@pytest.mark.parametrize("opt", [SGD(0.1), FTRL(0.1)], ids=repr)
@pytest.mark.parametrize("storage", Q8)
def test_q8_refuses_rules_it_does_not_code(opt, storage):
    with pytest.raises(ValueError, match=f"{storage}.*{opt.kind}"):
        pyfleet.SparseTable(8, opt, storage=storage)


def trained(storage, opt, dim=20, n=500, seed=3):
    return trained_table(opt, dim, n, seed, storage=storage)


@pytest.mark.parametrize("storage", Q8)
@pytest.mark.parametrize("opt", Q8_OPTIMIZERS, ids=repr)
def test_q8_round_trip_is_bit_exact(tmp_path, storage, opt):
    t, ks = trained(storage, opt)
    t.save(tmp_path / "t.bin")
    u = pyfleet.SparseTable(20, opt, seed=3, storage=storage)
    assert u.load(tmp_path / "t.bin") == len(t)
    a, b = snapshot(t), snapshot(u)
    for f in a:
        np.testing.assert_array_equal(a[f], b[f])
    g = np.random.default_rng(9).normal(0, 1, (len(ks), 20)).astype(np.float32)
    t.push(ks, g)
    u.push(ks, g)
    np.testing.assert_array_equal(t.pull(ks), u.pull(ks))
    np.testing.assert_array_equal(snapshot(t)["state"], snapshot(u)["state"])


@pytest.mark.parametrize("src", ["fp32", "bf16", "fp16_q8", "bf16_q8"])
@pytest.mark.parametrize("dst", ["fp32", "fp16", "fp16_q8", "bf16_q8"])
@pytest.mark.parametrize("opt", Q8_OPTIMIZERS, ids=repr)
def test_load_converts_to_and_from_q8(tmp_path, src, dst, opt):
    """Into q8: weights to nearest, the state head coded to nearest (u = 1/2),
    Adam's beta powers derived from the loaded update count; out of q8: the
    decoded state, the derived beta powers."""
    if src == dst:
        return
    dim = 20
    t, ks = trained(src, opt, dim)
    t.save(tmp_path / "t.bin")
    u = pyfleet.SparseTable(dim, opt, seed=3, storage=dst)
    assert u.load(tmp_path / "t.bin") == len(t)
    a, b = snapshot(t), snapshot(u)
    for f in ("keys", "update_count", "show", "unseen_passes"):
        np.testing.assert_array_equal(a[f], b[f])
    wk = dst.split("_")[0]
    conv = (lambda x: x) if wk == "fp32" else (lambda x: nearest(wk, x))
    np.testing.assert_array_equal(b["weights"], conv(a["weights"]))
    h = head_size(opt, dim)
    for i in range(len(a["keys"])):
        if dst.endswith("_q8"):
            want_head = q8_round_trip(a["state"][i, :h], dim, signed_vectors(opt))
            want = with_tail(opt, want_head, int(a["update_count"][i]))
        else:
            sconv = (lambda x: x) if wk == "fp32" else (lambda x: nearest("bf16", x))
            want = np.concatenate([sconv(a["state"][i, :h]), a["state"][i, h:]])
        np.testing.assert_array_equal(b["state"][i], want)


@pytest.mark.parametrize("storage", Q8)
def test_q8_shrink_delta_and_admission(tmp_path, storage):
    opt = Adam(0.01)
    t = pyfleet.SparseTable(6, opt, seed=2, entry=CountFilterEntry(2), storage=storage)
    ks = np.arange(50, dtype=np.uint64)
    t.pull(ks)
    assert len(t) == 0
    t.pull(ks)
    assert len(t) == 50
    t.push(ks, np.ones((50, 6), np.float32))
    t.save(tmp_path / "full.bin")
    assert t.shrink() == 0
    t.push(ks[:10], np.ones((10, 6), np.float32))
    assert t.save(tmp_path / "delta.bin", delta=True) == 10
    assert t.shrink(max_unseen_passes=0) == 40
    u = pyfleet.SparseTable(6, opt, seed=2, storage=storage)
    u.load(tmp_path / "full.bin")
    u.load(tmp_path / "delta.bin")
    a = u.export(ks[:10], with_state=True)
    b = t.export(ks[:10], with_state=True)
    for f in ("weights", "state", "update_count"):
        np.testing.assert_array_equal(a[f], b[f])


def test_q8_rows_are_smaller():
    """Bytes held per row at dim 16 with Adam, index included: fp32 > fp16 >
    fp16_q8, and the q8 state column is 36 bytes a row (codes 32, scales 4)."""
    keys = np.arange(200_000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    per_row = {}
    for s in ("fp32", "fp16", "fp16_q8"):
        t = pyfleet.SparseTable(16, Adam(0.001), storage=s)
        t.pull(keys)
        per_row[s] = t.memory_bytes() / len(keys)
    assert per_row["fp16"] - per_row["fp16_q8"] == pytest.approx(72 - 36, abs=1.0)
    assert per_row["fp32"] > per_row["fp16"] > per_row["fp16_q8"]


def test_fluid_programs_take_q8_with_adam_and_refuse_it_with_sgd():
    from pyfleet import fluid
    from pyfleet.errors import ConfigError

    def tables(opt):
        return [c for c in fleet_table_configs(opt, sparse_storage="bf16_q8")
                if c["kind"] == "sparse"]

    sparse = tables(fluid.optimizer.Adam(0.01))
    assert sparse and all(c["storage"] == "bf16_q8" for c in sparse)
    with pytest.raises(ConfigError, match="bf16_q8.*SGD"):
        tables(fluid.optimizer.SGD(0.1))


@pytest.mark.parametrize("storage", Q8)
def test_q8_file_reshards(tmp_path, storage):
    """load(filter=(S, i)) of a q8 file: each of S tables gets its keys, their
    rows (weights, decoded state, counts) exactly as the saving table's."""
    opt = Adam(0.01)
    t, ks = trained(storage, opt)
    t.save(tmp_path / "t.bin")
    parts = [pyfleet.SparseTable(20, opt, seed=3, storage=storage) for _ in range(3)]
    assert sum(p.load(tmp_path / "t.bin", filter=(3, i)) for i, p in enumerate(parts)) == len(t)
    whole = snapshot(t)
    got = {}
    for p in parts:
        e = p.export(with_state=True)
        for i, k in enumerate(e["keys"].tolist()):
            got[k] = (e["weights"][i], e["state"][i], e["update_count"][i])
    for i, k in enumerate(whole["keys"].tolist()):
        np.testing.assert_array_equal(got[k][0], whole["weights"][i])
        np.testing.assert_array_equal(got[k][1], whole["state"][i])
        assert got[k][2] == whole["update_count"][i]


_TRAIN_Q8 = """
import sys, numpy as np, pyfleet
from pyfleet.optimizer import Adagrad, Adam
opt = eval(sys.argv[2])
rng = np.random.default_rng(5)
t = pyfleet.SparseTable(32, opt, seed=5, storage=sys.argv[1])
ks = rng.integers(0, 2**64, 300, dtype=np.uint64)
for step in range(4):
    t.pull(ks)
    g = rng.normal(0, 1, (len(ks), 32)) * 10.0 ** rng.uniform(-6, 1, (len(ks), 1))
    g[:, ::3] *= 1e-4
    t.push(ks, g.astype(np.float32))
e = t.export(with_state=True)
o = np.argsort(e["keys"])
sys.stdout.buffer.write(e["weights"][o].tobytes() + e["state"][o].tobytes())
"""


_PUSH_EDGES_Q8 = """
import sys, numpy as np, pyfleet
from pyfleet.optimizer import Adagrad, Adam
opt, dim = eval(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(dim)
t = pyfleet.SparseTable(dim, opt, seed=7, storage=sys.argv[1])
ks = np.arange(64, dtype=np.uint64)
for step in range(40):
    t.pull(ks)
    g = rng.normal(0, 1, (len(ks), dim)) * 10.0 ** rng.uniform(-8, 2, (len(ks), 1))
    g[::4, :16] = 0.0        # a block of zeros: scale 0 (codes 0) while m and v are 0
    g[1::4, 3] = 1e18        # the largest gradient accepted: v near 1e36, clamped codes
    g[2::4, ::2] *= 1e-12    # elements far below their block's largest: v codes 0
    t.push(ks, g.astype(np.float32))
e = t.export(with_state=True)
o = np.argsort(e["keys"])
sys.stdout.buffer.write(e["weights"][o].tobytes() + e["state"][o].tobytes())
"""


@pytest.mark.parametrize("storage", Q8)
@pytest.mark.parametrize("opt", Q8_OPTIMIZERS, ids=repr)
@pytest.mark.parametrize("dim", [16, 48])
def test_q8_push_edges_equal_in_the_avx2_and_sse2_forms(storage, opt, dim):
    """The q8 blocks' AVX2 and SSE2 coders (PYFLEET_NO_AVX2=1) give the same
    rows, bit for bit, through zero blocks, the largest gradients and v
    codes of 0."""
    runs = []
    for off in ("1", "0"):
        env = dict(os.environ, PYFLEET_NO_AVX2=off)
        out = subprocess.run([sys.executable, "-c", _PUSH_EDGES_Q8, storage, repr(opt), str(dim)],
                             env=env, capture_output=True, timeout=120, check=True)
        runs.append(out.stdout)
    assert len(runs[0]) == 64 * (dim + head_size(opt, dim) + (2 if opt.kind == "Adam" else 0)) * 4
    assert runs[0] == runs[1]


@pytest.mark.parametrize("storage", ["fp16", "bf16"] + Q8)
@pytest.mark.parametrize("opt", Q8_OPTIMIZERS, ids=repr)
def test_portable_row_codecs_equal_the_avx2_ones(storage, opt):
    """PYFLEET_NO_AVX2=1 runs the SSE2 forms of the 16-bit loads and stores
    and of the q8 blocks; without it the AVX2 forms run where the CPU has
    them: the same rows, bit for bit."""
    runs = []
    for off in ("1", "0"):
        env = dict(os.environ, PYFLEET_NO_AVX2=off)
        out = subprocess.run([sys.executable, "-c", _TRAIN_Q8, storage, repr(opt)], env=env,
                             capture_output=True, timeout=120, check=True)
        runs.append(out.stdout)
    assert len(runs[0]) > 300 * 32 * 4
    assert runs[0] == runs[1]
