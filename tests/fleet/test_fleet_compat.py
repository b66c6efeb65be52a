"""Fluid 1.5-1.7 Fleet names scripts of the era call: split_files, worker_endpoints,
worker_index on a server, set_hdfs_config. (fluid.require_version: F-rest's tests/fluid.)"""

import pytest

from pyfleet import fluid
from pyfleet.distributed.fleet import Fleet
from pyfleet.distributed.role_maker import PaddleCloudRoleMaker, Role, UserDefinedRoleMaker

EPS = ["127.0.0.1:6001", "127.0.0.1:6002"]


def _fleet(index, workers, role=Role.WORKER):
    f = Fleet()
    f.init(UserDefinedRoleMaker(index, role, workers, EPS))
    return f


def _reference_split(files, index, workers):
    """Fluid's loop: worker i takes n // w files, plus one for i < n % w, in order."""
    n, end = len(files), 0
    for i in range(index + 1):
        start, end = end, end + n // workers + (i < n % workers)
    return files[start:end]


@pytest.mark.parametrize("n, workers", [(5, 2), (7, 3), (4, 4), (10, 3), (1, 1)])
def test_split_files_is_fluids_contiguous_share(n, workers):
    files = [f"part-{i:05d}" for i in range(n)]
    shares = [_fleet(i, workers).split_files(files) for i in range(workers)]
    assert [f for s in shares for f in s] == files  # every file once, in order
    for i, share in enumerate(shares):
        assert share == _reference_split(files, i, workers)
    assert _fleet(0, 2).split_files(["a", "b", "c", "d", "e"]) == ["a", "b", "c"]
    assert _fleet(1, 2).split_files(("a", "b", "c", "d", "e")) == ["d", "e"]


def test_split_files_refuses_fewer_files_than_workers():
    with pytest.raises(ValueError, match="2 file.*3 workers"):
        _fleet(0, 3).split_files(["a", "b"])


def test_worker_index_on_a_server_is_its_id_as_in_fluid():
    f = _fleet(1, 3, Role.SERVER)
    assert f.worker_index() == 1 and f.server_index() == 1 and f.is_server()


def test_worker_endpoints_from_the_environment_or_empty():
    env = {"TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": ",".join(EPS),
           "PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINER_ID": "1"}
    f = Fleet()
    f.init(PaddleCloudRoleMaker(env=env))
    assert f.worker_endpoints() == [] and f.worker_endpoints(to_string=True) == ""
    f = Fleet()
    f.init(PaddleCloudRoleMaker(env={**env, "PADDLE_TRAINER_ENDPOINTS":
                                     "10.0.0.1:7000,10.0.0.2:7000"}))
    assert f.worker_endpoints() == ["10.0.0.1:7000", "10.0.0.2:7000"]
    assert f.worker_endpoints(to_string=True) == "10.0.0.1:7000,10.0.0.2:7000"


def test_set_hdfs_config_is_kept_and_hdfs_paths_go_through_the_hadoop_command(
        tmp_path, monkeypatch):
    f = _fleet(0, 1)
    f.set_hdfs_config("hdfs://nn:9000", "user,passwd")
    assert f._hdfs_config == {"fs_name": "hdfs://nn:9000", "fs_ugi": "user,passwd"}
    monkeypatch.setenv("PATH", str(tmp_path))   # no hadoop: the error says what is missing
    with pytest.raises(ValueError, match="'hadoop' is not on PATH"):
        f.save_persistables(None, "hdfs://nn:9000/user/model")
    server = _fleet(0, 1, Role.SERVER)
    with pytest.raises(ValueError, match="'hadoop' is not on PATH"):
        server.init_server("afs:/user/model")
    with pytest.raises(ValueError, match="HDFS"):
        fluid.io.save_persistables(None, "hdfs://nn/x", fluid.Program())


def _minimize(optimizer, strategy):
    from pyfleet.fluid.incubate.fleet.parameter_server.distribute_transpiler import fleet as _f
    f = _fleet(0, 2)
    assert type(_f) is type(f)
    with fluid.program_guard(fluid.Program(), fluid.Program()), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[4], dtype="float32")
        y = fluid.layers.data(name="y", shape=[1], dtype="float32")
        loss = fluid.layers.mean(fluid.layers.square_error_cost(fluid.layers.fc(x, 1), y))
        f.distributed_optimizer(optimizer, strategy).minimize(loss)
    return f


def test_strategy_factory_maps_to_pyfleet_modes():
    from pyfleet.fluid.incubate.fleet.parameter_server.distribute_transpiler.distributed_strategy import (
        StrategyFactory,
    )
    sgd = fluid.optimizer.SGD(0.1)
    assert _minimize(sgd, StrategyFactory.create_sync_strategy())._strategy.mode == "sync"
    assert _minimize(sgd, StrategyFactory.create_async_strategy())._strategy.mode == "async"
    geo = _minimize(sgd, StrategyFactory.create_geo_strategy(7))._strategy
    assert geo.mode == "geo" and geo.geo_k_steps == 7
    s = StrategyFactory.create_async_strategy()
    s.get_program_config().slice_var_up = False          # the config the job uses
    assert _minimize(sgd, s)._strategy.slice_var_up is False
    with pytest.raises(ValueError, match="half-async"):
        StrategyFactory.create_half_async_strategy()
    s = StrategyFactory.create_async_strategy()
    s.get_trainer_runtime_config().runtime_configs["communicator_send_queue_size"] = "40"
    with pytest.raises(ValueError, match="communicator_send_queue_size"):
        _minimize(sgd, s)


