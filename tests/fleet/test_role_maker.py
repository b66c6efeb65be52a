"""Role makers: arguments, the environment contract, validation and freezing."""

import sys
import threading

import pytest
from support import REPO

import pyfleet.distributed.role_maker as rm
from pyfleet.distributed.role_maker import (
    PaddleCloudRoleMaker,
    Role,
    RoleInfo,
    RoleMakerBase,
    UserDefinedRoleMaker,
    default_role_maker,
    parse_endpoints,
)
from pyfleet.errors import ConfigError

EPS = ["127.0.0.1:6001", "127.0.0.1:6002", "127.0.0.1:6003"]

CONTRACT = ["PYFLEET_ROLE", "PYFLEET_SERVER_ENDPOINTS", "PYFLEET_WORKER_NUM",
            "PYFLEET_WORKER_INDEX", "PYFLEET_SERVER_INDEX", "PYFLEET_MODE", "TRAINING_ROLE",
            "PADDLE_TRAINING_ROLE", "PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_PSERVERS",
            "PADDLE_PORT", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ID", "POD_IP",
            *rm.MPI_ENV_VARS]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in CONTRACT:
        monkeypatch.delenv(name, raising=False)


def test_role_values_are_fluids():
    assert Role.WORKER == 1 and Role.SERVER == 2


# ---------------------------------------------------------------- UserDefinedRoleMaker

def test_user_defined_worker():
    r = UserDefinedRoleMaker(current_id=1, role=Role.WORKER, worker_num=3, server_endpoints=EPS)
    r.generate_role()
    assert r.is_worker() and not r.is_server() and not r.is_first_worker()
    assert r.worker_index() == 1 and r.worker_num() == 3
    assert r.server_num() == 3 and r.server_endpoints() == EPS
    assert r.current_endpoint() is None
    with pytest.raises(ConfigError, match="server_index"):
        r.server_index()
    r.server_endpoints().append("x:1")  # a copy: the role maker is unchanged
    assert r.server_endpoints() == EPS == r.get_pserver_endpoints()


def test_user_defined_server_and_first_worker():
    s = UserDefinedRoleMaker(current_id=2, role=Role.SERVER, worker_num=1, server_endpoints=EPS)
    assert s.is_server() and s.server_index() == 2 and s.current_endpoint() == EPS[2]
    assert not s.is_first_worker()
    assert s.worker_index() == 2  # Fluid: the current id, on a server too
    w0 = UserDefinedRoleMaker(0, Role.WORKER, 1, EPS[:1])
    assert w0.is_first_worker()
    assert "worker" in w0.to_string() and "127.0.0.1:6001" in repr(w0)


@pytest.mark.parametrize("kwargs, match", [
    ({"current_id": -1}, "current_id"),
    ({"current_id": "0"}, "current_id"),
    ({"current_id": True}, "current_id"),
    ({"role": "boss"}, "role"),
    ({"role": 3}, "role"),
    ({"worker_num": 0}, "worker_num"),
    ({"worker_num": 2.0}, "worker_num"),
    ({"server_endpoints": None}, "server_endpoints"),
    ({"server_endpoints": "127.0.0.1:6001"}, "server_endpoints"),
    ({"server_endpoints": []}, "server_endpoints"),
    ({"server_endpoints": ["localhost"]}, "host:port"),
    ({"server_endpoints": ["h:0"]}, "port"),
    ({"server_endpoints": ["h:70000"]}, "port"),
    ({"server_endpoints": ["h:x"]}, "port"),
    ({"server_endpoints": [":6000"]}, "host:port"),
    ({"server_endpoints": ["h:1", "h:1"]}, "more than once"),
    ({"current_id": 2, "worker_num": 2}, "current_id"),
    ({"current_id": 3, "role": Role.SERVER}, "current_id"),
])
def test_user_defined_errors_name_the_argument(kwargs, match):
    args = {"current_id": 0, "role": Role.WORKER, "worker_num": 2, "server_endpoints": EPS}
    args.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        UserDefinedRoleMaker(**args)


