"""Compact rows (storage="fp16"/"bf16": fp16 or bf16 weights, bf16 state)
against a plain numpy reference of compute-in-fp32-then-round-stochastically,
bit for bit; the rounding rule's
unbiasedness and determinism; save/load across storage types; shrink and
admission on compact tables."""

import numpy as np
import pytest
from support.hashing import mix64
from support.reference import init_state, update
from support.rounding import (
    bf16_stochastic,
    half_stochastic,
    nearest,
    round_bits,
    stochastic,
    summed_like_core,
    widen,
)
from support.tables import fleet_table_configs, snapshot, trained_table

import pyfleet
from pyfleet import _core
from pyfleet.entry import CountFilterEntry
from pyfleet.optimizer import FTRL, SGD, Adagrad, Adam, Momentum, RMSProp

COMPACT = ["fp16", "bf16"]
OPTIMIZERS = [
    SGD(learning_rate=0.1),
    Adagrad(learning_rate=0.05, epsilon=1e-6, initial_accumulator_value=0.1),
    Adam(learning_rate=0.01, beta1=0.9, beta2=0.999, epsilon=1e-8),
    FTRL(learning_rate=0.05, l1=0.01, l2=0.1, lr_power=-0.5),
    Momentum(learning_rate=0.05, momentum=0.9),
    Momentum(learning_rate=0.05, momentum=0.8, use_nesterov=True),
    RMSProp(learning_rate=0.01, rho=0.9, epsilon=1e-6, momentum=0.5),
    RMSProp(learning_rate=0.01, rho=0.95, epsilon=1e-4, momentum=0.0, centered=True),
]
def tail(opt):
    return 2 if opt.kind == "Adam" else 0


# ---- the rule itself ----

@pytest.mark.parametrize("kind", COMPACT)
def test_core_rounding_matches_numpy_rule(kind):
    rng = np.random.default_rng(5)
    v = np.concatenate([
        rng.normal(0, 1, 20000), rng.normal(0, 1e-5, 20000),  # fp16 subnormals among them
        rng.normal(0, 1e-9, 2000), [0.0, -0.0, 65504.0, 65519.0, 1e-30, -3e-8, 6.1e-5],
    ]).astype(np.float32)
    r = rng.integers(0, 2**16, v.size, dtype=np.uint16)
    ref = half_stochastic(v, r) if kind == "fp16" else bf16_stochastic(v, r)
    np.testing.assert_array_equal(_core.storage_round(_core.StorageKind.__members__[kind], v, r),
                                  ref)
    np.testing.assert_array_equal(
        _core.storage_widen(_core.StorageKind.__members__[kind], ref), widen(kind, ref))
    near = _core.storage_round(_core.StorageKind.__members__[kind], v[:-7])
    np.testing.assert_array_equal(widen(kind, near), nearest(kind, v[:-7]))


@pytest.mark.parametrize("kind", COMPACT)
def test_widening_every_16_bit_pattern(kind):
    """All 65536 codes (subnormals, Inf, NaN payloads), in 4-lane groups and
    the scalar remainder: numpy's own float16 widening for fp16."""
    sk = _core.StorageKind.__members__[kind]
    codes = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    for start in (0, 3):
        got = _core.storage_widen(sk, codes[start:])
        want = widen(kind, codes[start:])
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("kind", COMPACT)
def test_rounding_at_boundaries_matches_numpy_rule(kind):
    """Every class boundary of the rule (fp16 normal/subnormal/zero, ulp steps,
    saturation, Inf, NaN, fp32 subnormals) with the extreme random bits, at
    every position of a 4-lane group and in the scalar remainder."""
    sk = _core.StorageKind.__members__[kind]
    edges = np.array([
        0.0, -0.0, 2.0**-14, np.nextafter(np.float32(2.0**-14), np.float32(0)), 2.0**-24,
        2.0**-25, 2.0**-33, 2.0**-34, 3 * 2.0**-34, 1e-45, -1e-40, 1023 * 2.0**-24,
        1023.75 * 2.0**-24, 65504.0, 65519.0, 65520.0, -1e6, 3.3895314e38, -3.4e38,
        np.inf, -np.inf, np.nan, 1.0, 1.0 + 2.0**-11, -(1.0 + 2.0**-23),
    ], np.float32)
    edges = np.concatenate([edges, -edges, np.array([0x7FC00001, 0xFF800001], np.uint32)
                            .view(np.float32)])
    for rv in (0, 1, 0x7FFF, 0x8000, 0xFFFE, 0xFFFF):
        for shift in range(5):  # misalign the lanes
            v = np.concatenate([np.ones(shift, np.float32), edges])
            r = np.full(v.size, rv, np.uint16)
            ref = half_stochastic(v, r) if kind == "fp16" else bf16_stochastic(v, r)
            np.testing.assert_array_equal(_core.storage_round(sk, v, r), ref)
    with pytest.raises(ValueError, match="uint16"):
        _core.storage_round(sk, edges, np.zeros(edges.size, np.uint32))


