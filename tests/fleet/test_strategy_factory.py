"""Fluid 1.8's StrategyFactory strategies, as its distributed_strategy.py makes
them (program config flags, communicator flags from CPU_NUM, server runtime
config, build and execution strategies), and the Fleet calls PaddleRec's runner
makes around them: init_server("") loads nothing; stop_worker() on a server
whose run_server() returned is a no-op."""

import threading

import pytest

from pyfleet import fluid
from pyfleet.distributed.fleet import Fleet
from pyfleet.distributed.role_maker import Role, UserDefinedRoleMaker
from pyfleet.errors import ConfigError
from pyfleet.fluid.incubate.fleet.parameter_server.distribute_transpiler.distributed_strategy import (  # noqa: E501
    DistributedStrategy,
    ServerRuntimeConfig,
    StrategyFactory,
    TrainerRuntimeConfig,
)
from pyfleet.fluid.transpiler.distribute_transpiler import DistributedMode
from pyfleet.launch import free_ports

SF = StrategyFactory


@pytest.fixture(autouse=True)
def _fluid_env(monkeypatch):
    for k in ("CPU_NUM", "PYFLEET_MODE", "FLAGS_communicator_send_queue_size",
              "FLAGS_communicator_thread_pool_size", "FLAGS_rpc_get_thread_num"):
        monkeypatch.delenv(k, raising=False)


def test_sync_strategy_has_fluid_18s_flags_and_trains_sync():
    s = SF.create_sync_strategy()
    c = s.get_program_config()
    assert (c.sync_mode, c.runtime_split_send_recv, c.half_async,
            c.completely_not_async) == (False, True, True, True)   # Fluid 1.8's values
    assert c.mode == "sync" and c.sparse_mode == "sync" and not c.geo_sgd_mode
    assert s.get_trainer_runtime_config().mode == DistributedMode.SYNC
    assert s.get_execute_strategy().use_thread_barrier is True
    assert s.get_execute_strategy().num_threads == 1
    assert s.get_build_strategy().async_mode is True
    assert s.get_build_strategy().reduce_strategy == fluid.BuildStrategy.ReduceStrategy.AllReduce
    assert isinstance(s, DistributedStrategy)


def test_async_and_geo_strategies_have_fluid_18s_flags():
    a = SF.create_async_strategy()
    c = a.get_program_config()
    assert (c.sync_mode, c.runtime_split_send_recv, c.half_async) == (False, True, False)
    assert c.mode == "async" and a.get_trainer_runtime_config().mode == DistributedMode.ASYNC
    assert a.get_execute_strategy().use_thread_barrier is False
    g = SF.create_geo_strategy(7)
    c = g.get_program_config()
    assert c.geo_sgd_mode and c.mode == "geo" and c.geo_sgd_need_push_nums == 7
    assert c.runtime_split_send_recv and not c.sync_mode
    assert g.get_trainer_runtime_config().mode == DistributedMode.GEO
    assert set(g.get_trainer_runtime_config().get_communicator_flags()) == {
        "communicator_thread_pool_size", "communicator_send_wait_times"}


def test_cpu_num_sets_the_defaults_as_in_fluid(monkeypatch):
    monkeypatch.setenv("CPU_NUM", "3")
    s = SF.create_async_strategy()
    flags = s.get_trainer_runtime_config().runtime_configs
    assert flags["communicator_max_merge_var_num"] == "3"
    assert flags["communicator_send_queue_size"] == "3"
    assert flags["communicator_min_send_grad_num_before_recv"] == "3"
    assert flags["communicator_thread_pool_size"] == "5"
    assert flags["rpc_deadline"] == "180000" and flags["rpc_retry_times"] == "3"
    assert s.get_execute_strategy().num_threads == 3
    assert s.get_build_strategy().reduce_strategy == fluid.BuildStrategy.ReduceStrategy.Reduce
    s.program_config()   # Fluid's defaults for this CPU_NUM: accepted


def test_a_changed_communicator_flag_is_refused_by_name(monkeypatch):
    s = SF.create_async_strategy()
    s.get_trainer_runtime_config().runtime_configs["communicator_send_queue_size"] = "40"
    with pytest.raises(ConfigError, match="communicator_send_queue_size"):
        s.program_config()
    monkeypatch.setenv("FLAGS_communicator_thread_pool_size", "9")   # Fluid reads it too
    with pytest.raises(ConfigError, match="communicator_thread_pool_size"):
        SF.create_async_strategy().program_config()
    monkeypatch.delenv("FLAGS_communicator_thread_pool_size")
    monkeypatch.setenv("FLAGS_communicator_is_sgd_optimizer", "0")   # PaddleRec sets it
    SF.create_async_strategy().program_config()   # pyfleet merges no gradient: accepted
    # sync: Fluid itself forces the merge count and the queue size to CPU_NUM
    s = SF.create_sync_strategy()
    s.set_trainer_runtime_config({"communicator_send_queue_size": "40"})
    assert s.get_trainer_runtime_config().get_communicator_flags()[
        "communicator_send_queue_size"] == "1"
    s.program_config()
    with pytest.raises(ValueError, match="doesn't have key: communicator_bogus"):
        s.set_trainer_runtime_config({"communicator_bogus": "1"})
    assert isinstance(TrainerRuntimeConfig().runtime_configs, dict)


