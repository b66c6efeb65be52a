"""A server process imports the table layer, never Fluid or Fleet."""

import subprocess
import sys

_PROBE = """
import sys
import pyfleet.service.server
bad = sorted(m for m in sys.modules
             if m.startswith(("pyfleet.fluid", "pyfleet.distributed")) or m == "pyfleet._fleet")
print(",".join(bad))
"""


def test_importing_the_server_imports_no_fluid_nor_fleet():
    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"imported by pyfleet.service.server: {r.stdout.strip()}"


def test_the_old_server_path_imports_no_fluid_either():
    probe = _PROBE.replace("import pyfleet.service.server", "import pyfleet.server")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"imported by pyfleet.server: {r.stdout.strip()}"
