"""fluid.contrib.utils.hdfs_utils: Fluid's HDFSClient, multi_download and multi_upload
through ``<hadoop_home>/bin/hadoop fs -Dk=v ...``, against a stand-in hadoop."""

import json
import os

import pytest
from support import hadoop_standin

import pyfleet.fluid as fluid  # noqa: PLR0402 (the line Fluid users write)
from pyfleet.fluid.contrib.utils.hdfs_utils import HDFSClient, multi_download, multi_upload

CONFIGS = {"fs.default.name": "hdfs://nn:9000", "hadoop.job.ugi": "alice,secret"}


@pytest.fixture
def client(tmp_path, monkeypatch):
    """``(client, root the stand-in serves, logged argvs)``; hadoop_home is tmp_path."""
    root, log = tmp_path / "hdfs", tmp_path / "hadoop.log"
    root.mkdir()
    log.write_text("")
    env = hadoop_standin.install(tmp_path / "bin", root, log)
    for k in ("HADOOP_STANDIN_ROOT", "HADOOP_STANDIN_LOG"):
        monkeypatch.setenv(k, env[k])
    return (HDFSClient(str(tmp_path), CONFIGS), root,
            lambda: [json.loads(line) for line in log.read_text().splitlines()])


def test_file_operations_answer_as_fluids(tmp_path, client):
    c, root, calls = client
    src = tmp_path / "local" / "part-0"
    src.parent.mkdir()
    src.write_text("a\n")
    assert not c.is_exist("hdfs://nn:9000/data")
    assert c.upload("hdfs://nn:9000/data", str(src))
    assert (root / "data" / "part-0").read_text() == "a\n"
    assert calls()[0] == ["fs", "-Dfs.default.name=hdfs://nn:9000",
                          "-Dhadoop.job.ugi=alice,secret", "-test", "-e", "hdfs://nn:9000/data"]
    src.write_text("b\n")
    assert not c.upload("hdfs://nn:9000/data", str(src))              # exists, no overwrite
    assert (root / "data" / "part-0").read_text() == "a\n"
    assert c.upload("hdfs://nn:9000/data", str(src), overwrite=True)
    assert (root / "data" / "part-0").read_text() == "b\n"
    assert c.is_dir("hdfs://nn:9000/data") and not c.is_dir("hdfs://nn:9000/data/part-0")
    assert c.ls("hdfs://nn:9000/data") == ["hdfs://nn:9000/data/part-0"]
    assert c.download("hdfs://nn:9000/data/part-0", str(tmp_path / "back"))
    assert (tmp_path / "back" / "part-0").read_text() == "b\n"
    assert not c.download("hdfs://nn:9000/data/part-0", str(tmp_path / "back"))   # exists
    assert not c.download("hdfs://nn:9000/nope", str(tmp_path / "back"))
    with pytest.raises(ValueError, match="unzip=True"):
        c.download("hdfs://nn:9000/data/part-0", str(tmp_path / "x"), unzip=True)
    assert c.rename("hdfs://nn:9000/data/part-0", "hdfs://nn:9000/data/part-9")
    assert c.ls("hdfs://nn:9000/data") == ["hdfs://nn:9000/data/part-9"]
    assert c.delete("hdfs://nn:9000/data") and not (root / "data").exists()
    assert c.delete("hdfs://nn:9000/data")    # already gone: True, as Fluid's
    with pytest.raises(ValueError, match="does not exist"):
        c.upload("hdfs://nn:9000/data", str(tmp_path / "missing"))


def test_multi_upload_then_each_trainer_downloads_its_share(tmp_path, client):
    c, root, _ = client
    local = tmp_path / "out"
    for rel in ("a", "b", "sub/c", "sub/d", "sub/e"):
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_text(rel)
    multi_upload(c, "hdfs://nn:9000/up", str(local), multi_processes=3)
    assert sorted(c.lsr("hdfs://nn:9000/up", sort=False)) == [
        f"hdfs://nn:9000/up/{r}" for r in ("a", "b", "sub/c", "sub/d", "sub/e")]
    got = []
    for trainer in range(2):
        files = multi_download(c, "hdfs://nn:9000/up", str(tmp_path / f"t{trainer}"),
                               trainer, 2, multi_processes=2)
        for f in files:
            with open(f) as fh:
                assert fh.read() == os.path.relpath(f, tmp_path / f"t{trainer}")
        got += [os.path.relpath(f, tmp_path / f"t{trainer}") for f in files]
    assert sorted(got) == ["a", "b", "sub/c", "sub/d", "sub/e"]   # each file once
    with pytest.raises(ValueError, match="sync=False"):
        multi_upload(c, "hdfs://nn:9000/up", str(local), sync=False)
    assert fluid.contrib.multi_download is multi_download


def test_a_missing_hadoop_logs_and_answers_false(tmp_path, caplog):
    c = HDFSClient(str(tmp_path / "no-hadoop-here"), CONFIGS)
    assert c.is_exist("hdfs://nn:9000/x") is False
    assert "no-hadoop-here/bin/hadoop' does not exist" in caplog.text