def test_errors_are_value_errors():
    with pytest.raises(ValueError):
        UserDefinedRoleMaker(worker_num=0, server_endpoints=EPS)


def test_parse_endpoints_forms():
    assert parse_endpoints(" a:1, b:02 ", "X") == ("a:1", "b:2")
    assert parse_endpoints(["[::1]:6000"], "X") == ("[::1]:6000",)
    with pytest.raises(ConfigError, match="X: item 1 is empty"):
        parse_endpoints("a:1,,b:2", "X")
    with pytest.raises(ConfigError, match="X is empty"):
        parse_endpoints("", "X")


# ---------------------------------------------------------------- PaddleCloudRoleMaker

PADDLE_WORKER = {"TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": ",".join(EPS),
                 "PADDLE_TRAINER_ID": "1", "PADDLE_TRAINERS_NUM": "2"}
PADDLE_SERVER = {"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": ",".join(EPS),
                 "PADDLE_TRAINERS_NUM": "2", "POD_IP": "127.0.0.1", "PADDLE_PORT": "6002"}
PYFLEET_WORKER = {"PYFLEET_ROLE": "worker", "PYFLEET_SERVER_ENDPOINTS": ",".join(EPS),
                  "PYFLEET_WORKER_INDEX": "0", "PYFLEET_WORKER_NUM": "4"}


def test_paddle_cloud_worker_from_paddle_names():
    r = PaddleCloudRoleMaker(env=PADDLE_WORKER)
    assert r.is_worker() and r.worker_index() == 1 and r.worker_num() == 2
    assert r.server_endpoints() == EPS


def test_paddle_cloud_server_index_is_its_position_in_the_list():
    r = PaddleCloudRoleMaker(env=PADDLE_SERVER)
    assert r.is_server() and r.server_index() == 1 and r.current_endpoint() == "127.0.0.1:6002"


def test_paddle_cloud_from_pyfleet_names():
    r = PaddleCloudRoleMaker(env=PYFLEET_WORKER)
    assert r.is_first_worker() and r.worker_num() == 4
    s = PaddleCloudRoleMaker(env={**PYFLEET_WORKER, "PYFLEET_ROLE": "SERVER",
                                  "PYFLEET_SERVER_INDEX": "2"})
    assert s.server_index() == 2 and s.current_endpoint() == EPS[2]


def test_pyfleet_names_win_over_paddle_names():
    env = {**PADDLE_SERVER, "PYFLEET_ROLE": "worker", "PYFLEET_SERVER_ENDPOINTS": "h:1,h:2",
           "PYFLEET_WORKER_NUM": "5", "PYFLEET_WORKER_INDEX": "4", "PADDLE_TRAINER_ID": "0"}
    r = PaddleCloudRoleMaker(env=env)
    assert r.is_worker() and r.worker_index() == 4 and r.worker_num() == 5
    assert r.server_endpoints() == ["h:1", "h:2"]
    s = PaddleCloudRoleMaker(env={**PADDLE_SERVER, "PYFLEET_SERVER_INDEX": "0"})
    assert s.server_index() == 0 and s.current_endpoint() == EPS[0]


def test_paddle_15_names_are_understood():
    env = {"PADDLE_TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS": "10.0.0.1,10.0.0.2",
           "PADDLE_PORT": "6174", "PADDLE_TRAINERS_NUM": "3", "POD_IP": "10.0.0.2"}
    r = PaddleCloudRoleMaker(env=env)
    assert r.server_endpoints() == ["10.0.0.1:6174", "10.0.0.2:6174"]
    assert r.server_index() == 1


def _without(d, *names):
    return {k: v for k, v in d.items() if k not in names}


