"""Across hosts: 2 servers and 2 workers, each in its own network namespace.

The test builds five namespaces: a hub holding a bridge, and one per role with
a veth pair to the hub and an address in a private subnet (``SUBNET``) that
exists only inside them; nothing is added to the host's own namespace and no
traffic goes anywhere else. Roles run with ``ip netns exec NS python ...`` and
learn everything from the environment contract (``pyfleet.launch.role_env``),
with CURVE authentication on (``PYFLEET_CURVE_DIR``), as on real hosts.

1. ``python -m pyfleet.trainer JOB.json`` trains the DNN across the namespaces.
2. A small pull/push loop runs; one server's link is taken down
   (``ip link set eth0 down`` in its namespace) and every worker must report a
   PeerTimeout naming that server's endpoint (a bounded wait, no timing claim).

Skipped with the reason when the kernel or the user cannot make namespaces
(not root, no CAP_NET_ADMIN, no veth/bridge). The namespaces are deleted at the
end whatever happens.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.netns import bridge_namespaces
from support.wait import wait_until

from pyfleet.launch import CONTRACT_VARS, role_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

SUBNET = "10.213.77"          # /24, private, only inside the test's namespaces
SERVER_ADDRS = [f"{SUBNET}.11", f"{SUBNET}.12"]
WORKER_ADDRS = [f"{SUBNET}.21", f"{SUBNET}.22"]
PORT = 7164                   # each namespace has its own port space
REQUEST_TIMEOUT = 4.0


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30,
                          check=check)


class Netns:
    """The hub and the role namespaces; :meth:`delete` removes every one made."""

    def __init__(self):
        tag = f"pf{os.getpid() % 100000}"
        self.hub = f"{tag}hub"
        self.servers = [f"{tag}s{i}" for i in range(2)]
        self.workers = [f"{tag}w{i}" for i in range(2)]
        self.made = []
        try:
            bridge_namespaces(self.hub, self.servers + self.workers,
                              SERVER_ADDRS + WORKER_ADDRS, self.made)
        except BaseException:
            self.delete()
            raise

    def delete(self):
        for ns in reversed(self.made):
            _ip("netns", "del", ns, check=False)
        self.made = []


def _why_no_netns():
    if sys.platform != "linux":
        return "network namespaces are Linux-only"
    if shutil.which("ip") is None:
        return "the 'ip' command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN) to create network namespaces"
    return None


@pytest.fixture
def netns():
    why = _why_no_netns()
    if why:
        pytest.skip(why)
    try:
        n = Netns()
    except subprocess.CalledProcessError as e:
        pytest.skip(f"the kernel refused to build test namespaces: {' '.join(e.cmd)}: "
                    f"{e.stderr.strip()}")
    try:
        yield n
    finally:
        n.delete()
        left = _ip("netns", "list").stdout
        assert not any(ns in left for ns in [n.hub, *n.servers, *n.workers]), left


@pytest.fixture
def keys(tmp_path):
    from pyfleet.service import auth
    auth.keygen(tmp_path / "keys")
    return tmp_path / "keys"


def _base_env(extra):
    env = {k: v for k, v in os.environ.items()
           if k not in CONTRACT_VARS and not k.startswith("PYFLEET_CURVE")}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", **extra)
    return env


def _endpoints():
    return [f"{a}:{PORT}" for a in SERVER_ADDRS]


def _start(n, cmd, extra_env, log_dir):
    """Every role as ``ip netns exec NS cmd`` with its contract; servers first."""
    procs = []
    for role, names in (("server", n.servers), ("worker", n.workers)):
        for i, ns in enumerate(names):
            env = _base_env({**extra_env, **role_env(role, i, _endpoints(), len(n.workers))})
            with open(log_dir / f"{role}{i}.log", "wb") as log:
                procs.append((f"{role}{i}", subprocess.Popen(
                    ["ip", "netns", "exec", ns, *cmd], env=env, stdout=log,
                    stderr=subprocess.STDOUT)))
    return procs


def _stop(procs):
    for _, p in procs:
        if p.poll() is None:
            p.kill()
    for _, p in procs:
        p.wait(10)


def _logs(log_dir):
    return "\n".join(f"--- {f.name}\n{f.read_text()[-2000:]}"
                     for f in sorted(log_dir.glob("*.log")))


def test_training_across_namespaces(netns, keys, tmp_path):
    from pyfleet.data import synthetic
    from pyfleet.trainer import JOB_DEFAULTS
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (tmp_path / "logs").mkdir()
    data = synthetic.generate(run_dir / "data", rows=6000, seed=3)
    job = {**JOB_DEFAULTS, "train": data["train"], "test": data["test"], "model": "dnn",
           "embedding_dim": 8, "layers": [32, 16], "batch_size": 256, "mode": "async",
           "run_dir": str(run_dir), "n_dense": 13, "n_slots": 26, "save_model": False,
           "request_timeout": 30.0, "connect_timeout": 60.0, "heartbeat_timeout": 10.0}
    (run_dir / "job.json").write_text(json.dumps(job))
    procs = _start(netns, [sys.executable, "-m", "pyfleet.trainer", str(run_dir / "job.json")],
                   {"PYFLEET_CURVE_DIR": str(keys), "PYFLEET_CHECKPOINT_DIR": str(run_dir),
                    "PYFLEET_MODE": "async"}, tmp_path / "logs")
    try:
        codes = {name: p.wait(240) for name, p in procs}
    finally:
        _stop(procs)
    assert codes == {"server0": 0, "server1": 0, "worker0": 0, "worker1": 0}, \
        _logs(tmp_path / "logs")
    results = [json.loads((run_dir / f"worker{i}.json").read_text()) for i in range(2)]
    train_rows = len(Path(data["train"]).read_text().splitlines())
    assert sum(r["examples"] for r in results) == train_rows
    # both servers held rows of the sparse table (keys were routed across hosts)
    rows = [t["rows"] for s in results[0]["servers"] for t in s["tables"].values()
            if "rows" in t]
    assert len(rows) == 2 and min(rows) > 0, results[0]["servers"]
    assert (run_dir / "checkpoint").is_dir()
    logs = _logs(tmp_path / "logs")
    assert "without client authentication" not in logs  # authenticated on 10.x addresses


_LOOP = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    from pyfleet.service import auth
    from pyfleet.errors import PyfleetError
    from pyfleet.distributed.role_maker import PaddleCloudRoleMaker

    out_dir = sys.argv[1]
    role = PaddleCloudRoleMaker()
    role.generate_role()
    if role.is_server():
        from pyfleet.service.server import Server
        s = Server(role.current_endpoint(), role.server_index(), role.server_num(),
                   role.worker_num(), heartbeat_timeout=5.0, **auth.server_options_from_env())
        s.run()
        sys.exit(0)
    from pyfleet.service.client import Client
    w = role.worker_index()
    c = Client(role.server_endpoints(), worker_index=w, timeout={timeout},
               connect_deadline=60, heartbeat_interval=0, **auth.client_options_from_env())
    c.create_tables([{{"kind": "sparse", "name": "emb", "dim": 4,
                      "optimizer": {{"type": "SGD", "learning_rate": 0.1}},
                      "initializer": {{"type": "Constant", "value": 0.0}}, "seed": 0}}])
    rng = np.random.default_rng(w)
    step, last_ok = 0, time.monotonic()
    try:
        while True:
            k = rng.integers(0, 1 << 40, 64).astype(np.uint64)
            c.pull_sparse("emb", k)
            c.push_sparse("emb", k, np.ones((64, 4), np.float32))
            step += 1
            last_ok = time.monotonic()
            if step == 20:
                open(f"{{out_dir}}/ready{{w}}", "w").close()
            time.sleep(0.02)  # paces the steps: the load, not a wait
    except PyfleetError as e:
        rep = {{"type": type(e).__name__, "message": str(e), "steps": step,
               "seconds_after_last_success": time.monotonic() - last_ok}}
        # Written whole, then renamed: the test polls for the name.
        with open(f"{{out_dir}}/report{{w}}.tmp", "w") as f:
            json.dump(rep, f)
        os.replace(f"{{out_dir}}/report{{w}}.tmp", f"{{out_dir}}/report{{w}}.json")
    os._exit(0)  # a server is unreachable: skip closing sockets to it
""").format(timeout=REQUEST_TIMEOUT)


