"""Every bad input of `pyfleet train` and `pyfleet predict` is one line on stderr naming
the file (and line), with no traceback, and nothing is written."""

import gzip
import os
import random

import pytest
from support import DATA
from support.cli import pyfleet, save_small_model

from pyfleet import cli
from pyfleet.data import files as data_files

pytestmark = pytest.mark.slow

SAMPLE = DATA / "criteo-paddlerec-part0" / "part-0.tsv"
needs_data = pytest.mark.skipif(not SAMPLE.exists(), reason="shared Criteo sample missing")



def _lines():
    return SAMPLE.read_bytes().split(b"\n")[:60]


def _garbage(d):
    (d / "garbage.tsv").write_bytes(random.Random(3).randbytes(30000))
    return d / "garbage.tsv", r"garbage\.tsv:1: bad"


def _nul(d):
    (d / "nul.tsv").write_bytes(b"".join(x.replace(b"\t", b"\t\x00", 1) + b"\n"
                                         for x in _lines()))
    return d / "nul.tsv", r"nul\.tsv:1: bad"


def _huge(d):
    lines = _lines()
    (d / "huge.tsv").write_bytes(b"\n".join(lines[:30]) + b"\n" + b"7" * (3 << 20) + b"\n"
                                 + b"\n".join(lines[30:]))
    return d / "huge.tsv", r"huge\.tsv:31: a line longer than 1,048,576 bytes"


def _latin1_header(d):
    (d / "h.csv").write_bytes(b"label,I1,C1,Caf\xe9\n1,2,ab,cd\n")
    return d / "h.csv", r"h\.csv:1: the CSV header is not UTF-8"


def _empty(d):
    (d / "e").mkdir()
    (d / "e" / "part-0").write_bytes(b"")
    (d / "e" / "part-1").write_bytes(b"")
    return d / "e", r"no data line in .*e$"


def _truncated_gzip(d):
    data = gzip.compress(b"\n".join(_lines() * 400))
    (d / "t.tsv.gz").write_bytes(data[: len(data) * 2 // 3])
    return d / "t.tsv.gz", r"t\.tsv\.gz(:\d+)?: the gzip data ends early \(a truncated .gz file\)"


def _dangling(d):
    (d / "s").mkdir()
    (d / "s" / "part-0").write_bytes(b"\n".join(_lines()))
    os.symlink(d / "lost", d / "s" / "part-1")
    return d / "s", r"part-1: a dangling symbolic link"


def _fifo(d):
    (d / "f").mkdir()
    (d / "f" / "part-0").write_bytes(b"\n".join(_lines()))
    os.mkfifo(d / "f" / "part-1")
    return d / "f", r"part-1: a FIFO among the data files"


CASES = [_garbage, _nul, _huge, _latin1_header, _empty, _truncated_gzip, _dangling, _fifo]


def _one_line(r, pattern):
    assert r.returncode not in (0, None), r.stdout
    err = r.stderr.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    import re
    assert re.search(pattern, err), err
    return err


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_small_model(tmp_path_factory.mktemp("model") / "model", SAMPLE)


@needs_data
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__.strip("_"))
def test_train_refuses_bad_input_in_one_line_writing_nothing(tmp_path, case):
    path, pattern = case(tmp_path)
    fmt = ["--format", "csv"] if str(path).endswith(".csv") else []
    r = pyfleet("train", "--train", path, "--run-dir", tmp_path / "run", "--epochs", "1",
                *fmt, cwd=tmp_path)
    assert _one_line(r, pattern).startswith("pyfleet train: --train: ")
    assert not (tmp_path / "run").exists()


@needs_data
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__.strip("_"))
def test_predict_refuses_bad_input_in_one_line_writing_nothing(tmp_path, case, model):
    path, pattern = case(tmp_path)
    fmt = ["--format", "csv"] if str(path).endswith(".csv") else []
    r = pyfleet("predict", "--model", model, "--data", path, "--out", tmp_path / "p.txt",
                *fmt, cwd=tmp_path)
    assert _one_line(r, pattern).startswith("pyfleet predict: ")
    assert not (tmp_path / "p.txt").exists()


@needs_data
def test_crlf_lines_predict_as_lf_lines(tmp_path, model):
    lines = [x for x in _lines() if x]
    (tmp_path / "lf.tsv").write_bytes(b"\n".join(lines) + b"\n")
    (tmp_path / "crlf.tsv").write_bytes(b"\r\n".join(lines) + b"\r\n")
    for name in ("lf", "crlf"):
        r = pyfleet("predict", "--model", model, "--data", tmp_path / f"{name}.tsv",
                    "--out", tmp_path / f"{name}.txt", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    lf = (tmp_path / "lf.txt").read_text().split()
    assert len(lf) == len(lines) and (tmp_path / "crlf.txt").read_text().split() == lf


@needs_data
@pytest.mark.parametrize("command", ["train", "predict"])
def test_an_unreadable_shard_is_named(tmp_path, monkeypatch, capsys, command, model):
    """root reads any file whatever its mode: the open itself is made to fail."""
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "part-0").write_bytes(SAMPLE.read_bytes())
    (tmp_path / "s" / "part-1").write_bytes(SAMPLE.read_bytes())
    real = open

    def deny(path, *a, **k):
        if str(path).endswith("part-1"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(data_files, "open", deny, raising=False)
    if command == "train":
        argv = ["train", "--train", str(tmp_path / "s"), "--run-dir", str(tmp_path / "run")]
    else:
        argv = ["predict", "--model", str(model), "--data", str(tmp_path / "s"),
                "--out", str(tmp_path / "p.txt")]
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert str(e.value).endswith(f"{tmp_path / 's' / 'part-1'}: cannot read: Permission denied")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "run").exists() and not (tmp_path / "p.txt").exists()


def test_a_worker_that_cannot_read_its_data_ends_in_one_line(monkeypatch):
    """Inputs too big to read before the job starts: the worker's reader names the
    file and line in one line (its SystemExit), not a traceback."""
    from pyfleet.trainer import role as trainer  # where main looks up run_role

    def fail(job):
        raise data_files.DataError("/d/part-3:77: a line longer than 1,048,576 bytes")

    monkeypatch.setattr(trainer, "run_role", fail)
    monkeypatch.setattr(trainer, "_configure_logging", lambda level: None)
    monkeypatch.setenv("PYFLEET_ROLE", "worker")
    monkeypatch.setenv("PYFLEET_WORKER_INDEX", "1")
    job = os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml")
    monkeypatch.setattr(trainer.json, "load", lambda f: {})
    with pytest.raises(SystemExit) as e:
        trainer.main([job])
    assert str(e.value) == "pyfleet worker 1: /d/part-3:77: a line longer than 1,048,576 bytes"