@pytest.mark.parametrize("rule", [fluid.optimizer.Momentum(0.1, 0.9),
                                  fluid.optimizer.RMSProp(0.1)])
def test_momentum_and_rmsprop_are_accepted_by_fleet(rule):
    """The servers' tables run them (the core rules): every table config
    carries the rule, as Fluid's pserver optimize blocks do."""
    f = _minimize(rule, None)
    assert f._tables and all(c["optimizer"] == rule.to_config() for c in f._tables)


def test_fluid_save_and_load_round_trip_a_local_program(tmp_path):
    def build():
        main, startup = fluid.Program(), fluid.Program()
        with fluid.program_guard(main, startup), fluid.unique_name.guard():
            ids = fluid.layers.data(name="ids", shape=[1], dtype="int64", lod_level=1)
            emb = fluid.layers.embedding(ids, size=[100, 4], is_sparse=True,
                                         param_attr=fluid.ParamAttr(name="emb"))
            out = fluid.layers.fc(fluid.layers.sequence_pool(emb, "sum"), 1)
        return main, startup, out
    import numpy as np
    main, startup, out = build()
    exe = fluid.Executor()
    exe.run(startup)
    be = main.backend                    # weights no fresh startup would give
    for p in main.all_parameters():
        if p.is_sparse_table:
            be.push_sparse("emb", np.array([3, 7, 9], np.uint64), np.ones((3, 4), np.float32))
        else:
            be.set_dense(p.name, np.full(p.shape, 0.25, np.float32))
    feed = {"ids": (np.array([3, 7, 9], np.int64), np.array([0, 2, 3]))}
    want = exe.run(main, feed=feed, fetch_list=[out])[0]
    fluid.save(main, str(tmp_path / "ckpt" / "model"))
    assert (tmp_path / "ckpt" / "model.pdmodel").is_file()
    main2, startup2, out2 = build()
    exe.run(startup2)
    assert not np.array_equal(exe.run(main2, feed=feed, fetch_list=[out2])[0], want)
    fluid.load(main2, str(tmp_path / "ckpt" / "model"), exe)
    np.testing.assert_array_equal(exe.run(main2, feed=feed, fetch_list=[out2])[0], want)
    with pytest.raises(ValueError, match="does not exist"):
        fluid.load(main2, str(tmp_path / "nothing"), exe)


def test_transpiler_optimizer_built_directly_checks_as_fluid_and_minimizes(monkeypatch):
    from pyfleet.distributed import fleet as fleet_module
    from pyfleet.fluid.incubate.fleet.parameter_server.distribute_transpiler import (
        TranspilerOptimizer,
    )
    from pyfleet.fluid.incubate.fleet.parameter_server.distribute_transpiler.distributed_strategy import (  # noqa: E501
        StrategyFactory,
    )
    with pytest.raises(TypeError, match="optimizer must be an instance of Optimizer"):
        TranspilerOptimizer("Adam", None)
    with pytest.raises(TypeError, match="strategy must be"):
        TranspilerOptimizer(fluid.optimizer.Adam(0.001), "strategy")
    f = _fleet(0, 2)
    monkeypatch.setattr(fleet_module, "fleet", f)        # the process's fleet it wraps
    opt = TranspilerOptimizer(fluid.optimizer.Adam(0.001),
                              StrategyFactory.create_async_strategy())
    with fluid.program_guard(fluid.Program(), fluid.Program()), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[4], dtype="float32")
        loss = fluid.layers.mean(fluid.layers.fc(x, 3))
        with pytest.raises(TypeError, match="not a list"):
            opt.minimize(loss=[])
        with pytest.raises(TypeError, match="not a list"):
            opt.minimize(loss, startup_program=[])
        with pytest.raises(TypeError, match="must be a Variable"):
            opt.minimize(loss=loss.name)
        opt.minimize(loss, None)                 # Fluid's second argument: scopes
        assert f.main_program is loss.block.program
        assert f._strategy.mode == "async"
        placed = sorted({name for name, *_ in f._placement})
        assert placed == sorted(p.name for p in f.main_program.all_parameters())


def test_fleet_saves_refuse_what_fluids_refuse_before_anything_else():
    f = _fleet(0, 2)
    with fluid.program_guard(fluid.Program(), fluid.Program()), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[1], dtype="float32")
        loss = fluid.layers.mean(fluid.layers.fc(x, 10))
        fluid.optimizer.Adam().minimize(loss)
        pe = fluid.ParallelExecutor(use_cuda=False, loss_name=loss.name)
        compiled = fluid.compiler.CompiledProgram(loss.block.program)
    exe = fluid.Executor(fluid.CPUPlace())
    for call in (lambda **kw: f.save_inference_model(dirname="m", feeded_var_names=["x"],
                                                     target_vars=[loss], **kw),
                 lambda **kw: f.save_persistables(dirname="m", **kw)):
        with pytest.raises(TypeError, match="ParallelExecutor is not allowed"):
            call(executor=pe)
        with pytest.raises(TypeError, match="executor must be as Executor type"):
            call(executor="executor")
        with pytest.raises(TypeError, match="CompiledProgram is not allowed"):
            call(executor=exe, main_program=compiled)
    with pytest.raises(TypeError, match="config must be an instance"):
        f._transpile("config")
    with pytest.raises(ValueError, match="give the config to fleet.distributed_optimizer"):
        f._transpile(fluid.DistributeTranspilerConfig())