@pytest.mark.parametrize("kind", COMPACT)
@pytest.mark.parametrize("x", [1.0 + 1 / 3 * 2**-10, 0.1, 3e-6, -7.3e-7, 123.456])
def test_stochastic_rounding_is_unbiased(kind, x):
    n = 200_000
    sk = _core.StorageKind.__members__[kind]
    v = np.full(n, x, np.float32)
    r = np.random.default_rng(1).integers(0, 2**16, n, dtype=np.uint16)
    got = _core.storage_widen(sk, _core.storage_round(sk, v, r)).astype(np.float64)
    lo, hi = got.min(), got.max()
    assert lo <= float(v[0]) <= hi
    # Only the two neighbours appear; their mean is the value, within 4 sigma.
    assert len(np.unique(got)) <= 2
    sigma = (hi - lo) / 2 / np.sqrt(n)
    assert abs(got.mean() - float(v[0])) <= 4 * sigma + 1e-12 * abs(x)
    if lo != hi:  # not representable: both directions happen
        assert 0 < np.mean(got == hi) < 1


@pytest.mark.parametrize("kind", COMPACT)
def test_small_updates_survive_on_average(kind):
    """SGD steps far below half an ulp: round to nearest would never move the
    weight; stochastic rounding moves it by the right amount on average."""
    n, steps, lr = 4000, 100, 1e-4
    t = pyfleet.SparseTable(1, SGD(learning_rate=lr), initializer=pyfleet.initializer.Constant(1.0),
                            storage=kind)
    keys = np.arange(n, dtype=np.uint64)
    t.pull(keys)
    g = np.ones((n, 1), np.float32)
    for _ in range(steps):
        t.push(keys, g)
    expected = 1.0 - steps * lr  # 0.99, while an ulp at 1 is 2^-10 (fp16) or 2^-7 (bf16)
    w = t.pull(keys)[:, 0].astype(np.float64)
    assert abs(w.mean() - expected) < 0.1 * steps * lr


@pytest.mark.parametrize("kind", COMPACT)
def test_same_seed_same_bits_other_seed_other_bits(kind):
    rng = np.random.default_rng(2)
    keys = rng.integers(0, 2**64, 500, dtype=np.uint64)
    grads = [rng.normal(0, 1, (500, 8)).astype(np.float32) for _ in range(5)]

    def run(seed):
        t = pyfleet.SparseTable(8, Adam(0.01), seed=seed, storage=kind)
        for g in grads:
            t.push(keys, g)
        return t.export(keys, with_state=True)

    a, b, c = run(1), run(1), run(2)
    for f in ("weights", "state"):
        np.testing.assert_array_equal(a[f], b[f])
    assert not np.array_equal(a["weights"], c["weights"])


# ---- every optimizer through the compact path ----