def test_link_down_is_a_peer_timeout_naming_the_server(netns, keys, tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(_LOOP)
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "logs").mkdir()
    procs = _start(netns, [sys.executable, str(script), str(out)],
                   {"PYFLEET_CURVE_DIR": str(keys)}, tmp_path / "logs")
    try:
        def ready():
            assert all(p.poll() is None for _, p in procs), _logs(tmp_path / "logs")
            return all((out / f"ready{i}").exists() for i in range(2))

        wait_until(ready, 90, "both workers' 20th step", interval=0.2,
                   detail=lambda: _logs(tmp_path / "logs"))
        _ip("-n", netns.servers[1], "link", "set", "eth0", "down")
        # every request has a deadline: a report must come within a few timeouts
        wait_until(lambda: all((out / f"report{i}.json").exists() for i in range(2)),
                   6 * REQUEST_TIMEOUT, "both workers' reports (a worker hung after the link "
                   "went down)", interval=0.2, detail=lambda: _logs(tmp_path / "logs"))
        reports = [json.loads((out / f"report{i}.json").read_text()) for i in range(2)]
    finally:
        _stop(procs)
    dead = _endpoints()[1]
    for r in reports:
        assert r["type"] == "PeerTimeout", r
        assert f"server 1 ({dead})" in r["message"], r
        assert r["steps"] >= 20
