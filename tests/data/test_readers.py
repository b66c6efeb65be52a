"""Dataset on every format, checked against plain-Python reference parsers."""

import gzip
import math
import os
from pathlib import Path

import numpy as np
import pytest
from support import DATA

from pyfleet.data import Batch, Dataset, criteo_schema, feature_hash, parse_criteo_bytes

TSV = DATA / "criteo-paddlerec-part0" / "part-0.tsv"
DEEPCTR = DATA / "criteo-deepctr-sample" / "criteo_sample.txt"
KAGGLE = DATA / "criteo-kaggle-tiny" / "train.tiny.csv"
SLOT = DATA / "criteo-paddlerec-dnn-slot" / "sample_train.txt"
SLOT_NAMES = [str(i) for i in range(1, 27)]


def need(path):
    if not path.exists():
        pytest.skip(f"sample data missing: {path}")
    return path


# ---------------------------------------------------------------- reference parsers

def ref_dense(text, transform="log"):
    if text == "":
        return 0.0
    x = float(text)
    if transform == "log":
        return math.log1p(max(x, 0.0))
    return x


def ref_lines(path):
    data = Path(path).read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]


def ref_criteo(path, transform="log"):
    rows = []
    for line in ref_lines(path):
        f = line.split(b"\t")
        assert len(f) == 40
        rows.append((float(f[0]), [ref_dense(x.decode(), transform) for x in f[1:14]],
                     [[feature_hash(j, f[14 + j])] for j in range(26)]))
    return rows


def ref_csv(path, transform="log"):
    lines = ref_lines(path)
    names = lines[0].decode().split(",")
    lab = next(i for i, n in enumerate(names) if n.lower() == "label")
    dense_cols = sorted((int(n[1:]), i) for i, n in enumerate(names)
                        if n[0] == "I" and n[1:].isdigit())
    slot_cols = sorted((int(n[1:]), i) for i, n in enumerate(names)
                       if n[0] == "C" and n[1:].isdigit())
    rows = []
    for line in lines[1:]:
        f = line.split(b",")
        assert len(f) == len(names)
        rows.append((float(f[lab]), [ref_dense(f[i].decode(), transform) for _, i in dense_cols],
                     [[feature_hash(j, f[i])] for j, (_, i) in enumerate(slot_cols)]))
    return rows


def ref_slot(path, slots=SLOT_NAMES, transform="none"):
    rows = []
    for line in ref_lines(path):
        label, dense, ids = None, [], [[] for _ in slots]
        for tok in line.decode().split():
            name, value = tok.split(":")
            if name == "click":
                label = float(value)
            elif name == "dense_feature":
                dense.append(ref_dense(value, transform))
            elif name in slots:
                s = slots.index(name)
                ids[s].append(feature_hash(s, value.encode()))
        ids = [v if v else [feature_hash(s, b"")] for s, v in enumerate(ids)]
        rows.append((label, dense, ids))
    return rows


def collect(ds):
    """All batches of one pass, as rows shaped like the reference parsers' output."""
    rows = []
    for b in ds:
        assert isinstance(b, Batch) and len(b) <= ds.batch_size
        assert b.labels.dtype == np.float32 and b.dense.dtype == np.float32
        assert b.dense.shape == (len(b), ds.n_dense)
        assert len(b.sparse) == len(ds.slot_names) == len(b.slot_names)
        for ids, offsets in b.sparse:
            assert ids.dtype == np.uint64 and offsets.dtype == np.int64
            assert offsets.shape == (len(b) + 1,) and offsets[0] == 0
            assert offsets[-1] == ids.shape[0] and np.all(np.diff(offsets) >= 1)
        for i in range(len(b)):
            rows.append((float(b.labels[i]), b.dense[i].tolist(),
                         [ids[off[i]:off[i + 1]].tolist() for ids, off in b.sparse]))
    return rows


def assert_rows_equal(got, want):
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g[0] == w[0], k
        np.testing.assert_allclose(g[1], np.float32(w[1]), rtol=1e-6, atol=1e-7, err_msg=str(k))
        assert g[2] == w[2], k


# ---------------------------------------------------------------- the real samples

