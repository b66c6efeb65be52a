"""The core's concurrency stress program under ThreadSanitizer and AddressSanitizer.

Builds tests/cpp/stress_main.cc against the core with -fsanitize=... (CMake
option PYFLEET_SANITIZE) and runs it: threads pull and push overlapping keys
while another shrinks and saves. Any data race, overflow or leak fails it.
"""

import os
import shutil
import subprocess

import pybind11
import pytest
from support import REPO

ROOT = REPO

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("c++") is None,
                                reason="needs cmake and a C++ compiler")


@pytest.mark.parametrize("sanitizer", ["thread", "address"])
def test_stress_is_clean_under_sanitizer(tmp_path, sanitizer):
    build = tmp_path / "build"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), *gen,
                    f"-DPYFLEET_SANITIZE={sanitizer}", "-DPYFLEET_BUILD_STRESS=ON",
                    "-DCMAKE_BUILD_TYPE=Debug", f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"],
                   check=True, capture_output=True, timeout=300)
    subprocess.run(["cmake", "--build", str(build), "--target", "pyfleet_stress"],
                   check=True, capture_output=True, timeout=600)
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1", ASAN_OPTIONS="detect_leaks=1")
    run = subprocess.run([str(build / "pyfleet_stress"), "100", str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "WARNING: ThreadSanitizer" not in run.stderr
    assert "ERROR: AddressSanitizer" not in run.stderr
    assert "stress: ok" in run.stdout
