"""A Fleet script started by itself, without the launcher, ends with one line saying how
to launch it, not a traceback; code that catches the error still gets a ConfigError."""

import os
import subprocess
import sys
import textwrap

import pytest

from pyfleet.distributed.role_maker import MPI_ENV_VARS, PaddleCloudRoleMaker
from pyfleet.errors import ConfigError
from pyfleet.launch import CONTRACT_VARS

SCRIPTS = {
    "cloud.py": """
        from pyfleet.fluid.incubate.fleet.parameter_server.distribute_transpiler import fleet
        from pyfleet.fluid.incubate.fleet.base import role_maker
        fleet.init(role_maker.PaddleCloudRoleMaker())
    """,
    "default.py": """
        from pyfleet.fluid.incubate.fleet.parameter_server.distribute_transpiler import fleet
        fleet.init()
    """,
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_fleet_script_without_the_launcher_says_how_to_launch_it(tmp_path, name):
    script = tmp_path / name
    script.write_text(textwrap.dedent(SCRIPTS[name]))
    env = {k: v for k, v in os.environ.items()
           if k not in CONTRACT_VARS and k not in MPI_ENV_VARS}
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"{name}: ")
    assert f"python -m pyfleet.launch --server_num 1 --worker_num 2 {name}" in line


def test_the_error_is_still_a_config_error():
    with pytest.raises(ConfigError, match="python -m pyfleet.launch"):
        PaddleCloudRoleMaker(env={}).generate_role()
