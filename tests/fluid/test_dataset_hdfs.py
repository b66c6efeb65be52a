"""Dataset files on ``hdfs:``/``afs:`` read through the ``hadoop`` command, as Fluid
did (``hadoop fs -D fs.default.name=... -D hadoop.job.ugi=... -cat PATH`` into
the pipe command), against a stand-in ``hadoop`` on PATH serving a temp dir."""

import gzip

import numpy as np
import pytest
from support import hadoop_standin

import pyfleet.fluid as fluid  # noqa: PLR0402 (the line Fluid users write)
from pyfleet.fluid import hadoop


@pytest.fixture
def hdfs(tmp_path, monkeypatch):
    """``(the directory the stand-in hadoop serves, its calls so far)``."""
    return hadoop_standin.serve(tmp_path, monkeypatch)


def _lines(n, start):
    """MultiSlot text: 1 dense value, 1 id, a label per sample."""
    return "".join(f"1 {start + i}.5 1 {start + i} 1 {(start + i) % 2}\n" for i in range(n))


def _dataset(kind, files):
    with fluid.program_guard(fluid.Program(), fluid.Program()):
        x = fluid.layers.data("x", shape=[1], dtype="float32")
        ids = fluid.layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        y = fluid.layers.data("y", shape=[1], dtype="int64")
    ds = fluid.DatasetFactory().create_dataset(kind)
    ds.set_use_var([x, ids, y])
    ds.set_batch_size(4)
    ds.set_filelist(files)
    return ds


def _read_all(ds):
    xs, ids = [], []
    for feed in ds._batch_feeds():
        xs.append(feed["x"].reshape(-1))
        ids.append(feed["ids"][0])
    return np.concatenate(xs), np.concatenate(ids)


@pytest.mark.parametrize("kind", ["QueueDataset", "InMemoryDataset"])
def test_hdfs_and_local_files_read_through_hadoop_as_fluid_configured_it(tmp_path, hdfs,
                                                                         kind):
    root, calls = hdfs
    (root / "data").mkdir()
    (root / "data" / "part-0").write_text(_lines(5, 0))
    with gzip.open(root / "data" / "part-1.gz", "wt") as f:
        f.write(_lines(3, 5))
    local = tmp_path / "part-2"
    local.write_text(_lines(4, 8))
    ds = _dataset(kind, ["hdfs://nn:9000/data/part-0", "afs:/data/part-1.gz", str(local)])
    ds.set_hdfs_config("hdfs://nn:9000", "alice,secret")
    if kind == "InMemoryDataset":
        ds.load_into_memory()
        cols, n = ds._memory
        assert n == 12
        np.testing.assert_array_equal(cols["ids"][0], np.arange(12))
    else:
        xs, ids = _read_all(ds)
        np.testing.assert_array_equal(ids, np.arange(12))
        np.testing.assert_allclose(xs, np.arange(12) + 0.5)
    argvs = calls()
    assert argvs == [
        ["fs", "-D", "fs.default.name=hdfs://nn:9000", "-D", "hadoop.job.ugi=alice,secret",
         "-cat", "hdfs://nn:9000/data/part-0"],
        ["fs", "-D", "fs.default.name=hdfs://nn:9000", "-D", "hadoop.job.ugi=alice,secret",
         "-text", "afs:/data/part-1.gz"]]   # the local file never went through hadoop


def test_without_set_hdfs_config_hadoop_uses_its_own_configuration(hdfs):
    root, calls = hdfs
    (root / "p").write_text(_lines(2, 0))
    _, ids = _read_all(_dataset("QueueDataset", ["hdfs:/p"]))
    np.testing.assert_array_equal(ids, [0, 1])
    assert calls() == [["fs", "-cat", "hdfs:/p"]]


def test_a_failing_hadoop_names_the_path_the_command_and_its_stderr(hdfs):
    root, _ = hdfs
    ds = _dataset("QueueDataset", ["hdfs://nn/missing/part-0"])
    ds.set_hdfs_config("hdfs://nn", "u,p")
    with pytest.raises(ValueError, match=r"reading hdfs://nn/missing/part-0 failed: hadoop fs "
                                         r"-D fs.default.name=hdfs://nn .* exited 1: cat: "
                                         r"`hdfs://nn/missing/part-0': No such file"):
        _read_all(ds)
    ds = _dataset("InMemoryDataset", ["afs:/BROKEN/part-0"])
    with pytest.raises(ValueError, match=r"afs:/BROKEN/part-0 .*exited 255: .*Connection "
                                         r"refused"):
        ds.load_into_memory()


def test_no_hadoop_on_path_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))   # nothing named hadoop here
    ds = _dataset("QueueDataset", ["hdfs:/x/part-0"])
    with pytest.raises(ValueError, match=r"cannot read or write hdfs:/x/part-0: the command "
                                         r"'hadoop' is not on PATH"):
        _read_all(ds)


def test_set_download_cmd_reads_remote_files_with_it(tmp_path, hdfs):
    root, calls = hdfs
    (root / "q").write_text(_lines(3, 0))
    script = tmp_path / "fetch.sh"
    script.write_text(f"#!/bin/sh\nexec cat {root}/$(basename \"$1\")\n")
    script.chmod(0o755)
    ds = _dataset("QueueDataset", ["afs:/anywhere/q"])
    ds.set_download_cmd(str(script))
    _, ids = _read_all(ds)
    np.testing.assert_array_equal(ids, [0, 1, 2])
    assert calls() == []   # hadoop not called


def test_hadoopfs_file_operations(tmp_path, hdfs):
    root, calls = hdfs
    fs = hadoop.HadoopFS("hdfs://nn", "u,p", configs={"dfs.replication": 2})
    local = tmp_path / "f"
    local.write_bytes(b"abc")
    assert not fs.exists("hdfs://nn/d/f")
    fs.mkdir("hdfs://nn/d")
    fs.put(str(local), "hdfs://nn/d/f")
    assert fs.exists("hdfs://nn/d/f") and (root / "d" / "f").read_bytes() == b"abc"
    assert fs.ls("hdfs://nn/d") == ["f"]
    fs.get("hdfs://nn/d/f", str(tmp_path / "back"))
    assert (tmp_path / "back").read_bytes() == b"abc"
    fs.rm("hdfs://nn/d")
    assert not (root / "d").exists()
    assert calls()[0][:6] == ["fs", "-D", "fs.default.name=hdfs://nn", "-D",
                              "hadoop.job.ugi=u,p", "-Ddfs.replication=2"]
    with pytest.raises(hadoop.HadoopError, match=r"hdfs://nn/nope: hadoop fs .* -get "
                                                 r"hdfs://nn/nope .* exited 1"):
        fs.get("hdfs://nn/nope", str(tmp_path / "x"))
    assert hadoop.is_remote("afs:/a") and not hadoop.is_remote("/hdfs:/a")