@pytest.mark.parametrize("kind", COMPACT)
@pytest.mark.parametrize("opt", OPTIMIZERS, ids=repr)
@pytest.mark.parametrize("dim", [1, 8, 19])
def test_compact_update_equals_numpy_reference(kind, opt, dim):
    rng = np.random.default_rng(dim)
    seed = 11
    table = pyfleet.SparseTable(dim, opt, seed=seed, storage=kind)
    pool = np.concatenate([np.array([0, 2**64 - 1], np.uint64),
                           rng.integers(0, 2**64, 40, dtype=np.uint64)])
    ref_w, ref_s, count = {}, {}, {}
    nt = tail(opt)
    for _step in range(25):
        n = int(rng.integers(1, 40))
        keys = rng.choice(pool, size=n)
        pulled = table.pull(keys)
        for i, k in enumerate(keys.tolist()):
            if k not in ref_w:
                raw = pyfleet.SparseTable(dim, opt, seed=seed).initial_values(
                    np.array([k], np.uint64))[0]
                ref_w[k] = nearest(kind, raw)
                s = init_state(opt, dim)
                s[:s.size - nt] = nearest("bf16", s[:s.size - nt])  # state: bf16
                ref_s[k], count[k] = s, 0
            np.testing.assert_array_equal(pulled[i], ref_w[k])
        grads = rng.normal(0, 1, (n, dim)).astype(np.float32)
        table.push(keys, grads)
        for k, g in summed_like_core(keys, grads).items():
            w, s = ref_w[k].copy(), ref_s[k].copy()
            update(opt, w, s, g)  # fp32
            head = s.size - nt
            r = round_bits(seed, k, count[k], dim + head)
            ref_w[k] = stochastic(kind, w, r[:dim])
            s[:head] = stochastic("bf16", s[:head], r[dim:])
            ref_s[k], count[k] = s, count[k] + 1
    e = table.export(with_state=True)
    assert len(e["keys"]) == len(ref_w)
    for i, k in enumerate(e["keys"].tolist()):
        np.testing.assert_array_equal(e["weights"][i], ref_w[k])
        np.testing.assert_array_equal(e["state"][i], ref_s[k])
        assert e["update_count"][i] == count[k]


@pytest.mark.parametrize("kind", COMPACT)
@pytest.mark.parametrize("reg", [{"type": "L2Decay", "regularization_coeff": 0.2},
                                 {"type": "L1Decay", "regularization_coeff": 0.01}],
                         ids=lambda r: r["type"])
def test_compact_regularized_update_equals_numpy_reference(kind, reg):
    """The decay is computed from the stored (16-bit) weights widened to fp32."""
    opt, dim, seed = Momentum(0.05, 0.9, use_nesterov=True), 5, 3
    table = pyfleet.SparseTable(dim, opt, seed=seed, storage=kind, regularizer=reg)
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 2**64, 6, dtype=np.uint64)
    ref_w = dict(zip(keys.tolist(), table.pull(keys).copy()))
    ref_s = {k: nearest("bf16", init_state(opt, dim)) for k in ref_w}  # state: bf16
    for step in range(6):
        grads = rng.normal(0, 1, (6, dim)).astype(np.float32)
        table.push(keys, grads)
        for i, k in enumerate(keys.tolist()):
            w, st = ref_w[k].copy(), ref_s[k].copy()
            update(opt, w, st, grads[i], reg)
            r = round_bits(seed, k, step, 2 * dim)
            ref_w[k], ref_s[k] = stochastic(kind, w, r[:dim]), stochastic("bf16", st, r[dim:])
    got = table.export(keys, with_state=True)
    for i, k in enumerate(got["keys"].tolist()):
        np.testing.assert_array_equal(got["weights"][i], ref_w[k])
        np.testing.assert_array_equal(got["state"][i], ref_s[k])


@pytest.mark.parametrize("kind", COMPACT)
def test_add_delta_rounds_with_the_same_rule(kind):
    seed, k = 4, 12345
    t = pyfleet.SparseTable(5, SGD(0.1), seed=seed, storage=kind)
    keys = np.array([k], np.uint64)
    w = t.pull(keys)[0]
    d = np.array([[1e-3, -2e-4, 3e-5, 0.5, -1.0]], np.float32)
    t.add(keys, d)
    ref = stochastic(kind, w + d[0], round_bits(seed, k, 0, 5))
    np.testing.assert_array_equal(t.pull(keys)[0], ref)