@pytest.mark.parametrize("batch_size", [7, 64, 1000])
def test_criteo_tsv_sample(batch_size):
    ds = Dataset(need(TSV), format="criteo", batch_size=batch_size)
    assert_rows_equal(collect(ds), ref_criteo(TSV))
    st = ds.stats()
    assert (st["lines"], st["examples"], st["malformed"]) == (100, 100, 0)
    assert ds.slot_names == criteo_schema().slot_names


def test_csv_deepctr_sample():
    ds = Dataset(need(DEEPCTR), format="csv", batch_size=33)
    assert ds.slot_names == tuple(f"C{i}" for i in range(1, 27))
    assert_rows_equal(collect(ds), ref_csv(DEEPCTR))
    assert ds.stats()["examples"] == 200


def test_csv_kaggle_crlf_sample():
    assert b"\r\n" in need(KAGGLE).read_bytes()[:2000]
    ds = Dataset(KAGGLE, format="csv", batch_size=128)
    assert ds.schema.columns[0] == "Id" and ds.n_dense == 13
    assert_rows_equal(collect(ds), ref_csv(KAGGLE))
    st = ds.stats()
    assert (st["examples"], st["malformed"], st["lines"]) == (1999, 0, 1999)


def test_slot_sample():
    ds = Dataset(need(SLOT), format="slot", batch_size=9)
    assert ds.slot_names == tuple(SLOT_NAMES) and ds.n_dense == 13
    assert_rows_equal(collect(ds), ref_slot(SLOT))


def test_slot_sample_with_log_transform():
    ds = Dataset(need(SLOT), format="slot", batch_size=80, dense_transform="log")
    assert_rows_equal(collect(ds), ref_slot(SLOT, transform="log"))


def test_auto_detects_every_sample():
    for path, fmt in [(TSV, "criteo"), (DEEPCTR, "csv"), (KAGGLE, "csv"), (SLOT, "slot")]:
        assert Dataset(need(path), format="auto").format == fmt


def test_same_value_same_id_across_formats(tmp_path):
    lines = ref_lines(need(DEEPCTR))[1:]
    tsv = tmp_path / "same.tsv"
    tsv.write_bytes(b"".join(ln.replace(b",", b"\t") + b"\n" for ln in lines))
    a = collect(Dataset(tsv, format="criteo", batch_size=50))
    b = collect(Dataset(DEEPCTR, format="csv", batch_size=50))
    assert_rows_equal(a, b)


# ---------------------------------------------------------------- files, gzip, sharding

def synthetic_lines(n, start=0):
    """Criteo lines whose I1 is the line number (a marker) and C1 its hex."""
    out = []
    for i in range(start, start + n):
        dense = [str(i)] + [str((i * 7 + k) % 11) if (i + k) % 5 else "" for k in range(12)]
        cats = [f"{i:08x}"] + [f"{(i * 31 + j) % 97:08x}" if (i + j) % 7 else "" for j in range(25)]
        out.append("\t".join([str(i % 2)] + dense + cats))
    return out


def write(path, lines, end="\n", final_newline=True):
    text = end.join(lines) + (end if final_newline and lines else "")
    Path(path).write_bytes(text.encode())
    return path


def markers(ds):
    got = []
    for b in ds:
        got.extend(b.dense[:, 0].astype(np.int64).tolist())
    return got


def test_gzip_detected_by_magic(tmp_path):
    plain = collect(Dataset(need(TSV), batch_size=10))
    gz = tmp_path / "part-0.txt"  # no .gz suffix: detection is by content
    gz.write_bytes(gzip.compress(TSV.read_bytes()))
    assert_rows_equal(collect(Dataset(gz, batch_size=10)), plain)
    gzcsv = tmp_path / "tiny.csv.gz"
    gzcsv.write_bytes(gzip.compress(need(KAGGLE).read_bytes()))
    assert_rows_equal(collect(Dataset(gzcsv, format="auto", batch_size=500)), ref_csv(KAGGLE))


