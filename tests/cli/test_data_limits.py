"""`pyfleet train --max-malformed N` (said at the first bad line; more than N stops the
job, naming the line), `--max-line-bytes` (the long-line error names the flag that
raises the limit), and `--format` given a file of another format naming the one it
looks like."""

from pathlib import Path

import pytest
from support.cli import pyfleet

from pyfleet.data import synthetic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SMALL = ["--layers", "8", "--embedding-dim", 4, "--workers", 1]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("limits")
    info = synthetic.generate(d / "gen", rows=3000, seed=2)
    lines = Path(info["train"]).read_bytes().split(b"\n")[:-1]
    bad = list(lines)
    for at in (100, 700, 1500):  # 3 malformed lines
        bad[at] = b"x\tnot a row"
    (d / "bad.tsv").write_bytes(b"\n".join(bad) + b"\n")
    huge = lines[:50] + [b"1" + b"\t7" * (1 << 20)] + lines[50:]  # a 2 MiB line, line 51
    (d / "huge.tsv").write_bytes(b"\n".join(huge) + b"\n")
    return d, info


def test_malformed_lines_are_said_at_the_first_and_limited(data, tmp_path):
    d, info = data
    r = pyfleet("train", "--train", d / "bad.tsv", *SMALL, "--run-dir", tmp_path / "a",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"{d / 'bad.tsv'}:101: malformed line" in r.stderr  # when read, not only at the end
    r = pyfleet("train", "--train", d / "bad.tsv", *SMALL, "--max-malformed", 3,
                "--run-dir", tmp_path / "b", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    r = pyfleet("train", "--train", d / "bad.tsv", *SMALL, "--max-malformed", 1,
                "--run-dir", tmp_path / "c", cwd=tmp_path)
    assert r.returncode != 0
    assert f"{d / 'bad.tsv'}:701: malformed line" in r.stderr
    assert "more than the 1 allowed" in r.stderr and "--max-malformed" in r.stderr
    r = pyfleet("train", "--train", d / "bad.tsv", *SMALL, "--max-malformed", -1,
                "--run-dir", tmp_path / "d", cwd=tmp_path)
    assert r.returncode != 0 and "--max-malformed must be >= 0" in r.stderr
    assert not (tmp_path / "d").exists()


def test_a_long_line_names_the_flag_that_raises_the_limit(data, tmp_path):
    d, _ = data
    r = pyfleet("train", "--train", d / "huge.tsv", *SMALL, "--run-dir", tmp_path / "a",
                cwd=tmp_path)
    assert r.returncode != 0
    assert f"{d / 'huge.tsv'}:51: a line longer than 1,048,576 bytes" in r.stderr
    assert "pyfleet train --max-line-bytes" in r.stderr
    assert not (tmp_path / "a").exists()  # refused before anything started
    r = pyfleet("train", "--train", d / "huge.tsv", *SMALL, "--max-line-bytes", "4M",
                "--run-dir", tmp_path / "b", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]  # read; the long line is one malformed line
    assert f"{d / 'huge.tsv'}:51: malformed line" in r.stderr


def test_a_format_given_that_the_file_is_not_names_the_one_it_looks_like(data, tmp_path):
    d, _ = data
    csv = tmp_path / "data.csv"
    csv.write_text("click,i1,c1\n" + "".join(f"{i % 2},{i},a{i % 7}\n" for i in range(50)))
    r = pyfleet("train", "--train", csv, "--format", "criteo", *SMALL, "--run-dir",
                tmp_path / "run", cwd=tmp_path)
    assert r.returncode != 0
    assert "it looks like csv: pass --format csv (or --format auto)" in r.stderr
    assert "or pass --format\n" not in r.stderr + "\n"