def test_server_runtime_config_defaults_and_refusal(monkeypatch):
    s = SF.create_sync_strategy()
    src = s.get_server_runtime_config()
    assert isinstance(src, ServerRuntimeConfig)
    assert (src._rpc_send_thread_num, src._rpc_get_thread_num,
            src._rpc_prefetch_thread_num) == (12, 12, 12)
    s.set_server_runtime_config({"_rpc_send_thread_num": 4})
    with pytest.raises(ConfigError, match="_rpc_send_thread_num"):
        s.program_config()
    with pytest.raises(ValueError, match="doesn't have key: threads"):
        s.set_server_runtime_config({"threads": 4})
    monkeypatch.setenv("FLAGS_rpc_get_thread_num", "3")
    assert ServerRuntimeConfig()._rpc_get_thread_num == 3


def test_set_program_config_applies_the_strategys_flags_again():
    s = SF.create_sync_strategy()
    s.set_program_config({"slice_var_up": False})
    c = s.get_program_config()
    assert c.slice_var_up is False and c.mode == "sync" and c.half_async
    with pytest.raises(ValueError, match="runtime_split_send_recv = False first"):
        s.set_program_config({"sync_mode": True})   # as Fluid: its config has the split flag
    again = fluid.DistributeTranspilerConfig.from_dict(c.to_dict())   # mode "sync", flag set
    assert again.mode == "sync" and again.runtime_split_send_recv is True
    with pytest.raises(ConfigError, match="must be True or False"):
        fluid.DistributeTranspilerConfig.from_dict({**c.to_dict(), "runtime_split_send_recv": "y"})
    cfg = fluid.DistributeTranspilerConfig()
    cfg.min_block_size = 16
    a = SF.create_async_strategy()
    a.set_program_config(cfg)
    assert a.get_program_config().min_block_size == 16
    assert a.get_program_config().mode == "async"
    assert cfg.mode == "sync"                     # the caller's object is copied
    with pytest.raises(ValueError, match="doesn't have key: bogus"):
        a.set_program_config({"bogus": 1})
    with pytest.raises(TypeError):
        a.set_build_strategy(3)
    a.set_execute_strategy({"num_threads": 4})
    assert a.get_execute_strategy().num_threads == 4


def test_fluid_18_flags_on_a_plain_config():
    c = fluid.DistributeTranspilerConfig()
    c.sync_mode = False
    c.runtime_split_send_recv = True
    assert c.mode == "async"
    c.half_async = True
    with pytest.raises(ConfigError, match="half_async"):
        c.check_supported()                       # Fluid's half-async: refused when used
    c.completely_not_async = True
    assert c.mode == "sync" and c.sync_mode is False
    c.check_supported()
    c.mode = "async"                              # pyfleet's explicit choice clears them
    assert not c.half_async and c.mode == "async"
    c.half_async = c.completely_not_async = True
    with pytest.raises(ConfigError, match="runtime_split_send_recv = False first"):
        c.sync_mode = True                        # Fluid refuses the pair, from either side
    c.runtime_split_send_recv = False
    c.sync_mode = True
    assert c.mode == "sync" and c.sync_mode and not c.half_async
    with pytest.raises(ConfigError, match="sync_mode = False first"):
        c.runtime_split_send_recv = True
    c.half_async = c.completely_not_async = True
    c.mode = "hybrid"                             # the sparse side it had: sync
    assert c.sparse_mode == "sync"


def _server_fleet(model_dir):
    ep = f"127.0.0.1:{free_ports(1)[0]}"
    f = Fleet()
    f.init(UserDefinedRoleMaker(0, Role.SERVER, 1, [ep]))
    with fluid.program_guard(fluid.Program(), fluid.Program()), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[4], dtype="float32")
        y = fluid.layers.data(name="y", shape=[1], dtype="float32")
        loss = fluid.layers.mean(fluid.layers.square_error_cost(fluid.layers.fc(x, 1), y))
        f.distributed_optimizer(fluid.optimizer.SGD(0.1),
                                SF.create_sync_strategy()).minimize(loss)
    f.init_server(model_dir)
    return f


@pytest.mark.parametrize("model_dir", ["", None, []])
def test_init_server_with_an_empty_model_dir_loads_nothing(model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    f = _server_fleet(model_dir)
    with pytest.raises(ConfigError, match="init_worker"):
        f.stop_worker()            # still serving: a server's stop_worker is a mistake
    server = f._server
    t = threading.Thread(target=f.run_server, daemon=True)
    t.start()
    server.stop()
    t.join(30)
    assert not t.is_alive()
    assert f.stop_worker() is None  # after run_server returned: nothing to stop
    assert f.stop_worker() is None