def test_directory_and_file_list(tmp_path):
    lines = synthetic_lines(50)
    d = tmp_path / "shards"
    d.mkdir()
    for k in range(3):
        write(d / f"part-{k}", lines[k * 17:(k + 1) * 17])
    (d / "_SUCCESS").write_bytes(b"")
    (d / ".part-0.crc").write_bytes(b"junk\n")
    ds = Dataset(d, dense_transform="none", batch_size=8)
    assert [os.path.basename(f) for f in ds.files] == ["part-0", "part-1", "part-2"]
    assert markers(ds) == list(range(50))
    listed = Dataset([d / "part-2", str(d / "part-0"), d / "part-1", d / "part-0"],
                     dense_transform="none", batch_size=8)
    assert markers(listed) == list(range(50))
    with pytest.raises(FileNotFoundError):
        Dataset(tmp_path / "nope")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(ValueError, match="no data files"):
        Dataset(tmp_path / "empty_dir")


@pytest.mark.parametrize("n_files,workers", [(5, 2), (6, 3), (4, 4), (2, 3), (1, 4), (3, 5)])
def test_workers_cover_every_line_once(tmp_path, n_files, workers):
    lines = synthetic_lines(101)
    cuts = np.linspace(0, 101, n_files + 1).astype(int)
    for k in range(n_files):
        write(tmp_path / f"part-{k:02d}.tsv", lines[cuts[k]:cuts[k + 1]])
    seen = []
    for w in range(workers):
        ds = Dataset(tmp_path, worker_index=w, worker_num=workers, dense_transform="none",
                     batch_size=16)
        got = markers(ds)
        if n_files >= workers:
            assert ds.files == ds.all_files[w::workers]
        else:
            # Line sharding: data lines i::N counted over the sorted file list.
            assert got == list(range(w, 101, workers))
        assert ds.stats()["lines"] == len(got)
        seen.extend(got)
    assert sorted(seen) == list(range(101))


