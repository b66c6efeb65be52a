"""Damaged or hostile input files: a line length cap, no quadratic copying of a line
that spans blocks, non-regular files among the shards named, and truncated gzip
data as one DataError naming the file."""

import gzip
import io
import os
import zlib

import pytest

from pyfleet.data import DataError, Dataset, files, list_files

LINE = ("1\t" + "\t".join(["5"] * 13) + "\t" + "\t".join(["a1b2c3d4"] * 26) + "\n").encode()


def test_a_line_over_max_line_bytes_is_refused_with_file_and_line(tmp_path):
    p = tmp_path / "big.tsv"
    p.write_bytes(LINE * 3 + b"x" * 5000 + b"\n" + LINE)
    with pytest.raises(DataError, match=r"big\.tsv:4: a line longer than 4,096 bytes"):
        list(Dataset(str(p), max_line_bytes=4096, block_size=1 << 16))
    # across blocks (the line spans many small blocks) and at the end of a file
    with pytest.raises(DataError, match=r"big\.tsv:4: a line longer than 4,096"):
        list(Dataset(str(p), max_line_bytes=4096, block_size=300))
    p.write_bytes(LINE * 2 + b"y" * 5000)
    with pytest.raises(DataError, match=r"big\.tsv:3: a line longer"):
        list(Dataset(str(p), max_line_bytes=4096, block_size=1 << 20))
    # exactly the limit is accepted; 0 is no limit
    p.write_bytes(LINE + b"z" * 4096 + b"\n" + LINE)
    ds = Dataset(str(p), max_line_bytes=4096, block_size=500)
    assert sum(len(b) for b in ds) == 2 and ds.stats()["malformed"] == 1
    p.write_bytes(LINE + b"z" * 9000 + b"\n" + LINE)
    ds = Dataset(str(p), max_line_bytes=0, block_size=500)
    assert sum(len(b) for b in ds) == 2 and ds.stats()["malformed"] == 1
    with pytest.raises(ValueError, match="max_line_bytes"):
        Dataset(str(p), max_line_bytes=-1)


def test_a_huge_first_line_is_refused_when_the_dataset_is_made(tmp_path):
    p = tmp_path / "first.tsv"
    p.write_bytes(b"q" * 10000 + b"\n" + LINE)
    with pytest.raises(DataError, match=r"first\.tsv:1: a line longer than 8,192"):
        Dataset(str(p), max_line_bytes=8192)


class _Counting(io.RawIOBase):
    """A stream that counts the bytes read from it."""

    def __init__(self, inner):
        self.inner, self.read_bytes = inner, 0

    def readable(self):
        return True

    def read(self, n=-1):
        b = self.inner.read(n)
        self.read_bytes += len(b)
        return b

    def close(self):
        self.inner.close()


def test_a_gigabyte_line_in_a_small_gzip_stops_after_the_cap(tmp_path, monkeypatch):
    """The 4.6 MB gzip holding one 1 GiB line: refused after reading about the cap,
    not inflated and buffered whole."""
    p = tmp_path / "bomb.tsv.gz"
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"7" * (1 << 20)
    with open(p, "wb") as f:
        for _ in range(1024):
            f.write(comp.compress(chunk))
        f.write(comp.flush())
    assert os.path.getsize(p) < 2 << 20
    streams = []
    real = files.open_data

    def counting(path):
        f, raw = real(path)
        streams.append(_Counting(f))
        return streams[-1], raw

    monkeypatch.setattr(files, "open_data", counting)
    with pytest.raises(DataError, match=r"bomb\.tsv\.gz:1: a line longer than 1,048,576"):
        list(files.blocks(str(p), 1 << 16))
    assert streams[-1].read_bytes <= (1 << 20) + (1 << 17)


@pytest.mark.timeout(120)
def test_a_line_spanning_many_blocks_is_joined_once(tmp_path):
    """A 64 MiB line read in 4 KiB blocks: the pieces are joined once when the line
    ends (re-copying the growing line per block is ~500 GB of copying)."""
    p = tmp_path / "long.tsv"
    long = b"9" * (64 << 20)
    p.write_bytes(LINE + long + b"\n" + LINE)
    out = [bytes(b) for b in files.blocks(str(p), 4096, max_line=0)]
    assert b"".join(out) == LINE + long + b"\n" + LINE
    assert all(b.endswith(b"\n") for b in out)


def test_dangling_symlink_and_fifo_among_shards_are_named(tmp_path):
    d = tmp_path / "shards"
    d.mkdir()
    (d / "part-0").write_bytes(LINE)
    (d / "_SUCCESS").write_bytes(b"")
    (d / "sub").mkdir()  # not read recursively: skipped with a warning
    assert list_files(str(d)) == [str(d / "part-0")]
    os.symlink(tmp_path / "gone", d / "part-1")
    with pytest.raises(DataError, match=r"part-1: a dangling symbolic link"):
        Dataset(str(d))
    os.unlink(d / "part-1")
    os.mkfifo(d / "part-2")
    with pytest.raises(DataError, match=r"part-2: a FIFO among the data files"):
        Dataset(str(d))
    with pytest.raises(DataError, match=r"part-2: a FIFO"):
        list_files([str(d / "part-2")])


def test_truncated_and_damaged_gzip_name_the_file(tmp_path):
    p = tmp_path / "t.gz"
    data = gzip.compress(LINE * 20000)
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError) as e:
        list(Dataset(str(p)))
    assert str(e.value).startswith(f"{p}") and "truncated" in str(e.value)
    assert "\n" not in str(e.value)
    bad = bytearray(data)
    bad[20:40] = b"\xff" * 20
    p.write_bytes(bytes(bad))
    with pytest.raises(DataError, match=r"t\.gz(:\d+)?: damaged gzip data"):
        list(Dataset(str(p)))
