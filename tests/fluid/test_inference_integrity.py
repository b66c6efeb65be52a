"""A prediction directory is checked before it is trusted: a sha256 per file
recorded and verified, .npy headers checked against the model before anything is
allocated, non-finite parameters refused by name, non-finite predictions refused,
and a write that fails (a full disk) names the file."""

import errno
import json
import os

import numpy as np
import pytest
from support import DATA

from pyfleet import _atomic, fluid, models
from pyfleet.data import Dataset
from pyfleet.fluid import inference

SAMPLE = DATA / "criteo-paddlerec-part0" / "part-0.tsv"
needs_data = pytest.mark.skipif(not SAMPLE.exists(), reason="shared Criteo sample missing")


def _feed(batch, m):
    feed = {m.dense_input.name: batch.dense}
    for var, (ids, offsets) in zip(m.slots, batch.sparse):
        feed[var.name] = (ids, offsets)
    return feed


def _save(where, nan=False):
    """``(model, a batch, the first fc weight's name)``: a model trained one step and
    saved (with half of that weight NaN when ``nan``)."""
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 3
    with fluid.program_guard(main, startup):
        m = models.build("dnn", num_dense=13, num_slots=26, embedding_dim=4, layers=(8,))
        fluid.optimizer.SGD(learning_rate=0.01).minimize(m.avg_cost)
    exe = fluid.Executor()
    exe.run(startup)
    batch = next(iter(Dataset(str(SAMPLE), batch_size=100)))
    feed = _feed(batch, m)
    feed[m.label.name] = batch.labels.astype(np.int64).reshape(-1, 1)
    exe.run(main, feed=feed, fetch_list=[m.avg_cost])
    weight = next(p.name for p in main.all_parameters() if ".w_" in p.name)
    if nan:
        value = main.backend.pull_dense(weight).copy()
        value.reshape(-1)[: value.size // 2] = np.nan
        main.backend.set_dense(weight, value)
    inference.save(where, main, [v.name for v in m.inputs if v is not m.label], [m.predict],
                   inference.LocalSource(main.backend))
    return m, batch, weight


@needs_data
def test_every_file_has_its_sha256_and_a_changed_byte_is_refused(tmp_path):
    where = tmp_path / "model"
    _save(where)
    desc = json.loads((where / "__model__.json").read_text())
    digests = desc["inference"]["sha256"]
    files = sorted(f for f in os.listdir(where) if f != "__model__.json")
    assert any(f.endswith(".npy") for f in files) and "__model__" in files  # both layouts
    assert sorted(digests) == files
    import hashlib
    for f in files:
        assert digests[f] == hashlib.sha256((where / f).read_bytes()).hexdigest()
    inference.load(where)  # intact: loads
    # one bit of one weight (pyfleet's .npy, then Fluid's tensor file of the same
    # weight), then of Fluid's program: same size, same header, refused by name
    w = next(f for f in files if ".w_" in f and f.endswith(".npy"))
    for changed in (w, w[:-len(".npy")], "__model__"):
        original = (where / changed).read_bytes()
        data = bytearray(original)
        data[-3] ^= 0x40
        (where / changed).write_bytes(bytes(data))
        with pytest.raises(ValueError, match=rf"{changed} does not match its sha256"):
            inference.load(where)
        (where / changed).write_bytes(original)
    inference.load(where)


@needs_data
def test_a_header_claiming_a_huge_shape_is_refused_before_allocating(tmp_path):
    where = tmp_path / "model"
    _save(where)
    desc = json.loads((where / "__model__.json").read_text())
    wfile = desc["inference"]["sparse"]["SparseFeatFactors"]["weights"]
    with open(where / wfile, "wb") as f:  # a header claiming (10**12, 16) float32, 64 TB
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f4", "fortran_order": False, "shape": (10**12, 4)})
        f.write(b"\0" * 64)
    with pytest.raises(ValueError, match=rf"{wfile}: its header says float32 "
                                         rf"\(1000000000000, 4\), the model expects"):
        inference.load(where)
    # the right shape but a truncated file
    weight = _save(where)[2]
    desc = json.loads((where / "__model__.json").read_text())
    path = where / desc["inference"]["dense"][weight]
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(ValueError, match=rf"{weight}\.npy is [\d,]+ bytes, its header .* "
                                         r"needs [\d,]+ \(a truncated or damaged file\)"):
        inference.load(where)


@needs_data
def test_a_model_without_checksums_loads_only_when_asked(tmp_path):
    # The attack: deleting the "sha256" section turned every file's check off.
    where = tmp_path / "model"
    m, batch, _ = _save(where)
    desc = json.loads((where / "__model__.json").read_text())
    del desc["inference"]["sha256"]
    _atomic.write_json(str(where / "__model__.json"), desc)
    with pytest.raises(ValueError, match=r"__model__.json carries no checksums .* refused "
                                         r"\(read it with unchecked_ok=True"):
        inference.load(where)
    p = inference.load(where, unchecked_ok=True)  # asked for: headers still checked
    (out,) = p.predict(_feed(batch, m))
    assert np.isfinite(out).all() and out.shape == (100, 1)
    del desc["body_sha256"]
    desc["inference"]["sha256"] = {}
    _atomic.write_json(str(where / "__model__.json"), desc)
    with pytest.raises(ValueError, match=r"carries no checksums"):
        inference.load(where)


@needs_data
def test_an_edit_of_the_model_description_is_refused(tmp_path):
    where = tmp_path / "model"
    _save(where)
    path = where / "__model__.json"
    desc = json.loads(path.read_text())
    assert desc["body_sha256"]
    desc["fetch"] = desc["fetch"] + desc["feed"][:1]   # the body changes, its checksum not
    _atomic.write_json(str(path), desc)
    with pytest.raises(ValueError, match=r"__model__.json is damaged: its body does not "
                                         r"match its body_sha256"):
        inference.load(where)


@needs_data
def test_nan_weights_are_refused_naming_the_parameter(tmp_path):
    where = tmp_path / "model"
    weight = _save(where, nan=True)[2]
    with pytest.raises(ValueError, match=rf"parameter '{weight}' \({weight}\.npy\) holds "
                                         r"[\d,]+ NaN or infinite value"):
        inference.load(where)


@needs_data
def test_a_non_finite_prediction_writes_nothing(tmp_path, monkeypatch):
    where = tmp_path / "model"
    _save(where)
    p = inference.load(where)
    real = p.predict

    def poisoned(feed):
        out = [np.array(a, copy=True) for a in real(feed)]
        out[0][7] = np.nan
        return out

    monkeypatch.setattr(p, "predict", poisoned)
    out = tmp_path / "p.txt"
    with pytest.raises(ValueError, match=r"NaN or infinity for example 8 of .*part-0\.tsv"):
        p.predict_file(str(SAMPLE), str(out))
    assert not out.exists()


@needs_data
def test_a_full_disk_while_saving_names_the_file(tmp_path, monkeypatch):
    real_open = open

    class FullDisk:  # a file whose writes fail as on a full disk
        def __init__(self, *args):
            self.f = real_open(*args)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def flush(self):
            self.f.flush()

        def fileno(self):
            return self.f.fileno()

    monkeypatch.setattr(_atomic, "open", FullDisk, raising=False)
    with pytest.raises(_atomic.WriteError, match=rf"^cannot write {tmp_path}/model/\S+\.npy: "
                                                  rf"No space left on device$"):
        _save(tmp_path / "model")
    assert not (tmp_path / "model").exists()  # nothing of the failed save is left