"""A dense block file's name is not trusted: its range must lie inside the parameter,
and its header and size must agree with it before a block of that size is made
(LOAD, ``--resume`` and ``init_server`` all load through ``load_server``)."""

import threading

import numpy as np
import pytest

from pyfleet import optimizer as opt
from pyfleet.service import checkpoint as ck
from pyfleet.service.registry import Registry
from pyfleet.table import DenseTable


def _registry(size, start=0, end=None):
    r = Registry(0, 1, 1 << 30, threading.RLock())
    cfg = {"kind": "dense", "name": "d", "shape": [size], "start": start,
           "end": size if end is None else end, "optimizer": opt.Adam(0.01).to_config()}
    r.create_tables([cfg])
    return r


@pytest.fixture
def made(monkeypatch):
    """The sizes of every DenseTable the loader makes."""
    sizes = []
    real = ck.DenseTable

    def counting(shape, *a, **k):
        sizes.append(shape)
        return real(shape, *a, **k)

    monkeypatch.setattr(ck, "DenseTable", counting)
    return sizes


def test_a_name_past_the_parameter_is_refused_before_any_allocation(tmp_path, made):
    save = tmp_path / "save"
    save.mkdir()
    (save / "d.0-100000000.bin").write_bytes(b"\0" * 100)
    with pytest.raises(ValueError, match=r"d\.0-100000000\.bin.*block \[0, 100000000\)"):
        ck.load_server(_registry(1000), str(tmp_path), "save")
    assert made == []


@pytest.mark.parametrize("damage", ["garbage", "short header", "other size", "truncated"])
def test_a_file_whose_header_disagrees_with_its_name_is_refused_unmade(tmp_path, made, damage):
    # a real block file of [0, 1000) written by a server with another placement
    whole = DenseTable(1000, opt.Adam(0.01))
    whole.set(np.arange(1000, dtype=np.float32))
    save = tmp_path / "save"
    save.mkdir()
    good = save / "d.0-1000.bin"
    whole.save(str(good))
    data = good.read_bytes()
    if damage == "garbage":
        good.write_bytes(b"x" * 100)
    elif damage == "short header":
        good.write_bytes(data[:40])
    elif damage == "other size":  # a file of 500 weights under a name of 1000
        small = DenseTable(500, opt.Adam(0.01))
        small.save(str(tmp_path / "small.bin"))
        good.write_bytes((tmp_path / "small.bin").read_bytes())
    else:
        good.write_bytes(data[:-100])
    with pytest.raises(ValueError, match=r"d\.0-1000\.bin") as e:
        # this server holds [0, 500): the file is read through the assembling path
        ck.load_server(_registry(1000, 0, 500), str(tmp_path), "save")
    assert {"garbage": "bad magic", "short header": "too short",
            "other size": "holds 500 weights", "truncated": "truncated"}[damage] in str(e.value)
    assert made == []


def test_a_sound_block_of_another_placement_still_loads(tmp_path, made):
    whole = DenseTable(1000, opt.Adam(0.01))
    whole.set(np.arange(1000, dtype=np.float32))
    save = tmp_path / "save"
    save.mkdir()
    whole.save(str(save / "d.0-1000.bin"))
    r = _registry(1000, 0, 500)
    assert ck.load_server(r, str(tmp_path), "save") == {"d[0:500]": 500}
    e = next(iter(r.entries.values()))
    np.testing.assert_array_equal(e.table.pull().reshape(-1), np.arange(500, dtype=np.float32))
    assert made == [1000]
