"""A served model version in one process: its tables hold exactly the model's rows
in the storage type asked for, and an id the model never saw gets the row training
would have created for it (the table's initializer with its seed), never zeros."""

import shutil
from pathlib import Path

import numpy as np
import pytest
from support import DATA
from support.cli import save_small_model

from pyfleet.fluid.inference import load_program
from pyfleet.serving.model import ModelVersion, is_model_dir
from pyfleet.table import SparseTable

CSV = DATA / "criteo-kaggle-tiny" / "train.tiny.csv"
pytestmark = pytest.mark.skipif(not CSV.exists(), reason="shared Criteo samples missing")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_small_model(tmp_path_factory.mktemp("m") / "model", CSV, format="csv",
                            batch_size=200)


def test_rows_are_the_models_and_unseen_ids_get_the_initial_row(model, tmp_path):
    program, _, _ = load_program(model)
    keys, weights = program.backend.sparse_rows("SparseFeatFactors")
    cfg = program.backend.sparse_configs["SparseFeatFactors"]
    for kwargs in ({}, {"memory_budget": 64 << 10, "spill_dir": tmp_path / "spill"}):
        v = ModelVersion(model, **kwargs)
        table = v.tables["SparseFeatFactors"]
        np.testing.assert_array_equal(table.pull(keys, create=False), weights)  # exact
        unseen = np.setdiff1d(np.arange(1, 5000, dtype=np.uint64), keys)[:1000]
        got = v.program.backend.pull_sparse("SparseFeatFactors", unseen)
        from pyfleet import initializer
        ref = SparseTable(int(cfg["dim"]), table.optimizer,
                          initializer=initializer.from_config(cfg["initializer"]),
                          seed=int(cfg["seed"]))
        np.testing.assert_array_equal(got, ref.initial_values(unseen))
        assert np.abs(got).max() > 0 and len(table) == keys.shape[0]  # nothing created
    assert table.stats()["spilled_rows"] > 0


def test_steps_read_the_dense_weights_in_place_and_cannot_change_them(model):
    from pyfleet.data import Dataset
    program, _, _ = load_program(model)
    saved = {n: np.array(a) for n, a in program.backend.dense.items()}
    v = ModelVersion(model)
    batch = next(iter(Dataset(str(CSV), format="csv", batch_size=50)))
    first = v.predict(batch)
    backend = v.program.backend
    for name, want in saved.items():
        got = backend.pull_dense(name)
        assert got is backend.pull_dense(name)  # no copy a step
        np.testing.assert_array_equal(got, want)
        with pytest.raises(ValueError, match="read-only"):
            got[...] = 0
    np.testing.assert_array_equal(v.predict(batch), first)


def test_fp16_storage_holds_each_weight_rounded_to_fp16(model):
    program, _, _ = load_program(model)
    keys, weights = program.backend.sparse_rows("SparseFeatFactors")
    v = ModelVersion(model, storage="fp16")
    got = v.tables["SparseFeatFactors"].pull(keys, create=False)
    assert v.tables["SparseFeatFactors"].storage == "fp16"
    # stochastic rounding: each value is one of the two fp16 neighbours of the weight
    w = np.asarray(weights)
    near = w.astype(np.float16)
    wide = near.astype(np.float32)
    below = np.where(wide > w, np.nextafter(near, np.float16(-np.inf)), near).astype(np.float32)
    above = np.where(wide < w, np.nextafter(near, np.float16(np.inf)), near).astype(np.float32)
    assert np.all((got == below) | (got == above))
    assert not np.array_equal(got, w)


def test_a_directory_being_written_is_not_a_version_and_fluid_files_alone_are_refused(
        model, tmp_path):
    from pyfleet.serving.versions import newest_model_dir
    root = tmp_path / "models"
    half = root / "2"
    shutil.copytree(model, half)
    # pyfleet writes Fluid's __model__ first and its own __model__.json last
    (half / "__model__.json").unlink()
    assert (half / "__model__").is_file() and not is_model_dir(half)
    shutil.copytree(model, root / "1")
    assert newest_model_dir(root) == str(root / "1")
    fluid_only = tmp_path / "fluid_only"
    shutil.copytree(half, fluid_only)
    for f in fluid_only.glob("*.npy"):
        f.unlink()
    assert is_model_dir(fluid_only)
    with pytest.raises(ValueError, match="checksums .* in __model__.json, which is missing"):
        ModelVersion(fluid_only)
    with pytest.raises(ValueError, match="SparseFeatFactors"):  # a table of 64-bit ids
        ModelVersion(fluid_only, unchecked_ok=True)


def test_without_httptools_pyfleet_serve_names_the_extra(model, monkeypatch, capsys):
    import sys

    from pyfleet.cli import main
    monkeypatch.setitem(sys.modules, "httptools", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "pyfleet.serving.app", raising=False)
    monkeypatch.delitem(sys.modules, "pyfleet.serving.http", raising=False)
    with pytest.raises(SystemExit, match=r'needs httptools .*: pip install "\.\[serve\]"'):
        main(["serve", "--model", str(model), "--port", "0"])


def test_a_model_without_checksums_is_served_only_when_asked_for():
    # Fluid's layout written by Paddle 1.8 carries no checksums: nothing could tell a
    # damaged or replaced file. pyfleet serve --unchecked-model is the explicit ask.
    fluid18 = Path(__file__).parents[1] / "fluid" / "data" / "fluid18_fc" / "separate"
    with pytest.raises(ValueError, match=r"no checksums pyfleet can check .* refused"):
        ModelVersion(str(fluid18))
    version = ModelVersion(str(fluid18), unchecked_ok=True)
    assert version.info()["n_slots"] == 1