@pytest.mark.parametrize("env, match", [
    ({}, "PYFLEET_ROLE"),
    ({**PADDLE_WORKER, "TRAINING_ROLE": "BOSS"}, "TRAINING_ROLE"),
    ({**PYFLEET_WORKER, "PYFLEET_ROLE": "trainer!"}, "PYFLEET_ROLE"),
    (_without(PADDLE_WORKER, "PADDLE_PSERVERS_IP_PORT_LIST"), "PYFLEET_SERVER_ENDPOINTS"),
    ({**PADDLE_WORKER, "PADDLE_PSERVERS_IP_PORT_LIST": "h:1,h"}, "PADDLE_PSERVERS_IP_PORT_LIST"),
    (_without(PADDLE_WORKER, "PADDLE_TRAINERS_NUM"), "PYFLEET_WORKER_NUM"),
    ({**PADDLE_WORKER, "PADDLE_TRAINERS_NUM": "two"}, "PADDLE_TRAINERS_NUM"),
    ({**PADDLE_WORKER, "PADDLE_TRAINERS_NUM": "0"}, "PADDLE_TRAINERS_NUM"),
    (_without(PADDLE_WORKER, "PADDLE_TRAINER_ID"), "PYFLEET_WORKER_INDEX"),
    ({**PADDLE_WORKER, "PADDLE_TRAINER_ID": "2"}, "PADDLE_TRAINER_ID=2 is out of range"),
    ({**PADDLE_WORKER, "PADDLE_TRAINER_ID": "-1"}, "PADDLE_TRAINER_ID"),
    ({**PYFLEET_WORKER, "PYFLEET_WORKER_INDEX": "4"}, "PYFLEET_WORKER_INDEX=4"),
    (_without(PADDLE_SERVER, "POD_IP"), "PYFLEET_SERVER_INDEX"),
    ({**PADDLE_SERVER, "POD_IP": "10.1.1.1"}, "not in the server list"),
    ({**PADDLE_SERVER, "PYFLEET_SERVER_INDEX": "3"}, "PYFLEET_SERVER_INDEX=3"),
    ({**PADDLE_SERVER, "PYFLEET_SERVER_INDEX": "x"}, "PYFLEET_SERVER_INDEX"),
    ({"PADDLE_TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS": "a,b"}, "PADDLE_PORT"),
    ({"PADDLE_TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS": "a,b", "PADDLE_PORT": "1,2,3"},
     "PADDLE_PORT"),
])
def test_paddle_cloud_errors_name_the_variable(env, match):
    with pytest.raises(ConfigError, match=match):
        PaddleCloudRoleMaker(env=env).generate_role()


def test_collective_role_outside_mpi_says_how_to_start_it():
    r = PaddleCloudRoleMaker(is_collective=True, env={"PADDLE_TRAINER_ID": "0"})
    with pytest.raises(ConfigError, match=r"not started by an MPI launcher.*pyfleet.launch "
                                          r"--collective.*mpirun -np N"):
        r.generate_role()


def test_role_is_frozen_after_generation(monkeypatch):
    for k, v in PADDLE_WORKER.items():
        monkeypatch.setenv(k, v)
    r = PaddleCloudRoleMaker()
    r.generate_role()
    monkeypatch.setenv("PADDLE_TRAINER_ID", "0")
    monkeypatch.setenv("TRAINING_ROLE", "PSERVER")
    monkeypatch.delenv("PADDLE_PSERVERS_IP_PORT_LIST")
    r.generate_role()  # idempotent: does not read again
    assert r.is_worker() and r.worker_index() == 1 and r.server_endpoints() == EPS