def test_line_sharding_skips_csv_headers(tmp_path):
    header = ",".join(["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)])
    lines = [ln.replace("\t", ",") for ln in synthetic_lines(20)]
    write(tmp_path / "a.csv", [header] + lines[:9])
    write(tmp_path / "b.csv", [header] + lines[9:])
    got = [markers(Dataset(tmp_path, format="csv", worker_index=w, worker_num=3,
                           dense_transform="none")) for w in range(3)]
    assert got == [list(range(w, 20, 3)) for w in range(3)]


def test_bad_worker_arguments(tmp_path):
    f = write(tmp_path / "a.tsv", synthetic_lines(3))
    for kw in [{"worker_index": 2, "worker_num": 2}, {"worker_index": -1, "worker_num": 2},
               {"worker_num": 0}, {"batch_size": 0}, {"format": "parquet"},
               {"dense_transform": "sqrt"}, {"dense_transform": "minmax"},
               {"dense_transform": "minmax", "dense_min": [0] * 12, "dense_max": [1] * 13}]:
        with pytest.raises(ValueError):
            Dataset(f, **kw)


# ---------------------------------------------------------------- batches and edge cases

@pytest.mark.parametrize("block_size", [1, 300, 4096, 1 << 23])
def test_batches_across_blocks_and_files(tmp_path, block_size):
    lines = synthetic_lines(100)
    write(tmp_path / "a.tsv", lines[:37])
    write(tmp_path / "b.tsv", lines[37:])
    ds = Dataset(tmp_path, batch_size=32, dense_transform="none", block_size=block_size)
    sizes = [len(b) for b in ds]
    assert sizes == [32, 32, 32, 4]
    assert markers(ds) == list(range(100))
    ds_drop = Dataset(tmp_path, batch_size=32, drop_last=True, block_size=block_size)
    assert [len(b) for b in ds_drop] == [32, 32, 32]
    assert_rows_equal(collect(Dataset(tmp_path, batch_size=32, block_size=block_size)),
                      collect(Dataset(tmp_path, batch_size=100)))


def test_empty_files(tmp_path):
    e = tmp_path / "empty.tsv"
    e.write_bytes(b"")
    ds = Dataset(e)
    assert list(ds) == [] and ds.stats()["examples"] == 0 and ds.stats()["files"] == 1
    ecsv = tmp_path / "empty.csv"
    ecsv.write_bytes(b"")
    with pytest.raises(ValueError, match="header"):
        Dataset(ecsv, format="csv")  # some file must name the columns
    d = tmp_path / "csvs"
    d.mkdir()
    (d / "a.csv").write_bytes(b"")  # an empty first shard does not hide the header
    (d / "b.csv").write_bytes(need(DEEPCTR).read_bytes())
    ds = Dataset(d, format="auto")
    assert ds.format == "csv" and sum(len(b) for b in ds) == 200
    d = tmp_path / "mixed"
    d.mkdir()
    (d / "a").write_bytes(b"")
    write(d / "b", synthetic_lines(5))
    (d / "c").write_bytes(b"\n\n")
    ds = Dataset(d, dense_transform="none")
    assert markers(ds) == list(range(5))
    assert ds.stats()["blank"] == 2 and ds.stats()["malformed"] == 0


def test_csv_with_header_only_and_empty(tmp_path):
    header = "label," + ",".join(f"I{i}" for i in range(1, 14)) + "," + ",".join(
        f"C{i}" for i in range(1, 27))
    only = tmp_path / "only.csv"
    only.write_bytes(header.encode() + b"\r\n")
    ds = Dataset(only, format="csv")
    assert list(ds) == [] and ds.stats()["lines"] == 0


@pytest.mark.parametrize("end", ["\n", "\r\n"])
def test_last_line_without_newline(tmp_path, end):
    lines = synthetic_lines(10)
    f = write(tmp_path / "x.tsv", lines, end=end, final_newline=False)
    for bs in (3, 10):
        for block in (64, 1 << 20):
            ds = Dataset(f, batch_size=bs, dense_transform="none", block_size=block)
            assert markers(ds) == list(range(10))
            assert ds.stats()["malformed"] == 0


def test_numbers_and_transforms(tmp_path):
    cats = "\t".join(["abc"] * 26)
    dense = ["260.0", "-2", "+5", "1e3", "2.5E-1", "007", "", "0", "12345678", ".5", "5.", "0.0",
             "99"]
    f = write(tmp_path / "n.tsv", ["1\t" + "\t".join(dense) + "\t" + cats])
    raw = [260.0, -2, 5, 1000, 0.25, 7, 0, 0, 12345678, 0.5, 5, 0, 99]
    b = next(iter(Dataset(f, dense_transform="none")))
    np.testing.assert_array_equal(b.dense[0], np.float32(raw))
    b = next(iter(Dataset(f)))
    np.testing.assert_allclose(b.dense[0], np.float32([math.log1p(max(x, 0)) for x in raw]),
                               rtol=1e-7)
    lo = np.array([0, -2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 99], dtype=np.float64)
    hi = np.array([520, 2, 10, 2000, 1, 14, 1, 1, 1e8, 1, 10, 1, 99], dtype=np.float64)
    b = next(iter(Dataset(f, dense_transform="minmax", dense_min=lo, dense_max=hi)))
    want = [(x - a) / (c - a) if c > a else 0.0 for x, a, c in zip(raw, lo, hi)]
    want[6] = 0.0  # a missing value is 0 whatever the transform
    np.testing.assert_allclose(b.dense[0], np.float32(want), rtol=1e-6)


def test_long_and_extreme_numbers(tmp_path):
    cats = "\t".join(["abc"] * 26)
    texts = ["12345678901234567890123", "0.000000000000000000000000012345", "1234567890",
             "000000000000000000000000000042", "-0", "3.14159265358979323846", "1E+2",
             "9999999999", "4095", "4096", "0.1", "65535", "2e-3"]
    f = write(tmp_path / "x.tsv", ["1\t" + "\t".join(texts) + "\t" + cats,
                                    "1\t1e400\t" + "\t".join(texts[1:]) + "\t" + cats])
    ds = Dataset(f, dense_transform="none")
    (b,) = list(ds)
    np.testing.assert_allclose(b.dense[0], np.float32([float(t) for t in texts]), rtol=1e-6)
    assert ds.stats()["first_malformed_reasons"] == ["bad dense value"]
    (b,) = list(Dataset(f))
    want = [math.log1p(max(float(t), 0.0)) for t in texts]
    np.testing.assert_allclose(b.dense[0], np.float32(want), rtol=1e-6)


def test_parse_criteo_bytes_equals_dataset():
    buf = need(TSV).read_bytes()
    r = parse_criteo_bytes(buf)
    rows = ref_criteo(TSV)
    assert r["ids"].shape == (100, 26) and r["examples"] == 100
    np.testing.assert_array_equal(r["labels"], [w[0] for w in rows])
    np.testing.assert_array_equal(r["ids"], np.array([[i[0] for i in w[2]] for w in rows],
                                                     dtype=np.uint64))
    np.testing.assert_array_equal(parse_criteo_bytes(memoryview(buf))["ids"], r["ids"])


def test_two_passes_reread_and_reset_stats(tmp_path):
    f = write(tmp_path / "a.tsv", synthetic_lines(30) + ["bad line"])
    ds = Dataset(f, batch_size=7, dense_transform="none")
    first = markers(ds)
    s1 = ds.stats()
    assert markers(ds) == first == list(range(30))
    assert ds.stats() == s1 and s1["malformed"] == 1


def test_shuffle_is_a_deterministic_permutation(tmp_path):
    for k in range(4):
        write(tmp_path / f"p{k}", synthetic_lines(40, start=40 * k))
    plain = markers(Dataset(tmp_path, dense_transform="none"))
    ds = Dataset(tmp_path, dense_transform="none", shuffle=True, seed=3, batch_size=16)
    p1, p2 = markers(ds), markers(ds)
    assert sorted(p1) == sorted(p2) == plain
    assert p1 != plain and p1 != p2  # a new order every pass
    again = Dataset(tmp_path, dense_transform="none", shuffle=True, seed=3, batch_size=16)
    assert markers(again) == p1
    other = Dataset(tmp_path, dense_transform="none", shuffle=True, seed=4, batch_size=16)
    assert markers(other) != p1


def test_set_pass_reads_that_pass_in_an_uninterrupted_runs_order(tmp_path):
    for k in range(3):
        write(tmp_path / f"p{k}", synthetic_lines(30, start=30 * k))
    kw = {"dense_transform": "none", "shuffle": True, "seed": 5, "batch_size": 8}
    ds = Dataset(tmp_path, **kw)
    passes = [markers(ds) for _ in range(3)]
    assert ds.passes == 3 and len({tuple(p) for p in passes}) == 3
    resumed = Dataset(tmp_path, **kw)
    resumed.set_pass(3)  # a job resumed after pass 2
    assert markers(resumed) == passes[2] and resumed.passes == 3
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="pass number"):
            resumed.set_pass(bad)


def test_shuffle_keeps_slot_rows_intact(tmp_path):
    ref = ref_slot(need(SLOT))
    ds = Dataset(SLOT, format="slot", shuffle=True, seed=1, batch_size=13)
    got = collect(ds)
    def key(r):
        return (r[0], tuple(np.float32(r[1]).tolist()), tuple(map(tuple, r[2])))
    assert sorted(map(key, got)) == sorted(map(key, ref))
    assert [r[2] for r in got] != [r[2] for r in ref]


# ---------------------------------------------------------------- slot format details

def test_slot_multi_ids_missing_and_unknown(tmp_path):
    lines = [
        "click:1 dense_feature:0.5 dense_feature:1 a:10 b:20 a:11 zz:5 a:12",
        "click:0 dense_feature:0 dense_feature:2 b:21",
        "  dense_feature:3 b:22 click:1 dense_feature:4 a:13  ",
    ]
    f = write(tmp_path / "s.txt", lines)
    assert Dataset(f, format="slot").slot_names == ("a", "b", "zz")  # from the first line
    ds = Dataset(f, format="slot", batch_size=10, slots=["a", "b"])
    assert ds.slot_names == ("a", "b") and ds.n_dense == 2
    (b,) = list(ds)
    h = feature_hash
    assert b.labels.tolist() == [1, 0, 1]
    np.testing.assert_array_equal(b.dense, np.float32([[0.5, 1], [0, 2], [3, 4]]))
    ids_a, off_a = b.sparse[0]
    assert off_a.tolist() == [0, 3, 4, 5]
    assert ids_a.tolist() == [h(0, b"10"), h(0, b"11"), h(0, b"12"), h(0, b""), h(0, b"13")]
    ids_b, off_b = b.sparse[1]
    assert off_b.tolist() == [0, 1, 2, 3]
    assert ids_b.tolist() == [h(1, b"20"), h(1, b"21"), h(1, b"22")]
    assert ds.stats()["ignored_tokens"] == 1
    with pytest.raises(ValueError, match="multi-id"):
        b.ids_matrix()
    explicit = Dataset(f, format="slot", slots=["b", "zz"])
    (b2,) = list(explicit)
    assert b2.sparse[1][0].tolist() == [h(1, b"5"), h(1, b""), h(1, b"")]


def test_ids_matrix_for_fixed_formats():
    b = next(iter(Dataset(need(TSV), batch_size=5)))
    m = b.ids_matrix()
    assert m.shape == (5, 26)
    np.testing.assert_array_equal(m[:, 3], b.sparse[3][0])


# ---------------------------------------------------------------- malformed lines

CRITEO_DAMAGE = [
    ("wrong field count", lambda f: f[:-1]),
    ("wrong field count", lambda f: f + ["extra"]),
    ("bad dense value", lambda f: f[:3] + ["abc"] + f[4:]),
    ("bad dense value", lambda f: f[:5] + ["1.2.3"] + f[6:]),
    ("bad dense value", lambda f: f[:2] + ["-"] + f[3:]),
    ("bad dense value", lambda f: f[:2] + ["1e"] + f[3:]),
    ("bad label", lambda f: ["2"] + f[1:]),
    ("bad label", lambda f: ["x"] + f[1:]),
    ("bad label", lambda f: [""] + f[1:]),
]


def damaged_file(path, good, damage, every=3):
    """Good lines with a damaged one after every `every`; returns the damaged line numbers."""
    out, bad = [], []
    for k, (reason, fn) in enumerate(damage):
        out.extend(good[k * every:(k + 1) * every])
        fields = good[k].split("\t")
        out.append("\t".join(fn(fields)))
        bad.append((len(out), reason))
    out.extend(good[len(damage) * every:])
    write(path, out)
    return bad


def test_malformed_criteo_lines_counted_with_line_numbers(tmp_path):
    good = synthetic_lines(40)
    f = tmp_path / "damaged.tsv"
    bad = damaged_file(f, good, CRITEO_DAMAGE)
    ds = Dataset(f, dense_transform="none", batch_size=8, max_reported=100)
    assert markers(ds) == list(range(40))
    st = ds.stats()
    assert st["malformed"] == len(CRITEO_DAMAGE)
    assert st["lines"] == 40 + len(CRITEO_DAMAGE)
    assert st["first_malformed"] == [(str(f), line) for line, _ in bad]
    assert st["first_malformed_reasons"] == [r for _, r in bad]
    assert st["malformed_by_reason"] == {"wrong field count": 2, "bad dense value": 4,
                                         "bad label": 3}
    limited = Dataset(f, max_reported=2)
    list(limited)
    assert len(limited.stats()["first_malformed"]) == 2


def test_malformed_csv_line_numbers_count_the_header(tmp_path):
    lines = need(KAGGLE).read_bytes().split(b"\r\n")
    lines[5] = lines[5].replace(b",", b";", 3)  # too few fields, at physical line 6
    f = tmp_path / "k.csv"
    f.write_bytes(b"\r\n".join(lines[:50]))
    ds = Dataset(f, format="csv")
    list(ds)
    assert ds.stats()["first_malformed"] == [(str(f), 6)]
    with pytest.raises(ValueError, match=r"k\.csv:6: malformed line"):
        list(Dataset(f, format="csv", strict=True))


SLOT_DAMAGE = [
    ("bad slot token", "click:1 dense_feature:1 dense_feature:2 a:1 b"),
    ("bad slot token", "click:1 dense_feature:1 dense_feature:2 a:x1"),
    ("bad slot token", "click:1 dense_feature:1 dense_feature:2 a:1:2"),
    ("bad slot token", "click:1 dense_feature:1 dense_feature:2 :3"),
    ("bad slot token", "click:1 dense_feature:1 dense_feature:2 a:"),
    ("bad label", "dense_feature:1 dense_feature:2 a:1"),
    ("bad label", "click:3 dense_feature:1 dense_feature:2 a:1"),
    ("bad label", "click:1 click:0 dense_feature:1 dense_feature:2 a:1"),
    ("wrong field count", "click:1 dense_feature:1 a:1"),
    ("wrong field count", "click:1 dense_feature:1 dense_feature:2 dense_feature:3 a:1"),
    ("bad dense value", "click:1 dense_feature:1 dense_feature:nan a:1"),
]


def test_malformed_slot_lines(tmp_path):
    good = [f"click:{i % 2} dense_feature:{i} dense_feature:0.5 a:{i} b:{i + 1}"
            for i in range(12)]
    out, bad = [], []
    for k, (reason, line) in enumerate(SLOT_DAMAGE):
        out.append(good[k])
        out.append(line)
        bad.append((len(out), reason))
    out.append(good[11])
    f = write(tmp_path / "s.txt", out)
    ds = Dataset(f, format="slot", slots=["a", "b"], max_reported=100)
    got = []
    for b in ds:
        got.extend(b.dense[:, 0].tolist())
    assert got == list(range(12))
    st = ds.stats()
    assert st["first_malformed"] == [(str(f), n) for n, _ in bad]
    assert st["first_malformed_reasons"] == [r for _, r in bad]
    with pytest.raises(ValueError, match=r"s\.txt:2: malformed line \(bad slot token\)"):
        list(Dataset(f, format="slot", slots=["a", "b"], strict=True))


def test_strict_names_file_and_line(tmp_path):
    good = synthetic_lines(10)
    write(tmp_path / "a.tsv", good[:5])
    f = tmp_path / "b.tsv"
    write(f, good[5:8] + ["1\t2\t3"] + good[8:])
    with pytest.raises(ValueError, match=r"b\.tsv:4: malformed line \(wrong field count\)"):
        list(Dataset(tmp_path, strict=True))
    ds = Dataset(tmp_path)
    assert sum(len(b) for b in ds) == 10 and ds.stats()["first_malformed"] == [(str(f), 4)]


def test_csv_header_problems(tmp_path):
    good = need(DEEPCTR).read_bytes()
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.csv").write_bytes(good)
    (d / "b.csv").write_bytes(good.replace(b"label,", b"click,", 1))
    with pytest.raises(ValueError, match="header"):
        list(Dataset(d, format="csv"))
    bad = tmp_path / "bad.csv"
    bad.write_bytes(good.replace(b"I3,", b"price,", 1))
    with pytest.raises(ValueError, match="price"):
        Dataset(bad, format="csv")
    nolabel = tmp_path / "nolabel.csv"
    nolabel.write_bytes(good.replace(b"label,", b"Id,", 1))
    with pytest.raises(ValueError, match="label"):
        Dataset(nolabel, format="csv")


def test_truncated_gzip_is_a_value_error(tmp_path):
    data = gzip.compress(need(TSV).read_bytes())
    f = tmp_path / "cut.gz"
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cut.gz"):
        list(Dataset(f))


# ---------------------------------------------------------------- prefetch, BOM

def test_prefetch_gives_the_same_batches_and_errors(tmp_path):
    import threading

    lines = synthetic_lines(200)
    write(tmp_path / "a.tsv", lines[:120])
    write(tmp_path / "b.tsv", lines[120:] + ["1\t2"])
    plain = Dataset(tmp_path, batch_size=16, block_size=500)
    ahead = Dataset(tmp_path, batch_size=16, block_size=500, prefetch=3)
    assert_rows_equal(collect(ahead), collect(plain))
    assert ahead.stats() == plain.stats() and ahead.stats()["malformed"] == 1
    with pytest.raises(ValueError, match=r"b\.tsv:81: malformed line"):
        list(Dataset(tmp_path, batch_size=16, strict=True, prefetch=2))
    it = iter(ahead)
    next(it)
    it.close()  # abandoning a pass stops its thread
    assert not [t for t in threading.enumerate() if t.name == "pyfleet-data-prefetch"]
    with pytest.raises(ValueError):
        Dataset(tmp_path, prefetch=-1)


def test_csv_with_byte_order_mark(tmp_path):
    f = tmp_path / "bom.csv"
    f.write_bytes(b"\xef\xbb\xbf" + need(DEEPCTR).read_bytes())
    assert_rows_equal(collect(Dataset(f, format="csv")), ref_csv(DEEPCTR))


def test_parsing_from_threads_matches_sequential(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    bufs = [("\n".join(synthetic_lines(3000, start=3000 * k)) + "\n").encode() for k in range(4)]
    want = [parse_criteo_bytes(b) for b in bufs]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(parse_criteo_bytes, bufs))
    for g, w in zip(got, want):
        assert g["examples"] == 3000
        for key in ("labels", "dense", "ids"):
            np.testing.assert_array_equal(g[key], w[key])
