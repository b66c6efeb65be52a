"""Per-job CURVE keys by default ("Secure by default"): a job the launcher starts
(``pyfleet train`` runs its roles through it) gets a fresh key directory, so its servers
admit only its own roles, on loopback too; an unauthenticated local client cannot connect;
the keys are removed when the job ends. ``PYFLEET_JOB_KEYS=0`` (or keys named by the
environment) turns it off."""

import io
import os
import textwrap

import pytest
from support.service import run_launched_script

from pyfleet.errors import ConfigError
from pyfleet.launch import launch_local

pytestmark = pytest.mark.timeout(300)

WORKER = textwrap.dedent("""
    import json, os, stat, sys
    from pyfleet.errors import PeerTimeout
    from pyfleet.distributed.role_maker import PaddleCloudRoleMaker
    from pyfleet.service import auth
    from pyfleet.service.client import Client
    role = PaddleCloudRoleMaker()
    role.generate_role()
    keys = os.environ.get("PYFLEET_CURVE_DIR")
    out = {"keys": keys, "mode": stat.S_IMODE(os.stat(keys).st_mode) if keys else None}
    try:  # a local process without the job's keys
        Client(role.server_endpoints(), worker_index=0, timeout=2, connect_deadline=2,
               heartbeat_interval=0).close()
        out["plain"] = "connected"
    except PeerTimeout:
        out["plain"] = "refused"
    with Client(role.server_endpoints(), worker_index=0, timeout=20,
                **auth.client_options_from_env()) as c:
        out["servers"] = len(c.stats())
        c.stop_worker()
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
""")


def _run(tmp_path, env):
    return run_launched_script(tmp_path, WORKER, env)


@pytest.fixture
def clean_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith("PYFLEET_"):
            monkeypatch.delenv(k)


def test_a_launched_job_has_its_own_keys_and_refuses_other_clients(tmp_path, clean_env):
    out = _run(tmp_path, {})
    assert out["keys"] and out["mode"] == 0o700
    assert out["plain"] == "refused"          # no key, no connection
    assert out["servers"] == 1                # the job's own roles are served
    assert not os.path.exists(out["keys"])    # removed with the job


def test_job_keys_can_be_turned_off_and_bad_values_are_refused(tmp_path, clean_env):
    out = _run(tmp_path, {"PYFLEET_JOB_KEYS": "0"})
    assert out["keys"] is None and out["plain"] == "connected"
    with pytest.raises(ConfigError, match="PYFLEET_JOB_KEYS must be 0 or 1"):
        launch_local(["true"], servers=1, workers=1, env={"PYFLEET_JOB_KEYS": "yes"},
                     output=io.StringIO(), messages=io.StringIO())