def test_getters_resolve_lazily_and_once(monkeypatch):
    calls = []

    class Counting(RoleMakerBase):
        def _resolve(self):
            calls.append(1)
            return RoleInfo(Role.WORKER, 0, 1, ("h:1",), None)

    r = Counting()
    assert "not generated" in repr(r)
    threads = [threading.Thread(target=r.is_worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert r.is_worker() and len(calls) == 1


def test_custom_role_maker_output_is_validated():
    class Bad(RoleMakerBase):
        def _resolve(self):
            return RoleInfo(Role.SERVER, 0, 1, ("h:1",), "h:2")

    with pytest.raises(ConfigError, match="h:2"):
        Bad().generate_role()

    class OutOfRange(RoleMakerBase):
        def _resolve(self):
            return RoleInfo(Role.WORKER, 3, 2, ("h:1",), None)

    with pytest.raises(ConfigError, match="out of range"):
        OutOfRange().is_worker()


# ---------------------------------------------------------------- default_role_maker

def test_default_without_anything_says_what_to_set():
    with pytest.raises(ConfigError, match="PYFLEET_ROLE") as info:
        default_role_maker()
    assert "pyfleet.launch" in str(info.value) and "mpirun" in str(info.value)


def test_default_picks_paddle_cloud_from_training_role(monkeypatch):
    for k, v in PADDLE_WORKER.items():
        monkeypatch.setenv(k, v)
    r = default_role_maker()
    assert isinstance(r, PaddleCloudRoleMaker) and r.worker_index() == 1


class _FakeMPI(RoleMakerBase):
    def _resolve(self):
        return RoleInfo(Role.WORKER, 0, 1, ("h:1",), None)


@pytest.mark.parametrize("var", rm.MPI_ENV_VARS)
def test_default_picks_mpi_under_an_mpi_launcher(monkeypatch, var):
    monkeypatch.setattr(rm, "MPISymetricRoleMaker", _FakeMPI)
    monkeypatch.setenv(var, "4")
    monkeypatch.setenv("TRAINING_ROLE", "TRAINER")  # MPI wins over Paddle's names
    assert isinstance(default_role_maker(), _FakeMPI)


def test_default_explicit_pyfleet_role_wins_over_mpi(monkeypatch):
    monkeypatch.setattr(rm, "MPISymetricRoleMaker", _FakeMPI)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    for k, v in PYFLEET_WORKER.items():
        monkeypatch.setenv(k, v)
    assert isinstance(default_role_maker(), PaddleCloudRoleMaker)


def test_mpi_role_maker_without_mpi4py_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(ImportError, match="pip install"):
        rm.MPISymetricRoleMaker()


# ---------------------------------------------------------------- the Kubernetes sample

def test_kubernetes_sample_gives_every_pod_a_valid_role():
    yaml = pytest.importorskip("yaml")

    path = REPO / "examples" / "k8s" / "pyfleet-job.yaml"
    docs = list(yaml.safe_load_all(path.read_text()))
    service = next(d for d in docs if d["kind"] == "Service")
    jobs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Job"}
    servers, workers = jobs["pyfleet-server"], jobs["pyfleet-worker"]
    assert servers["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"]
    port = service["spec"]["ports"][0]["port"]
    n_servers, n_workers = servers["spec"]["completions"], workers["spec"]["completions"]
    expected_eps = [f"pyfleet-server-{i}.{service['metadata']['name']}:{port}"
                    for i in range(n_servers)]
    for job, kind in ((servers, "server"), (workers, "worker")):
        assert job["spec"]["completionMode"] == "Indexed"
        for index in range(job["spec"]["completions"]):
            env = {}
            for var in job["spec"]["template"]["spec"]["containers"][0]["env"]:
                if "value" in var:
                    env[var["name"]] = var["value"]
                else:
                    path_ = var["valueFrom"]["fieldRef"]["fieldPath"]
                    assert "job-completion-index" in path_
                    env[var["name"]] = str(index)
            r = PaddleCloudRoleMaker(env=env)
            assert r.server_endpoints() == expected_eps
            assert r.worker_num() == n_workers
            if kind == "server":
                assert r.server_index() == index
            else:
                assert r.worker_index() == index
