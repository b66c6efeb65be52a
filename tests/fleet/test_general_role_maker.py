"""Fluid 1.8's GeneralRoleMaker: the role from the PaddleCloud environment; its
Gloo rendezvous options are Fluid's; its Gloo collectives are refused by name."""

import pytest

from pyfleet.errors import ConfigError
from pyfleet.fluid.incubate.fleet.base.role_maker import GeneralRoleMaker

ENV = {"TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": "127.0.0.1:6001,127.0.0.1:6002",
       "PADDLE_TRAINERS_NUM": "3", "PADDLE_TRAINER_ID": "2"}


def test_role_from_the_environment(monkeypatch):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    r = GeneralRoleMaker(path="/tmp/gloo", init_timeout_seconds=10, http_ip_port="")
    r.generate_role()
    assert r.is_worker() and r.worker_index() == 2 and r.worker_num() == 3
    assert r.server_num() == 2
    for name in ("_all_reduce", "_all_gather", "_worker_gather"):
        with pytest.raises(ConfigError, match=f"GeneralRoleMaker.{name}.*Gloo"):
            getattr(r, name)([1])
    with pytest.raises(ConfigError, match="barrier_worker"):
        r._barrier_worker()


def test_an_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="hdfs_nmae"):
        GeneralRoleMaker(hdfs_nmae="x")
