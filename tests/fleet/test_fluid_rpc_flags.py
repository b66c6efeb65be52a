"""Fluid's RPC flags, read from the environment as Fluid's RPCs read them:
``FLAGS_rpc_deadline`` (ms) is the request timeout (tests/fleet/test_config.py),
``FLAGS_rpc_retry_times`` the resends of a push its server left unanswered
(PaddleRec's cluster engine sets it for every role). The strategy's
``runtime_configs`` copies of them change nothing, so a script's edit is refused."""

import threading

import numpy as np
import pytest
from support.fluid import fc_fleet

from pyfleet import config, fluid
from pyfleet.distributed.role_maker import Role
from pyfleet.errors import ConfigError
from pyfleet.fluid.incubate.fleet.parameter_server.distribute_transpiler.distributed_strategy import (  # noqa: E501
    StrategyFactory,
)
from pyfleet.launch import free_ports


def test_rpc_retry_times_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv("FLAGS_rpc_retry_times", raising=False)
    assert config.rpc_retry_times() is None
    monkeypatch.setenv("FLAGS_rpc_retry_times", "2")
    assert config.rpc_retry_times() == 2
    for bad in ("often", "-1", "1.5"):
        monkeypatch.setenv("FLAGS_rpc_retry_times", bad)
        with pytest.raises(ConfigError, match="FLAGS_rpc_retry_times"):
            config.rpc_retry_times()


@pytest.mark.timeout(120)
def test_a_fleet_worker_resends_pushes_as_often_as_flags_rpc_retry_times_says(
        monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLAGS_rpc_retry_times", "2")
    ep = f"127.0.0.1:{free_ports(1)[0]}"
    server, _ = fc_fleet(Role.SERVER, ep)
    server.init_server()
    t = threading.Thread(target=server.run_server, daemon=True)
    t.start()
    worker, loss = fc_fleet(Role.WORKER, ep)
    worker.init_worker()
    try:
        assert worker._client.push_retries == 2
        exe = fluid.Executor(fluid.CPUPlace())
        exe.run(worker.startup_program)
        feed = {"x": np.ones((8, 4), "float32"), "y": np.zeros((8, 1), "float32")}
        (out,) = exe.run(worker.main_program, feed=feed, fetch_list=[loss])
        assert np.isfinite(np.asarray(out)).all()
    finally:
        worker.stop_worker()
        t.join(30)
    assert not t.is_alive()


@pytest.mark.parametrize("flag", ["rpc_deadline", "rpc_retry_times"])
def test_an_edit_of_the_strategys_rpc_flags_is_refused_by_name(flag, monkeypatch):
    monkeypatch.setenv("FLAGS_rpc_retry_times", "5")   # the environment's value: accepted
    s = StrategyFactory.create_async_strategy()
    assert s.get_trainer_runtime_config().runtime_configs["rpc_retry_times"] == "5"
    s.program_config()
    s = StrategyFactory.create_sync_strategy()
    s.get_trainer_runtime_config().runtime_configs[flag] = "7"
    with pytest.raises(ConfigError, match=f"FLAGS_{flag}"):
        s.program_config()
