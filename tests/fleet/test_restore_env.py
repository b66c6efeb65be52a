"""``PYFLEET_RESTORE_DIR`` (a restarted job, the Kubernetes contract): ``fleet.init_server()``
loads it once it holds a committed checkpoint, instead of its own ``model_dir``, and ignores
it while it holds none (a job's first start)."""

from test_checkpoint_fleet import assert_same_state, cluster, data, root  # noqa: F401


def test_init_server_restores_pyfleet_restore_dir_once_it_holds_a_checkpoint(
        root, data, monkeypatch):  # noqa: F811
    ckpt = root / "ckpt"
    monkeypatch.setenv("PYFLEET_RESTORE_DIR", str(ckpt))
    with cluster(2, data) as c:  # no manifest there yet: a fresh start
        fresh = c.state()
        assert all(v["keys"].shape[0] == 0 for v in fresh.values() if isinstance(v, dict))
        c.train(6, seed=1)
        c.worker.flush()
        c.worker.save_persistables(c.exe, "ckpt", meta={"pass": 1})
        trained = c.state()
    # Restarted with another model_dir (say, the --resume checkpoint it first started from):
    # the restore directory is the job's newer state and wins.
    other = root / "other"
    monkeypatch.delenv("PYFLEET_RESTORE_DIR")
    with cluster(2, data) as c:
        c.train(2, seed=2)
        c.worker.save_persistables(c.exe, "other")
        elsewhere = c.state()
    with cluster(2, data, model_dir=str(other)) as c:  # without the variable: model_dir
        assert_same_state(elsewhere, c.state(), optimizer_state=False)
    monkeypatch.setenv("PYFLEET_RESTORE_DIR", str(ckpt))
    with cluster(3, data, model_dir=str(other)) as c:
        assert_same_state(trained, c.state(), optimizer_state=False)
