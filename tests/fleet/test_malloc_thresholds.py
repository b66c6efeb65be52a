"""fleet.init keeps a role's freed buffers mapped (pyfleet._malloc), on glibc.

Each case runs in a fresh interpreter: the thresholds are process-wide. The
effect is observed, not assumed: a "step" of eight 512 KiB arrays alive at
once, freed together, costs hundreds of page faults a step with glibc's
defaults (the freed heap top is trimmed, and faulted in again by the next
step), and next to none once the thresholds are set.
"""

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's mallopt settings")

PROBE = r"""
import json, resource, sys
import numpy as np
from pyfleet import fleet, _malloc
from pyfleet.distributed.role_maker import UserDefinedRoleMaker
if sys.argv[1] in ("init", "server"):
    role = "server" if sys.argv[1] == "server" else "worker"
    fleet.init(UserDefinedRoleMaker(role=role, current_id=0, worker_num=1,
                                    server_endpoints=["127.0.0.1:1"]))
a = np.ones((512, 256), dtype=np.float32)
b = np.ones(256, dtype=np.float32)
step = [a + b for _ in range(8)]   # the first step maps its memory in any case
del step
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):   # a step: activations live together, all freed at its end
    step = [a + b for _ in range(8)]
    del step
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
print(json.dumps({"applied": _malloc.keep_freed_memory() if sys.argv[1] != "plain" else None,
                  "faults_per_step": faults / 50}))
"""


def _probe(mode, extra_env=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(extra_env or {})
    p = subprocess.run([sys.executable, "-c", PROBE, mode], env=env, capture_output=True,
                       text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_fleet_init_stops_the_per_step_page_faults():
    before = _probe("plain")
    after = _probe("init")
    assert after["applied"] == [32 << 20, 128 << 20]   # a worker's: room for its reader's blocks
    assert after["faults_per_step"] < 10, after
    # the probe itself shows the cost the setting removes
    assert before["faults_per_step"] > 200, before


def test_a_server_keeps_less_free_memory_than_a_worker():
    out = _probe("server")
    assert out["applied"] == [4 << 20, 32 << 20]
    assert out["faults_per_step"] < 10, out


def test_the_users_glibc_variables_win():
    out = _probe("init", {"MALLOC_TRIM_THRESHOLD_": str(128 << 10)})
    assert out["applied"] is None
