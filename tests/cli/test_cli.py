"""The `pyfleet` command line: the main job end to end on a small generated data set."""

import json
import os

import pytest
from support import DATA
from support.cli import pyfleet

pytestmark = pytest.mark.slow



def test_train_writes_a_complete_run_directory(tmp_path):
    run = tmp_path / "run"
    r = pyfleet("train", "--rows", "12000", "--run-dir", str(run), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary == json.loads((run / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["servers"] == 1
    assert summary["train_examples"] == 12000 - 1200  # every training row, once
    assert summary["test_examples"] == 1200
    assert 0.5 < summary["test_auc"] <= summary["truth_auc_test"] + 0.02
    assert 0 < summary["test_logloss"] < 1.0
    assert summary["table_rows"]["SparseFeatFactors"] > 1000
    # evaluation on the test rows made no table rows: the tables hold what the
    # checkpoint after the last pass holds
    manifest = json.loads((run / "checkpoint" / "MANIFEST.json").read_text())
    assert manifest["chain"][-1]["rows"]["SparseFeatFactors"] == \
        summary["table_rows"]["SparseFeatFactors"]
    assert (run / "checkpoint" / "MANIFEST.json").exists()
    assert (run / "metrics.jsonl").read_text().strip()
    for name in ("job.json", "logs/worker.0.log", "logs/server.0.log"):
        assert (run / name).exists(), name


def test_train_prints_a_labelled_summary(tmp_path):
    r = pyfleet("train", "--rows", "6000", "--workers", "1", "--mode", "sync", "--model", "lr",
                "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for label in ("test AUC", "test logloss", "train examples/s", "rows in SparseFeatFactors",
                  "server 0 memory (RSS)"):
        assert label in r.stdout, label


def test_gen_data_is_deterministic(tmp_path):
    for d in ("a", "b"):
        r = pyfleet("gen-data", "--rows", "2000", "--out", str(tmp_path / d), "--seed", "3",
                    cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    for f in ("train.tsv", "test.tsv"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    info = json.loads((tmp_path / "a" / "truth.json").read_text())
    assert info["truth_auc_test"] > 0.6


def test_bad_arguments_are_named(tmp_path):
    r = pyfleet("train", "--servers", "0", cwd=tmp_path)
    assert r.returncode != 0 and "--servers" in r.stderr
    r = pyfleet("train", "--train", str(tmp_path / "nope.tsv"), cwd=tmp_path)
    assert r.returncode != 0 and "nope.tsv" in r.stderr
    r = pyfleet("train", "--resume", str(tmp_path), cwd=tmp_path)
    assert r.returncode != 0 and "checkpoint" in r.stderr
    for flag, value in (("--epochs", "0"), ("--batch-size", "0"), ("--embedding-dim", "-1"),
                        ("--lr", "0"), ("--lr", "nan"), ("--layers", "16,x"),
                        ("--layers", "0")):
        r = pyfleet("train", flag, value, cwd=tmp_path)
        assert r.returncode != 0 and f"pyfleet train: {flag} must" in r.stderr, (flag, r.stderr)
    for args, says in ((("gen-data", "--rows", "-5", "--out", "g"), "rows must be"),
                       (("gen-data", "--test-fraction", "1.5", "--out", "g"), "test_fraction"),
                       (("train", "--rows", "-5"), "--rows must be >= 1")):
        r = pyfleet(*args, cwd=tmp_path)
        assert r.returncode == 1 and says in r.stderr and "Traceback" not in r.stderr, args
    assert os.listdir(tmp_path) == []  # refused before anything was written
    (tmp_path / "f").write_text("")
    r = pyfleet("train", "--run-dir", str(tmp_path / "f" / "run"), cwd=tmp_path)
    assert r.returncode == 1 and "--run-dir: cannot create" in r.stderr
    r = pyfleet("gen-data", "--out", "f", cwd=tmp_path)
    assert r.returncode == 1 and "'f' is a file" in r.stderr and "Traceback" not in r.stderr


def test_no_command_prints_help(tmp_path):
    r = pyfleet(cwd=tmp_path)
    assert r.returncode == 2 and "train" in r.stdout
    assert os.listdir(tmp_path) == []


def test_training_data_with_no_valid_line_is_an_error_naming_the_first(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("x\ty\n" + "1\t" * 3 + "\n")
    r = pyfleet("train", "--train", str(bad), "--workers", "1", "--run-dir",
                str(tmp_path / "run"), cwd=tmp_path, timeout=120)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    # refused from its first lines, before any process starts or anything is written
    assert f"none of the first 2 lines of {bad} reads as criteo ({bad}:1: bad label)" \
        in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()


SLOT_SAMPLE = os.path.join(DATA,
                           "criteo-paddlerec-dnn-slot", "sample_train.txt")


def test_test_data_problems_are_named(tmp_path):
    r = pyfleet("gen-data", "--rows", "2000", "--out", str(tmp_path / "g"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    train = str(tmp_path / "g" / "train.tsv")
    r = pyfleet("train", "--rows", "2000", "--test", train, cwd=tmp_path)
    assert r.returncode != 0 and "--test needs --train" in r.stderr
    # a slot file beside Criteo training data
    r = pyfleet("train", "--train", train, "--test", SLOT_SAMPLE, "--format", "auto",
                cwd=tmp_path)
    assert r.returncode != 0 and "it looks like slot, --train like criteo" in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists()  # refused before anything was written
    bad = tmp_path / "bad.tsv"
    bad.write_text("garbage\nmore garbage\n")
    r = pyfleet("train", "--train", train, "--test", str(bad), "--workers", "1",
                "--format", "criteo", "--run-dir", str(tmp_path / "run"), cwd=tmp_path,
                timeout=120)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert (f"--test: none of the first 2 lines of {bad} reads as criteo ({bad}:1: bad label)"
            in r.stderr), r.stderr
    assert not (tmp_path / "run").exists()  # refused before any process started


def test_train_with_fp16_storage_trains_and_checkpoints_fp16(tmp_path):
    """--storage fp16: the sparse table is created, trained and checkpointed
    in fp16 (the manifest's config says so, and its file is the compact one:
    an fp32 copy of the same rows is larger); the dense parameters stay fp32."""
    import numpy as np

    from pyfleet import SparseTable

    run = tmp_path / "run"
    r = pyfleet("train", "--rows", "6000", "--workers", "1", "--mode", "sync", "--storage",
                "fp16", "--run-dir", str(run), "--json", cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    # 6,000 rows train little (their AUC is near 0.5 either way): this test is about
    # where the rows live; bench_train/bench_storage measure fp16's accuracy.
    assert 0 <= summary["test_auc"] <= 1 and 0 < summary["test_logloss"] < 1.0
    manifest = json.loads((run / "checkpoint" / "MANIFEST.json").read_text())
    sparse = [t for t in manifest["tables"] if t["kind"] == "sparse"]
    assert [t["storage"] for t in sparse] == ["fp16"]
    assert all("storage" not in t for t in manifest["tables"] if t["kind"] == "dense")
    cfg = {k: v for k, v in sparse[0].items() if k != "kind"}
    (shard,) = (run / "checkpoint").glob(f"*/{cfg['name']}.shard0-of-1.bin")
    t16 = SparseTable.from_config(cfg)
    t16.load(str(shard))
    assert len(t16) == summary["table_rows"][cfg["name"]]
    t32 = SparseTable.from_config({**cfg, "storage": "fp32"})
    t32.load(str(shard))  # converts
    t32.save(str(tmp_path / "fp32.bin"))
    assert shard.stat().st_size < 0.7 * (tmp_path / "fp32.bin").stat().st_size
    keys = t16.export()["keys"][:100]
    np.testing.assert_array_equal(t16.pull(keys, create=False), t32.pull(keys, create=False))


def test_train_refuses_an_unknown_storage(tmp_path):
    r = pyfleet("train", "--storage", "int8", "--rows", "2000", cwd=tmp_path, timeout=60)
    assert r.returncode != 0 and "--storage" in r.stderr and "int8" in r.stderr
    r = pyfleet("train", "--storage", "bf16_q8", "--optimizer", "ftrl", "--rows", "2000",
                cwd=tmp_path, timeout=60)
    assert r.returncode != 0 and "--storage bf16_q8" in r.stderr and "ftrl" in r.stderr


def test_train_with_a_disk_tier_matches_all_in_ram(tmp_path):
    """--memory-budget/--spill-dir: a sync run of one worker with nearly every
    row beyond the budget reaches the same test AUC and logloss as the
    all-in-RAM run (the disk tier moves rows, never changes them); the
    servers got the options (the manifest's config) and left no file. The
    summary reports each server's rows on disk, table RAM and peak RSS;
    --no-model leaves the inference model out; --request-timeout reaches the job."""
    runs = {}
    spill = tmp_path / "spill"
    for name, extra in (("ram", []), ("disk", ["--memory-budget", "300K", "--spill-dir",
                                                str(spill), "--no-model",
                                                "--request-timeout", "90"])):
        run = tmp_path / name
        r = pyfleet("train", "--rows", "6000", "--workers", "1", "--mode", "sync", *extra,
                    "--run-dir", str(run), "--json", cwd=tmp_path, timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        runs[name] = json.loads(r.stdout.strip().splitlines()[-1])
    for key in ("test_auc", "test_logloss", "table_rows"):
        assert runs["disk"][key] == runs["ram"][key], key
    manifest = json.loads((tmp_path / "disk" / "checkpoint" / "MANIFEST.json").read_text())
    (sparse,) = [t for t in manifest["tables"] if t["kind"] == "sparse"]
    assert sparse["memory_budget"] == 300 << 10 and sparse["spill_dir"] == str(spill)
    rows = runs["disk"]["table_rows"][sparse["name"]]
    assert rows * sparse["dim"] * 4 > 2 * (300 << 10)  # the weights alone exceed it
    assert os.listdir(spill) == []
    ram, disk = runs["ram"], runs["disk"]
    assert ram["server_spilled_rows"] == [0] and 0 < disk["server_spilled_rows"][0] < rows
    assert 0 < disk["server_table_bytes"][0] < ram["server_table_bytes"][0]
    for s in (ram, disk):  # VmHWM, read after the RSS: never below it
        assert s["server_peak_rss_bytes"][0] >= s["server_rss_bytes"][0] > 0
    assert (tmp_path / "ram" / "model").is_dir() and ram["inference_model"]
    assert not (tmp_path / "disk" / "model").exists() and disk["inference_model"] is None
    jobs = {n: json.loads((tmp_path / n / "job.json").read_text()) for n in ("ram", "disk")}
    assert jobs["ram"]["request_timeout"] == 60.0 and jobs["disk"]["request_timeout"] == 90.0


@pytest.mark.parametrize("value", ["0", "-5", "nan"])
def test_train_refuses_a_bad_request_timeout(tmp_path, value):
    r = pyfleet("train", "--request-timeout", value, "--rows", "2000", cwd=tmp_path,
                timeout=60)
    assert r.returncode != 0 and "--request-timeout" in r.stderr and value in r.stderr


def test_train_refuses_half_a_disk_tier(tmp_path):
    r = pyfleet("train", "--memory-budget", "1G", "--rows", "2000", cwd=tmp_path, timeout=60)
    assert r.returncode != 0 and "--spill-dir" in r.stderr
    r = pyfleet("train", "--memory-budget", "lots", "--spill-dir", "x", "--rows", "2000",
                cwd=tmp_path, timeout=60)
    assert r.returncode != 0 and "--memory-budget" in r.stderr and "lots" in r.stderr
    (tmp_path / "a_file").write_text("x")
    r = pyfleet("train", "--memory-budget", "1G", "--spill-dir", str(tmp_path / "a_file"),
                "--rows", "2000", cwd=tmp_path, timeout=60)
    assert r.returncode != 0 and "--spill-dir" in r.stderr and "not a directory" in r.stderr
    assert not (tmp_path / "runs").exists()  # refused before anything was written


def test_train_names_a_budget_below_the_tables_minimum(tmp_path):
    """A budget the tables refuse (below room for 16 rows a shard) is refused with the
    table's reason before the cluster starts, not as a load of a checkpoint that is not
    there."""
    r = pyfleet("train", "--memory-budget", "1K", "--spill-dir", str(tmp_path / "spill"),
                "--rows", "2000", cwd=tmp_path, timeout=120)
    assert r.returncode != 0
    assert "cannot start with --memory-budget" in r.stderr
    assert "memory_budget must be at least" in r.stderr
    assert "None" not in r.stderr, r.stderr
