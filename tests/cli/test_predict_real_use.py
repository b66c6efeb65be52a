"""`pyfleet predict` for real use: unlabelled rows (Criteo's 39-field test
file, a CSV with an Id and no label), an id column carried through (a Kaggle-style
submission), standard input and output, and AUC / logloss for labelled rows."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import DATA
from support.cli import save_small_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TSV = DATA / "criteo-paddlerec-part0" / "part-0.tsv"
CSV = DATA / "criteo-kaggle-tiny" / "train.tiny.csv"
needs_data = pytest.mark.skipif(not (TSV.exists() and CSV.exists()),
                                reason="shared Criteo samples missing")


def pyfleet(*args, cwd, input=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "pyfleet.cli", *map(str, args)], cwd=cwd,
                          input=input, capture_output=True, timeout=timeout)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_small_model(tmp_path_factory.mktemp("model") / "model", CSV, format="csv",
                            batch_size=200, passes=3)


def _reference_auc(p, y):
    """Pairs (positive, negative) ranked right, ties one half: the definition."""
    pos, neg = p[y == 1], p[y == 0]
    diff = pos[:, None] - neg[None, :]
    return ((diff > 0).sum() + 0.5 * (diff == 0).sum()) / (len(pos) * len(neg))


@needs_data
def test_criteo_test_file_without_labels_predicts_as_the_labelled_rows(tmp_path, model):
    labelled = TSV.read_bytes().splitlines()
    unlabelled = [line.split(b"\t", 1)[1] for line in labelled]  # Criteo's test.txt: 39 fields
    assert all(line.count(b"\t") == 38 for line in unlabelled)
    (tmp_path / "test.txt").write_bytes(b"\n".join(unlabelled) + b"\n")
    r = pyfleet("predict", "--model", model, "--data", TSV, "--out", tmp_path / "a.txt",
                "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["labelled"] is True and summary["predictions"] == len(labelled)
    p = np.loadtxt(tmp_path / "a.txt")
    y = np.array([float(line.split(b"\t", 1)[0]) for line in labelled])
    assert summary["auc"] == pytest.approx(_reference_auc(p, y), abs=1e-9)
    ref_logloss = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    assert summary["logloss"] == pytest.approx(ref_logloss, rel=1e-6)
    r = pyfleet("predict", "--model", model, "--data", tmp_path / "test.txt",
                "--out", tmp_path / "b.txt", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert b"AUC" not in r.stderr  # no label: no metric
    assert (tmp_path / "b.txt").read_bytes() == (tmp_path / "a.txt").read_bytes()
    # without --json, a labelled file's metrics are reported on stderr
    r = pyfleet("predict", "--model", model, "--data", TSV, "--out", tmp_path / "c.txt",
                cwd=tmp_path)
    assert f"AUC {summary['auc']:.4f} logloss {summary['logloss']:.4f}".encode() in r.stderr


@needs_data
def test_kaggle_submission_carries_the_id_column_through(tmp_path, model):
    rows = [line.split(b",") for line in CSV.read_bytes().splitlines()]
    assert rows[0][:2] == [b"Id", b"Label"]
    test = tmp_path / "test.csv"  # Kaggle-style test file: Id, no label
    test.write_bytes(b"\r\n".join(b",".join([r[0]] + r[2:]) for r in rows) + b"\r\n")
    r = pyfleet("predict", "--model", model, "--data", test, "--id-column", "Id",
                "--out", tmp_path / "submission.csv", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = (tmp_path / "submission.csv").read_text().splitlines()
    assert out[0] == "Id,Predicted"
    assert [line.split(",")[0] for line in out[1:]] == [r[0].decode() for r in rows[1:]]
    probs = np.array([float(line.split(",")[1]) for line in out[1:]])
    assert ((probs > 0) & (probs < 1)).all()
    # the same rows with their labels predict the same, and give the metrics
    r = pyfleet("predict", "--model", model, "--data", CSV, "--out", tmp_path / "p.txt",
                "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert np.array_equal(np.loadtxt(tmp_path / "p.txt"), probs)
    y = np.array([float(r[1]) for r in rows[1:]])
    assert json.loads(r.stdout)["auc"] == pytest.approx(_reference_auc(probs, y), abs=1e-9)
    # a column that is not in the header, or a file with no header: refused by name
    r = pyfleet("predict", "--model", model, "--data", test, "--id-column", "RowId",
                "--out", tmp_path / "x.csv", cwd=tmp_path)
    assert r.returncode != 0 and b"no column 'RowId' for --id-column" in r.stderr
    r = pyfleet("predict", "--model", model, "--data", TSV, "--id-column", "Id",
                "--out", tmp_path / "x.csv", cwd=tmp_path)
    assert r.returncode != 0 and b"--id-column needs a CSV file with a header" in r.stderr
    assert not (tmp_path / "x.csv").exists()


@needs_data
def test_standard_input_and_output(tmp_path, model):
    data = CSV.read_bytes()
    r = pyfleet("predict", "--model", model, "--data", CSV, "--id-column", "Id",
                "--out", tmp_path / "file.csv", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = pyfleet("predict", "--model", model, "--data", "-", "--id-column", "Id",
                "--out", "-", cwd=tmp_path, input=data)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (tmp_path / "file.csv").read_bytes()  # the predictions alone
    assert b"to standard output" in r.stderr and b"AUC" in r.stderr
    r = pyfleet("predict", "--model", model, "--data", "-", "--out", "-", "--json",
                cwd=tmp_path, input=data)
    assert r.returncode != 0 and b"--json and --out - both write to stdout" in r.stderr


@needs_data
def test_a_bad_unlabelled_line_is_one_line_naming_file_and_line(tmp_path, model):
    lines = [line.split(b"\t", 1)[1] for line in TSV.read_bytes().splitlines()]
    lines[6] = b"\t".join(lines[6].split(b"\t")[:30])  # line 7 lost its last fields
    (tmp_path / "test.txt").write_bytes(b"\n".join(lines) + b"\n")
    r = pyfleet("predict", "--model", model, "--data", tmp_path / "test.txt",
                "--out", tmp_path / "p.txt", cwd=tmp_path)
    err = r.stderr.decode()
    assert r.returncode != 0 and err.count("\n") == 1, err
    assert f"{tmp_path / 'test.txt'}:7: malformed line (wrong field count)" in err
    assert not (tmp_path / "p.txt").exists()
    r = pyfleet("predict", "--model", model, "--data", "-", "--out", tmp_path / "p.txt",
                cwd=tmp_path, input=(tmp_path / "test.txt").read_bytes())
    assert "standard input:7: malformed line (wrong field count)" in r.stderr.decode()
    # training data must have labels: a 39-field file is refused before anything starts
    r = pyfleet("train", "--train", tmp_path / "test.txt", "--run-dir", tmp_path / "run",
                cwd=tmp_path)
    assert r.returncode != 0 and not (tmp_path / "run").exists()
    assert "39 fields, the unlabelled rows of Criteo's test file" in r.stderr.decode()


@needs_data
def test_ids_stay_with_their_rows_past_blank_and_skipped_lines(tmp_path, model):
    rows = [line.split(b",") for line in CSV.read_bytes().splitlines()][:40]
    lines = [b",".join([r[0]] + r[2:]) for r in rows]  # Id, no label
    lines.insert(4, b"")                              # a blank line (skipped, not malformed)
    lines[10] = lines[10].split(b",", 1)[0] + b",1,2"  # a malformed row: its id is dropped
    dropped = lines[10].split(b",", 1)[0]
    (tmp_path / "test.csv").write_bytes(b"\n".join(lines) + b"\n")
    r = pyfleet("predict", "--model", model, "--data", tmp_path / "test.csv", "--id-column",
                "Id", "--skip-malformed", "--out", tmp_path / "sub.csv", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert b"skipped 1 malformed line(s) (first: " in r.stderr
    out = [line.split(",") for line in (tmp_path / "sub.csv").read_text().splitlines()[1:]]
    expected = [r[0] for r in rows[1:] if r[0] != dropped]
    assert [i for i, _ in out] == [e.decode() for e in expected]
    # each id keeps the prediction its row gets in the clean file
    clean = [b",".join([r[0]] + r[2:]) for r in rows]
    (tmp_path / "clean.csv").write_bytes(b"\n".join(clean) + b"\n")
    r = pyfleet("predict", "--model", model, "--data", tmp_path / "clean.csv", "--id-column",
                "Id", "--out", tmp_path / "clean_sub.csv", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    by_id = dict(line.split(",") for line in
                 (tmp_path / "clean_sub.csv").read_text().splitlines()[1:])
    assert all(by_id[i] == p for i, p in out)


@needs_data
def test_a_model_without_checksums_is_scored_only_with_unchecked_model(tmp_path):
    fluid18 = Path(__file__).parents[1] / "fluid" / "data" / "fluid18_fc" / "separate"
    r = pyfleet("predict", "--model", fluid18, "--data", CSV, cwd=tmp_path)
    assert r.returncode != 0
    assert b"no checksums pyfleet can check" in r.stderr and b"--unchecked-model" in r.stderr
    # asked for: the model loads (Paddle's fc over one slot; this data has 26)
    r = pyfleet("predict", "--unchecked-model", "--model", fluid18, "--data", CSV,
                cwd=tmp_path)
    assert r.returncode != 0 and b"the model reads 1 sparse slots" in r.stderr, r.stderr
