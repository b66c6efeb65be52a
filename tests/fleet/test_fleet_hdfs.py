"""Fleet saves and loads at hdfs:/afs: paths (as PSLib's Fleet took them), through a
stand-in ``hadoop`` on PATH serving a temp dir; servers are real Server
endpoints on 127.0.0.1 (test_checkpoint_fleet's cluster)."""

import json
import os

import numpy as np
import pytest
from support import hadoop_standin
from test_checkpoint_fleet import assert_same_state, cluster, data, root  # noqa: F401

from pyfleet import fluid
from pyfleet.distributed.fleet import MANIFEST_NAME
from pyfleet.fluid import inference


@pytest.fixture
def hdfs(tmp_path, monkeypatch):
    """``(the directory the stand-in hadoop serves, its calls so far)``."""
    return hadoop_standin.serve(tmp_path, monkeypatch)


def _hdfs_config(fleet_):
    fleet_.set_hdfs_config("hdfs://nn:9000", "alice,secret", **{"dfs.replication": 2})


def test_a_checkpoint_saved_to_hdfs_restores_exactly(root, data, hdfs):  # noqa: F811
    store, calls = hdfs
    with cluster(2, data) as c:
        _hdfs_config(c.worker)
        c.train(5, seed=1)
        m1 = c.worker.save_persistables(c.exe, "hdfs://nn:9000/user/alice/ck")
        c.train(3, seed=2)
        m2 = c.worker.save_persistables(c.exe, "hdfs://nn:9000/user/alice/ck")
        want = c.state()
        with pytest.raises(ValueError, match=r"mode='delta'.* save full to HDFS/AFS"):
            c.worker.save_persistables(c.exe, "hdfs://nn:9000/user/alice/ck", mode="delta")
        c.worker.load_persistables(c.exe, "hdfs://nn:9000/user/alice/ck")   # auc counters
    remote = store / "user" / "alice" / "ck"
    gen1, gen2 = m1["chain"][0]["dir"], m2["chain"][0]["dir"]
    assert gen1 != gen2   # numbered after the remote directory's: nothing overwritten
    names = sorted(os.listdir(remote))
    assert MANIFEST_NAME in names and gen2 in names and gen1 not in names
    assert json.loads((remote / MANIFEST_NAME).read_text())["id"] == m2["id"]
    assert not os.listdir(root / ".hdfs-staging")   # staging removed
    argvs = calls()
    assert all(a[:6] == ["fs", "-D", "fs.default.name=hdfs://nn:9000", "-D",
                         "hadoop.job.ugi=alice,secret", "-Ddfs.replication=2"] for a in argvs)
    puts = [a[-1] for a in argvs if "-put" in a]
    assert puts[-1].endswith("/" + MANIFEST_NAME)   # the commit point is uploaded last
    # a server loads it (init_server("hdfs:/...")), every table and dense value exact
    with cluster(2, data, model_dir="hdfs://nn:9000/user/alice/ck") as c:
        assert_same_state(want, c.state())


def test_a_missing_or_unreachable_hdfs_checkpoint_is_refused_by_name(root, data, hdfs):  # noqa: F811
    with pytest.raises(ValueError, match=r"'afs:/nothing/here' has no MANIFEST.json"):
        with cluster(1, data, model_dir="afs:/nothing/here"):
            pass
    with cluster(1, data) as c:
        c.train(2, seed=1)
        with pytest.raises(ValueError, match=r"hdfs:/BROKEN/ck.*exited 255: .*Connection "
                                             r"refused"):
            c.worker.save_persistables(c.exe, "hdfs:/BROKEN/ck")
    assert not os.listdir(root / ".hdfs-staging")


def test_save_inference_model_to_hdfs_writes_a_loadable_model(root, data, hdfs, tmp_path):  # noqa: F811
    store, calls = hdfs
    with cluster(2, data) as c:
        c.train(4, seed=1)
        m = c.model
        feeds = [v.name for v in m.inputs if v is not m.label]
        c.worker.save_inference_model(c.exe, "afs:/models/dnn", feeds, [m.predict])
        c.worker.save_inference_model(c.exe, str(tmp_path / "local"), feeds, [m.predict])
    remote = store / "models" / "dnn"
    assert sorted(os.listdir(remote)) == sorted(os.listdir(tmp_path / "local"))
    puts = [a[-1] for a in calls() if "-put" in a]
    assert puts[-1] == "afs:/models/dnn/__model__.json"   # written last: complete
    a, b = inference.load(str(remote)), inference.load(str(tmp_path / "local"))
    rng = np.random.default_rng(0)
    feed = {n: rng.random((3, 13), dtype=np.float32) if n == feeds[0] else
            (rng.integers(0, 1000, 3).astype(np.int64), np.arange(4, dtype=np.int64))
            for n in feeds}
    np.testing.assert_array_equal(a.predict(feed)[0], b.predict(feed)[0])


def test_fluid_io_still_refuses_hdfs_paths_naming_what_takes_them():
    with pytest.raises(ValueError, match=r"fluid.io reads and writes local paths .* "
                                         r"fleet.save_persistables"):
        fluid.io.save_persistables(None, "hdfs://nn/x", fluid.Program())