@pytest.mark.parametrize("kind", COMPACT)
def test_row_rounding_off_the_fast_lanes_equals_numpy_rule(kind):
    """Rows of 16 whose groups of eight hold a zero, fp16 subnormals or values
    past fp16's range (the groups the vector forms hand to the four-lane
    rule) round through a row as the rule says, and widen back exactly."""
    seed, dim = 4, 16
    t = pyfleet.SparseTable(dim, SGD(0.1), seed=seed, storage=kind)
    keys = np.arange(1, 9, dtype=np.uint64)
    w = t.pull(keys).copy()
    goal = w.copy()
    specials = np.array([0.0, 3e-6, -5e-8, 1e-9, 6.0e-5, 65519.0, 1e5, -7e-7], np.float32)
    for i in range(len(keys)):
        goal[i, (3 * i) % dim] = specials[i]
        goal[i, (3 * i + 9) % dim] = specials[(i + 3) % len(specials)]
    d = goal - w
    t.add(keys, d)
    got = t.pull(keys)
    for i, k in enumerate(keys.tolist()):
        ref = stochastic(kind, w[i] + d[i], round_bits(seed, k, 0, dim))
        np.testing.assert_array_equal(got[i].view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("kind", COMPACT)
@pytest.mark.parametrize("dim", [8, 16, 32, 64, 24])
def test_pulled_rows_with_zeros_subnormals_and_saturation_widen_exactly(kind, dim):
    """The pull's row copies (one per dim the pipeline unrolls, and the
    general one at 24) widen rows holding zeros of both signs, fp16
    subnormals and values past fp16's range bit for bit as the rule, beside
    rows left on the common path. (NaN and Inf reach a row only from a file;
    add and push refuse them.)"""
    seed = 6
    t = pyfleet.SparseTable(dim, SGD(0.1), seed=seed, storage=kind)
    keys = np.arange(1, 41, dtype=np.uint64)
    w = t.pull(keys).copy()
    specials = np.array([0.0, -0.0, 3e-6, -5e-8, 1e-9, 6.0e-5, -6.1e-5, 65519.0, -1e5],
                        np.float32)
    rng = np.random.default_rng(dim)
    d = np.zeros_like(w)
    for i in range(len(keys)):
        cols = rng.choice(dim, size=1 + i % 4, replace=False)
        goal = specials[rng.integers(0, len(specials), len(cols))]
        d[i, cols] = goal - w[i, cols]
    d[::5] = 0  # rows left alone: groups on the fast path beside the others
    t.add(keys, d)
    got = t.pull(keys)
    for i, k in enumerate(keys.tolist()):
        ref = stochastic(kind, w[i] + d[i], round_bits(seed, k, 0, dim))
        np.testing.assert_array_equal(got[i].view(np.uint32), ref.view(np.uint32))
    if kind == "fp16":  # some rows did hold subnormals
        assert ((got != 0) & (np.abs(got) < 6.1e-5)).any()


def _file_checksum(data):
    """table_io's checksum (hash.cc's Checksum) of a file's bytes before its
    trailer and the trailer's two counts."""
    m = (1 << 64) - 1
    p1, p2 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F

    def rotl(x, r):
        return ((x << r) | (x >> (64 - r))) & m

    lanes = [p1, p2, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63]
    whole = len(data) // 32 * 32
    words = np.frombuffer(data[:whole], np.uint64).reshape(-1, 4).tolist()
    for w in words:
        lanes = [rotl((a + b * p2) & m, 31) * p1 & m for a, b in zip(lanes, w)]
    h = (rotl(lanes[0], 1) + rotl(lanes[1], 7) + rotl(lanes[2], 12) + rotl(lanes[3], 18)) & m
    h ^= len(data) * p1 & m
    for i, c in enumerate(data[whole:]):
        h = (mix64(h ^ c) + i) & m
    return mix64(h)


@pytest.mark.parametrize("dim", [8, 16, 32, 24])
def test_pulled_fp16_nan_payloads_are_kept(tmp_path, dim):
    """NaN reaches a row only from a file: fp16 rows whose halves hold
    signalling and quiet NaNs with payloads, of both signs, in either group
    of eight of a 16-lane test, pull as the rule widens them (vcvtph2ps
    would quiet a signalling one), beside rows without a NaN."""
    t = pyfleet.SparseTable(dim, SGD(0.1), seed=3, storage="fp16")
    keys = np.arange(1, 7, dtype=np.uint64)
    w = t.pull(keys).copy()
    path = tmp_path / "t.bin"
    t.save(path)
    data = bytearray(path.read_bytes())
    nans = np.array([0x7c01, 0xfd55, 0x7d23, 0xfc01, 0x7e00, 0x7fff], np.uint16)  # 4 signalling
    codes = w.astype(np.float16).view(np.uint16)
    for i in range(len(keys) - 1):  # the last row keeps no NaN
        old = codes[i].tobytes()
        assert data.count(old) == 1
        codes[i, (5 * i + 3) % dim] = nans[i]
        if i % 2:
            codes[i, (5 * i + 11) % dim] = nans[(i + 2) % len(nans)]
        at = data.index(old)
        data[at:at + len(old)] = codes[i].tobytes()
    data[-16:-8] = _file_checksum(bytes(data[:-16])).to_bytes(8, "little")  # trailer's checksum
    path.write_bytes(bytes(data))
    u = pyfleet.SparseTable(dim, SGD(0.1), seed=3, storage="fp16")
    assert u.load(path) == len(keys)
    got = u.pull(keys, create=False)
    np.testing.assert_array_equal(got.view(np.uint32), widen("fp16", codes).view(np.uint32))
    assert np.isnan(got).any(axis=1).tolist() == [True] * 5 + [False]


# ---- persistence, conversion, policies ----

def trained(kind, opt=None, dim=6, n=2000, seed=0):
    t, ks = trained_table(opt, dim, n, seed, storage=kind)
    t.add_show_click(ks, np.ones(len(ks), np.float32), np.zeros(len(ks), np.float32))
    return t, ks


@pytest.mark.parametrize("kind", ["fp32"] + COMPACT)
@pytest.mark.parametrize("opt", [SGD(0.1), Adagrad(0.1), Adam(0.01), FTRL(0.1, l1=0.01),
                                 Momentum(0.05, 0.9), RMSProp(0.01, momentum=0.5,
                                                              centered=True)], ids=repr)
def test_round_trip_is_bit_exact_per_storage(tmp_path, kind, opt):
    t, ks = trained(kind, opt)
    path = tmp_path / "t.bin"
    assert t.save(path) == len(t)
    u = pyfleet.SparseTable(6, opt, seed=0, storage=kind)
    assert u.load(path) == len(t)
    a, b = snapshot(t), snapshot(u)
    for f in a:
        np.testing.assert_array_equal(a[f], b[f])
    # And training continues identically (same update counts, same streams).
    g = np.random.default_rng(9).normal(0, 1, (len(ks), 6)).astype(np.float32)
    t.push(ks, g)
    u.push(ks, g)
    np.testing.assert_array_equal(t.pull(ks), u.pull(ks))


@pytest.mark.parametrize("src", ["fp32"] + COMPACT)
@pytest.mark.parametrize("dst", ["fp32"] + COMPACT)
def test_load_converts_between_storage_types(tmp_path, src, dst):
    opt = Adam(0.01)
    t, ks = trained(src, opt)
    path = tmp_path / "t.bin"
    t.save(path)
    u = pyfleet.SparseTable(6, opt, seed=0, storage=dst)
    assert u.load(path) == len(t)
    a, b = snapshot(t), snapshot(u)
    np.testing.assert_array_equal(a["keys"], b["keys"])
    np.testing.assert_array_equal(a["update_count"], b["update_count"])
    np.testing.assert_array_equal(a["show"], b["show"])
    conv = (lambda x: x) if dst == "fp32" else (lambda x: nearest(dst, x))
    np.testing.assert_array_equal(b["weights"], conv(a["weights"]))
    head = a["state"].shape[1] - 2  # Adam's beta powers stay fp32
    sconv = (lambda x: x) if dst == "fp32" else (lambda x: nearest("bf16", x))  # bf16 state
    np.testing.assert_array_equal(b["state"][:, :head], sconv(a["state"][:, :head]))
    np.testing.assert_array_equal(b["state"][:, head:], a["state"][:, head:])


def test_a_file_without_storage_field_loads_as_fp32(tmp_path):
    """Files written before storage types have zeros where the field is: fp32."""
    t, ks = trained("fp32")
    path = tmp_path / "old.bin"
    t.save(path)
    with open(path, "rb") as f:
        header = f.read(64)
    assert header[52:64] == bytes(12)  # the old reserved bytes, storage = 0 (fp32)
    u = pyfleet.SparseTable(6, Adam(0.01), seed=0, storage="bf16")
    u.load(path)
    np.testing.assert_array_equal(snapshot(u)["weights"], nearest("bf16", snapshot(t)["weights"]))


def test_compact_file_is_smaller_and_reshards(tmp_path):
    t32, ks = trained("fp32")
    t16, _ = trained("fp16")
    p32, p16 = tmp_path / "a.bin", tmp_path / "b.bin"
    t32.save(p32)
    t16.save(p16)
    assert p16.stat().st_size < 0.7 * p32.stat().st_size
    parts = [pyfleet.SparseTable(6, Adam(0.01), seed=0, storage="fp16") for _ in range(3)]
    loaded = sum(p.load(p16, filter=(3, i)) for i, p in enumerate(parts))
    assert loaded == len(t16)
    whole = snapshot(t16)
    got = {}
    for p in parts:
        e = p.export()
        got.update(zip(e["keys"].tolist(), e["weights"]))
    for i, k in enumerate(whole["keys"].tolist()):
        np.testing.assert_array_equal(got[k], whole["weights"][i])


@pytest.mark.parametrize("kind", COMPACT)
def test_delta_save_and_shrink(tmp_path, kind):
    t, ks = trained(kind)
    t.save(tmp_path / "full.bin")
    assert t.shrink() == 0  # ends the training pass
    t.push(ks[:10], np.ones((10, 6), np.float32))
    assert t.save(tmp_path / "delta.bin", delta=True) == 10
    # Only the first ten were pushed in this pass: the others are dropped.
    assert t.shrink(max_unseen_passes=0) == len(ks) - 10
    assert sorted(t.keys().tolist()) == sorted(ks[:10].tolist())
    u = pyfleet.SparseTable(6, Adam(0.01), seed=0, storage=kind)
    u.load(tmp_path / "full.bin")
    u.load(tmp_path / "delta.bin")
    np.testing.assert_array_equal(u.pull(ks[:10], create=False), t.pull(ks[:10], create=False))


@pytest.mark.parametrize("kind", COMPACT)
def test_admission_on_compact_table(kind):
    t = pyfleet.SparseTable(4, Adagrad(0.1), seed=3, entry=CountFilterEntry(3), storage=kind)
    k = np.array([77], np.uint64)
    init = t.initial_values(k)
    np.testing.assert_array_equal(init, nearest(kind, pyfleet.SparseTable(4, Adagrad(0.1), seed=3)
                                                .initial_values(k)))
    for _ in range(2):
        np.testing.assert_array_equal(t.pull(k), init)
        assert len(t) == 0
    np.testing.assert_array_equal(t.pull(k), init)
    assert len(t) == 1
    np.testing.assert_array_equal(t.pull(k, create=False), init)


def test_unknown_storage_is_refused_by_name():
    with pytest.raises(ValueError, match="fp8"):
        pyfleet.SparseTable(4, SGD(0.1), storage="fp8")
    cfg = pyfleet.SparseTable(4, SGD(0.1), storage="bf16").config()
    assert cfg["storage"] == "bf16"
    assert pyfleet.SparseTable.from_config(cfg).storage == "bf16"
    old = {k: v for k, v in cfg.items() if k != "storage"}
    assert pyfleet.SparseTable.from_config(old).storage == "fp32"
    with pytest.raises(ValueError, match="fp8"):
        pyfleet.SparseTable.from_config(dict(cfg, storage="fp8"))


# ---- configs: an omitted storage is fp32 ----

def test_config_without_storage_equals_fp32_on_a_server():
    """A server re-creating a table (a restarted worker) compares configs: one
    written before storage types, without the key, is the same table as
    "fp32"; "fp16" is a different one and is refused."""
    import threading

    from pyfleet.service.registry import Registry

    base = {"kind": "sparse", "name": "emb",
            **pyfleet.SparseTable(4, Adam(0.01), seed=3, name="emb").config()}
    assert base.pop("storage") == "fp32"
    reg = Registry(0, 1, 1 << 20, threading.Lock())
    ids = reg.create_tables([base])
    assert reg.create_tables([{**base, "storage": "fp32"}]) == ids
    assert reg.create_tables([dict(base)]) == ids
    with pytest.raises(ValueError, match="different config"):
        reg.create_tables([{**base, "storage": "fp16"}])
    assert reg.entries[ids["emb"]].table.storage == "fp32"

    reg2 = Registry(0, 1, 1 << 20, threading.Lock())
    ids2 = reg2.create_tables([{**base, "storage": "fp32"}])
    assert reg2.create_tables([base]) == ids2
    full = pyfleet.SparseTable.full_config(base)
    assert full["storage"] == "fp32" and pyfleet.SparseTable.full_config(full) == full
    assert pyfleet.SparseTable.full_config({**base, "storage": "bf16"})["storage"] == "bf16"


def test_fluid_programs_choose_the_storage_of_their_sparse_tables():
    """fleet.distributed_optimizer(..., sparse_storage=) reaches every sparse
    table's config (what servers build and checkpoints record); dense
    parameters have no storage; an unknown one is refused by name."""
    from pyfleet import fluid
    from pyfleet.distributed.fleet import Fleet

    for kw, want in (({}, "fp32"), ({"sparse_storage": "bf16"}, "bf16")):
        cfgs = fleet_table_configs(**kw)
        sparse = [c for c in cfgs if c["kind"] == "sparse"]
        assert sparse and all(c["storage"] == want for c in sparse)
        assert all("storage" not in c for c in cfgs if c["kind"] == "dense")
        assert pyfleet.SparseTable.from_config(
            {k: v for k, v in sparse[0].items() if k != "kind"}).storage == want
    with pytest.raises(ValueError, match="sparse_storage.*'int8'"):
        Fleet().distributed_optimizer(fluid.optimizer.SGD(0.1), sparse_storage="int8")


# ---- fp16 files written when fp16 rows kept fp16 state ----

def test_fp16_file_with_fp16_state_loads_with_its_meaning():
    """tests/table/data/fp16_state_fp16.bin was saved by an fp16 table whose
    state was fp16 (before fp16 rows kept bf16 state; its header lacks the
    bf16-state flag), with its export beside it. Loaded into fp16 now, the
    weights are the file's and the state is the file's rounded to bf16."""
    from support import REPO

    data = REPO / "tests" / "table" / "data"
    want = np.load(data / "fp16_state_fp16.npz")
    t = pyfleet.SparseTable(4, Adam(learning_rate=0.01), seed=5, storage="fp16")
    assert t.load(data / "fp16_state_fp16.bin") == len(want["keys"])
    got = snapshot(t)
    np.testing.assert_array_equal(got["keys"], want["keys"])
    np.testing.assert_array_equal(got["weights"], want["weights"])
    np.testing.assert_array_equal(got["update_count"], want["update_count"])
    np.testing.assert_array_equal(got["state"][:, :8], nearest("bf16", want["state"][:, :8]))
    np.testing.assert_array_equal(got["state"][:, 8:], want["state"][:, 8:])
    # Some of its v are fp16 subnormals or 0: the reason for bf16 state.
    assert np.any(want["state"][:, 4:8] < 6.1e-5)
    u = pyfleet.SparseTable(4, Adam(learning_rate=0.01), seed=5, storage="fp32")
    u.load(data / "fp16_state_fp16.bin")  # widened exactly
    np.testing.assert_array_equal(snapshot(u)["state"], want["state"])
